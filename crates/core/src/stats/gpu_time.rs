//! What a queue's own completions tell of its use of the GPU, measured online: the GPU time of
//! one of its commands, the fraction of time it has work on the device (u), the CPU gaps
//! between its bursts and how long a burst lasts. The sync points the window already records
//! are the only probes: nothing is added to the launch path but a clock reading.
//!
//! A command's GPU time is the time between two completions the queue observed while it had
//! work in flight without a break, divided by the commands completed between them (the first
//! interval of a burst starts at its first launch). That is the time the device gave the
//! queue per command under whatever else ran beside it: what a drain of its window costs.

use serde::{Deserialize, Serialize};
use xpreempt_types::Nanos;

/// Weight of a new sample in the running averages (1/8: a few bursts settle it).
const NEW_SAMPLE_WEIGHT: f64 = 0.125;
/// Time constant of the busy fraction: recent seconds count, older ones fade.
const BUSY_FRACTION_HORIZON_NS: f64 = 1e9;

/// A running average that has seen at least one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Average(Option<f64>);

impl Average {
    fn add(&mut self, sample: f64) {
        self.0 = Some(match self.0 {
            None => sample,
            Some(avg) => avg + NEW_SAMPLE_WEIGHT * (sample - avg),
        });
    }

    fn ns(self) -> Option<Nanos> {
        self.0.map(|v| v.round() as Nanos)
    }
}

/// Kept by each XQueue, fed by its launches, completions, suspensions and Ready/Idle changes.
#[derive(Clone, Debug, Default)]
pub struct GpuTime {
    per_command: Average,
    burst: Average,
    gap: Average,
    /// Start of the completion interval being measured (work in flight since then).
    interval_start: Option<Nanos>,
    /// Since when the queue has had something pending or in flight.
    active_since: Option<Nanos>,
    /// Since when the queue has been idle (after its first burst).
    idle_since: Option<Nanos>,
    /// Busy fraction as of `fraction_at`, and whether the queue had work in flight since then.
    fraction: f64,
    fraction_at: Nanos,
    in_flight: bool,
    /// Commands whose GPU time was measured.
    measured: u64,
}

/// A printable, serializable snapshot of [`GpuTime`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuTimeSummary {
    /// GPU time of one command, averaged (ns); absent until a command was measured.
    pub per_command_ns: Option<Nanos>,
    /// Fraction of recent time (about the last second) with work on the device.
    pub busy_fraction: f64,
    /// How long a burst (Ready until Idle) lasts, averaged (ns).
    pub burst_ns: Option<Nanos>,
    /// The CPU gap between two bursts (Idle until the next submission), averaged (ns).
    pub gap_ns: Option<Nanos>,
    pub measured_commands: u64,
}

impl GpuTime {
    /// The averaged GPU time of one command, once one was measured.
    pub fn per_command_ns(&self) -> Option<Nanos> {
        self.per_command.ns()
    }

    /// The queue went from idle to active (a submission).
    pub(crate) fn activated(&mut self, now: Nanos) {
        if let Some(idle) = self.idle_since.take() {
            self.gap.add(now.saturating_sub(idle) as f64);
        }
        self.active_since = Some(now);
    }

    /// Everything the queue had has completed.
    pub(crate) fn went_idle(&mut self, now: Nanos) {
        if let Some(active) = self.active_since.take() {
            self.burst.add(now.saturating_sub(active) as f64);
        }
        self.idle_since = Some(now);
    }

    /// A launch onto a device that held none of the queue's work starts an interval.
    pub(crate) fn launched(&mut self, now: Nanos, in_flight_before: usize) {
        if in_flight_before == 0 {
            self.set_in_flight(now, true);
            self.interval_start = Some(now);
        }
    }

    /// `count` commands were seen complete at `now`; `in_flight_after` remain.
    pub(crate) fn completed(&mut self, now: Nanos, count: u64, in_flight_after: usize) {
        if count == 0 {
            return;
        }
        if let Some(start) = self.interval_start {
            self.per_command
                .add(now.saturating_sub(start) as f64 / count as f64);
            self.measured += count;
        }
        if in_flight_after == 0 {
            self.set_in_flight(now, false);
            self.interval_start = None;
        } else {
            self.interval_start = Some(now);
        }
    }

    /// The hardware stopped the queue's work, or let it run again. Time across a stop is not
    /// the work's GPU time, and neither is the time from the restart to the next completion: the
    /// command that completes then ran partly before the stop (a queue stopped every few
    /// hundred microseconds would otherwise measure its 4 ms kernels as a fraction of that).
    /// So the next completion only opens a clean interval.
    pub(crate) fn stopped(&mut self, now: Nanos) {
        self.set_in_flight(now, false);
        self.interval_start = None;
    }

    pub(crate) fn restarted(&mut self, now: Nanos, in_flight: usize) {
        if in_flight > 0 {
            self.set_in_flight(now, true);
        }
    }

    fn set_in_flight(&mut self, now: Nanos, in_flight: bool) {
        self.fraction = self.fraction_until(now);
        self.fraction_at = now;
        self.in_flight = in_flight;
    }

    /// Exponentially weighted fraction of time with work in flight, up to `now`.
    fn fraction_until(&self, now: Nanos) -> f64 {
        let elapsed = now.saturating_sub(self.fraction_at) as f64;
        let keep = (-elapsed / BUSY_FRACTION_HORIZON_NS).exp();
        let busy = if self.in_flight { 1.0 } else { 0.0 };
        self.fraction * keep + busy * (1.0 - keep)
    }

    /// As of `now`.
    pub fn summary(&self, now: Nanos) -> GpuTimeSummary {
        GpuTimeSummary {
            per_command_ns: self.per_command.ns(),
            busy_fraction: self.fraction_until(now.max(self.fraction_at)),
            burst_ns: self.burst.ns(),
            gap_ns: self.gap.ns(),
            measured_commands: self.measured,
        }
    }

    /// As of the last event the queue saw.
    pub fn last_summary(&self) -> GpuTimeSummary {
        self.summary(self.fraction_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_to_back_completions_measure_each_command() {
        let mut g = GpuTime::default();
        g.launched(0, 0);
        g.launched(5, 1);
        // Two commands of 100 each, the second queued behind the first.
        g.completed(100, 1, 1);
        g.completed(200, 1, 0);
        assert_eq!(g.per_command_ns(), Some(100));
        // A sync point every 4 commands: the interval is shared out.
        g.launched(1_000, 0);
        g.completed(1_400, 4, 0);
        assert_eq!(g.per_command_ns(), Some(100));
        assert_eq!(g.last_summary().measured_commands, 6);
    }

    #[test]
    fn time_stopped_is_not_gpu_time() {
        let mut g = GpuTime::default();
        g.launched(0, 0);
        g.completed(50, 1, 2);
        g.stopped(60);
        g.restarted(10_000, 2);
        g.completed(10_050, 1, 1);
        assert_eq!(
            g.per_command_ns(),
            Some(50),
            "neither the stop nor the restart counts"
        );
        g.completed(10_100, 1, 0);
        assert_eq!(g.per_command_ns(), Some(50));
        assert_eq!(g.last_summary().measured_commands, 2);
    }

    #[test]
    fn frequent_stops_do_not_shrink_long_commands() {
        let mut g = GpuTime::default();
        g.launched(0, 0);
        for k in 1..=4 {
            g.launched(k, k as usize);
        }
        g.completed(4_000, 1, 4);
        // Stopped every 300 for 100: each completion comes soon after a restart.
        let mut t = 4_000;
        for _ in 0..4 {
            g.stopped(t + 300);
            g.restarted(t + 400, 4);
            t += 450;
            g.completed(t, 1, 4);
        }
        assert_eq!(g.per_command_ns(), Some(4_000));
    }

    #[test]
    fn bursts_and_gaps_alternate() {
        let mut g = GpuTime::default();
        g.activated(0);
        g.went_idle(300);
        g.activated(1_300);
        g.went_idle(1_600);
        let s = g.last_summary();
        assert_eq!((s.burst_ns, s.gap_ns), (Some(300), Some(1_000)));
        // A first burst has no gap before it.
        let mut first = GpuTime::default();
        first.activated(7);
        assert_eq!(first.last_summary().gap_ns, None);
    }

    #[test]
    fn the_busy_fraction_follows_the_share_of_time_in_flight() {
        let mut g = GpuTime::default();
        // 10 s of a 30 % duty cycle in 1 ms periods.
        let period = 1_000_000;
        for i in 0..10_000u64 {
            g.launched(i * period, 0);
            g.completed(i * period + 300_000, 1, 0);
        }
        let u = g.summary(10_000 * period).busy_fraction;
        assert!((u - 0.3).abs() < 0.01, "busy fraction {u}");
        // Then idle for 5 s: it fades.
        assert!(g.summary(15_000 * period).busy_fraction < 0.01);
        // Always busy: near one.
        let mut busy = GpuTime::default();
        busy.launched(0, 0);
        assert!(busy.summary(5_000_000_000).busy_fraction > 0.99);
    }
}
