//! What `xpreempt run` tells the shim, from the environment (read once).

use std::sync::OnceLock;
use xpreempt_core::Level;

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `XPREEMPT_INTERCEPT=1`: driver-API interception on. Off, every wrapper calls libcuda.
    pub intercept: bool,
    /// `XPREEMPT_PRIORITY`: the logical priority of every queue of the process.
    pub priority: i32,
    /// `XPREEMPT_LEVEL` (1–3).
    pub level: Level,
    /// `XPREEMPT_PASS_THROUGH=1`: launches go straight to the driver.
    pub pass_through: bool,
    /// `XPREEMPT_WINDOW`: most commands in flight per stream.
    pub window: Option<u32>,
    /// `XPREEMPT_GPU_WINDOW_US`: most GPU time in flight per stream (0: no bound by time).
    pub gpu_window_us: Option<u64>,
    /// `XPREEMPT_CHAOS=SEED[:PERIOD_US]`: random suspensions, for conformance tests.
    pub chaos: Option<(u64, u64)>,
}

/// The window of a queue that is not the process's own choice: the highest queues run
/// unthrottled, lower ones keep a short window so that a suspension waits for little.
const LOW_WINDOW: u32 = 16;
const HIGH_WINDOW: u32 = 1024;
/// The GPU time a lower queue keeps in flight: with one command more, what a suspension that
/// cannot stop the hardware (Lv1, kernels without the guard) waits for at most. Commands of up
/// to 2 ms still go two at a time, so the device does not idle between them.
const LOW_GPU_WINDOW_US: u64 = 2_000;
/// How long the completion watcher naps between looks at a sync event it waits for.
pub const POLL_US: u64 = 20;

/// [`POLL_US`]: also how long a call that waits for stopped kernels naps between looks.
pub fn poll_nap() -> std::time::Duration {
    std::time::Duration::from_micros(POLL_US)
}

impl Settings {
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Self {
        let flag = |k: &str| get(k).is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        let level = match get("XPREEMPT_LEVEL").as_deref().map(str::trim) {
            Some("2") => Level::Lv2,
            Some("3") => Level::Lv3,
            _ => Level::Lv1,
        };
        let chaos = get("XPREEMPT_CHAOS").and_then(|v| {
            let mut it = v.split(':');
            let seed = it.next()?.trim().parse().ok()?;
            let period = it.next().and_then(|p| p.trim().parse().ok()).unwrap_or(500);
            Some((seed, period))
        });
        Self {
            intercept: flag("XPREEMPT_INTERCEPT"),
            priority: get("XPREEMPT_PRIORITY")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0),
            level,
            pass_through: flag("XPREEMPT_PASS_THROUGH"),
            window: get("XPREEMPT_WINDOW")
                .and_then(|v| v.trim().parse().ok())
                .filter(|&w| w > 0),
            gpu_window_us: get("XPREEMPT_GPU_WINDOW_US").and_then(|v| v.trim().parse().ok()),
            chaos,
        }
    }

    /// (threshold, batch) of each queue.
    pub fn window(&self) -> (u32, u32) {
        let threshold = self.window.unwrap_or(if self.priority > 0 {
            HIGH_WINDOW
        } else {
            LOW_WINDOW
        });
        // A sync point every quarter window keeps the window fed without an event per launch.
        let batch = (threshold / 4).clamp(1, 64);
        (threshold, batch.min(threshold))
    }

    /// The GPU-time bound of each queue's window (ns), if any: by default the lower queues'.
    pub fn gpu_window_ns(&self) -> Option<u64> {
        let us = self.gpu_window_us.unwrap_or(if self.priority > 0 {
            0
        } else {
            LOW_GPU_WINDOW_US
        });
        (us > 0).then(|| us.saturating_mul(1_000))
    }
}

pub fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings::parse(|k| std::env::var(k).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_environment_is_read_with_defaults() {
        let s = Settings::parse(env(&[]));
        assert!(!s.intercept);
        assert_eq!((s.priority, s.level, s.window()), (0, Level::Lv1, (16, 4)));
        let s = Settings::parse(env(&[
            ("XPREEMPT_INTERCEPT", "1"),
            ("XPREEMPT_PRIORITY", "10"),
            ("XPREEMPT_LEVEL", "3"),
            ("XPREEMPT_CHAOS", "7:200"),
        ]));
        assert!(s.intercept);
        assert_eq!(
            (s.priority, s.level, s.window()),
            (10, Level::Lv3, (1024, 64))
        );
        assert_eq!(s.chaos, Some((7, 200)));
        let s = Settings::parse(env(&[("XPREEMPT_WINDOW", "2"), ("XPREEMPT_CHAOS", "x")]));
        assert_eq!((s.window(), s.chaos), ((2, 1), None));
        let s = Settings::parse(env(&[("XPREEMPT_WINDOW", "8")]));
        assert_eq!(s.window(), (8, 2));
    }

    #[test]
    fn lower_queues_bound_their_gpu_time_in_flight_unless_told_otherwise() {
        let s = Settings::parse(env(&[]));
        assert_eq!(s.gpu_window_ns(), Some(2_000_000));
        let high = Settings::parse(env(&[("XPREEMPT_PRIORITY", "10")]));
        assert_eq!(high.gpu_window_ns(), None);
        let set = Settings::parse(env(&[
            ("XPREEMPT_PRIORITY", "10"),
            ("XPREEMPT_GPU_WINDOW_US", "500"),
        ]));
        assert_eq!(set.gpu_window_ns(), Some(500_000));
        let off = Settings::parse(env(&[("XPREEMPT_GPU_WINDOW_US", "0")]));
        assert_eq!(off.gpu_window_ns(), None);
    }
}
