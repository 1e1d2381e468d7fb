//! A queue's GPU-time measurements ([`GpuTimeSummary`]) as words of its slot: the agent
//! publishes them with the other statistics on its heartbeat, the daemon reads them for
//! `list`, `top`, the metrics and the trace. Nothing travels per launch.
//!
//! Each word means something on its own, so a reader that races the writer may mix two
//! publications (a command time of one, a burst of the next) but never reads a value that was
//! not measured.

use std::sync::atomic::{AtomicU64, Ordering};
use xpreempt_core::stats::GpuTimeSummary;
use xpreempt_types::Nanos;

/// A duration word that holds this has no measurement yet (a real one is never this long).
const NONE: u64 = u64::MAX;

#[repr(C)]
pub struct GpuWords {
    per_command_ns: AtomicU64,
    /// The busy fraction's `f64` bits.
    busy_fraction: AtomicU64,
    burst_ns: AtomicU64,
    gap_ns: AtomicU64,
    measured_commands: AtomicU64,
}

fn store_ns(word: &AtomicU64, v: Option<Nanos>) {
    word.store(v.map_or(NONE, |n| n.min(NONE - 1)), Ordering::Relaxed);
}

fn load_ns(word: &AtomicU64) -> Option<Nanos> {
    Some(word.load(Ordering::Relaxed)).filter(|&n| n != NONE)
}

impl GpuWords {
    /// Publishes `g`. The segment starts zeroed and a zero duration is a measurement, so a
    /// slot's words mean "none" only once a queue registered in it ([`GpuWords::clear`]).
    pub fn store(&self, g: &GpuTimeSummary) {
        store_ns(&self.per_command_ns, g.per_command_ns);
        store_ns(&self.burst_ns, g.burst_ns);
        store_ns(&self.gap_ns, g.gap_ns);
        self.busy_fraction
            .store(g.busy_fraction.to_bits(), Ordering::Relaxed);
        self.measured_commands
            .store(g.measured_commands, Ordering::Relaxed);
    }

    /// Nothing measured: a slot reused after an earlier queue, before its agent publishes.
    pub fn clear(&self) {
        self.store(&GpuTimeSummary::default());
    }

    /// What was published, with what the agent could not have meant (a fraction outside
    /// [0, 1], not a number) made harmless: the daemon trusts nothing in a segment.
    pub fn load(&self) -> GpuTimeSummary {
        let u = f64::from_bits(self.busy_fraction.load(Ordering::Relaxed));
        GpuTimeSummary {
            per_command_ns: load_ns(&self.per_command_ns),
            busy_fraction: if u.is_finite() {
                u.clamp(0.0, 1.0)
            } else {
                0.0
            },
            burst_ns: load_ns(&self.burst_ns),
            gap_ns: load_ns(&self.gap_ns),
            measured_commands: self.measured_commands.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words() -> GpuWords {
        GpuWords {
            per_command_ns: AtomicU64::new(0),
            busy_fraction: AtomicU64::new(0),
            burst_ns: AtomicU64::new(0),
            gap_ns: AtomicU64::new(0),
            measured_commands: AtomicU64::new(0),
        }
    }

    #[test]
    fn a_summary_round_trips_and_absent_stays_absent() {
        let w = words();
        w.clear();
        assert_eq!(w.load(), GpuTimeSummary::default());
        let g = GpuTimeSummary {
            per_command_ns: Some(0),
            busy_fraction: 0.375,
            burst_ns: Some(12_000_000),
            gap_ns: None,
            measured_commands: 9,
        };
        w.store(&g);
        assert_eq!(w.load(), g, "a zero-length command is a measurement");
    }

    #[test]
    fn a_fraction_the_agent_cannot_have_meant_is_read_as_harmless() {
        let w = words();
        for (bits, want) in [
            (f64::NAN.to_bits(), 0.0),
            (f64::INFINITY.to_bits(), 0.0),
            (7.5f64.to_bits(), 1.0),
            ((-0.5f64).to_bits(), 0.0),
        ] {
            w.busy_fraction.store(bits, Ordering::Relaxed);
            assert_eq!(w.load().busy_fraction, want);
        }
    }
}
