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
    /// `XPREEMPT_CHAOS=SEED[:PERIOD_US]`: random suspensions, for conformance tests.
    pub chaos: Option<(u64, u64)>,
    /// `XPREEMPT_IDLE_LINGER_US`: how long a stream that ran dry still counts as busy.
    pub idle_linger_us: u64,
    /// `XPREEMPT_BURST_GAP_US`: how long after a launch returned a stream that ran dry still
    /// counts as busy (default: `QueueConfig`'s; 0: off).
    pub burst_gap_us: Option<u64>,
    /// `XPREEMPT_SYNC_EVERY`: a sync point every this many launches (default: a quarter of the
    /// window, at most 64). A tuning knob for measurements.
    pub sync_every: Option<u32>,
    /// `XPREEMPT_POLL_US`: how long the completion watcher naps between looks at a sync point
    /// (default 20). A tuning knob for measurements.
    pub poll_us: u64,
    /// `XPREEMPT_FEED_ON_SUBMIT` (default on; `0` turns it off): before a submission to a
    /// backlogged stream, the application's thread refills its window (`SharedXQueue::refill`)
    /// instead of leaving that to the completion watcher alone. A knob for measurements.
    pub feed_on_submit: bool,
    /// `XPREEMPT_GRAPH_PROXY=1`: a process above priority 0 runs the graphs it launches on the
    /// legacy stream on a stream of its priority (`priority.rs`). Off: it measured no gain.
    pub graph_proxy: bool,
}

/// The window of a queue that is not the process's own choice: the highest queues run
/// unthrottled, lower ones keep a short window so that a suspension waits for little.
const LOW_WINDOW: u32 = 16;
const HIGH_WINDOW: u32 = 1024;
/// The idle linger when `xpreempt run` does not set one.
pub const DEFAULT_IDLE_LINGER_US: u64 = 0;
const DEFAULT_POLL_US: u64 = 20;

impl Settings {
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Self {
        let flag = |k: &str| get(k).is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        let off = |k: &str| {
            get(k).is_some_and(|v| v.trim() == "0" || v.trim().eq_ignore_ascii_case("false"))
        };
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
            chaos,
            idle_linger_us: get("XPREEMPT_IDLE_LINGER_US")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(DEFAULT_IDLE_LINGER_US),
            burst_gap_us: get("XPREEMPT_BURST_GAP_US").and_then(|v| v.trim().parse().ok()),
            sync_every: get("XPREEMPT_SYNC_EVERY")
                .and_then(|v| v.trim().parse().ok())
                .filter(|&n| n > 0),
            poll_us: get("XPREEMPT_POLL_US")
                .and_then(|v| v.trim().parse().ok())
                .filter(|&us| us > 0)
                .unwrap_or(DEFAULT_POLL_US),
            feed_on_submit: !off("XPREEMPT_FEED_ON_SUBMIT"),
            graph_proxy: flag("XPREEMPT_GRAPH_PROXY"),
        }
    }

    /// (threshold, batch) of each queue.
    pub fn window(&self) -> (u32, u32) {
        let threshold = self.window.unwrap_or(if self.priority > 0 {
            HIGH_WINDOW
        } else {
            LOW_WINDOW
        });
        let batch = self.sync_every.unwrap_or(threshold / 4).clamp(1, 64);
        (threshold, batch.min(threshold))
    }
}

pub fn settings() -> &'static Settings {
    static S: OnceLock<Settings> = OnceLock::new();
    S.get_or_init(|| Settings::parse(|k| std::env::var(k).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_read_with_defaults() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
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
        assert_eq!(s.idle_linger_us, DEFAULT_IDLE_LINGER_US);
        let s = Settings::parse(env(&[("XPREEMPT_IDLE_LINGER_US", "300")]));
        assert_eq!(s.idle_linger_us, 300);
        assert_eq!(s.burst_gap_us, None);
        let s = Settings::parse(env(&[("XPREEMPT_BURST_GAP_US", "0")]));
        assert_eq!(s.burst_gap_us, Some(0));
        let s = Settings::parse(env(&[("XPREEMPT_WINDOW", "2"), ("XPREEMPT_CHAOS", "x")]));
        assert_eq!((s.window(), s.chaos), ((2, 1), None));
        assert_eq!(
            (s.poll_us, s.feed_on_submit, s.graph_proxy),
            (DEFAULT_POLL_US, true, false)
        );
        let s = Settings::parse(env(&[
            ("XPREEMPT_FEED_ON_SUBMIT", "0"),
            ("XPREEMPT_GRAPH_PROXY", "1"),
        ]));
        assert!(!s.feed_on_submit && s.graph_proxy);
        let s = Settings::parse(env(&[
            ("XPREEMPT_SYNC_EVERY", "1"),
            ("XPREEMPT_POLL_US", "5"),
        ]));
        assert_eq!((s.window(), s.poll_us), ((16, 1), 5));
        let s = Settings::parse(env(&[
            ("XPREEMPT_WINDOW", "8"),
            ("XPREEMPT_SYNC_EVERY", "32"),
        ]));
        assert_eq!(s.window(), (8, 8));
    }
}
