//! How long one queue's launches took (the queue's part and the driver's), per thread kind: the
//! application's own submissions, and launches from the buffer by the completion watcher or a
//! resume. Kept only when the queue was asked to (`CudaQueueConfig::time_launches`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Default)]
pub struct LaunchTimes {
    count: [AtomicU64; 2],
    total_ns: [AtomicU64; 2],
    max_ns: [AtomicU64; 2],
}

impl LaunchTimes {
    pub fn done(&self, started: Instant, by_application: bool) {
        let ns = started.elapsed().as_nanos() as u64;
        let i = usize::from(!by_application);
        self.count[i].fetch_add(1, Ordering::Relaxed);
        self.total_ns[i].fetch_add(ns, Ordering::Relaxed);
        self.max_ns[i].fetch_max(ns, Ordering::Relaxed);
    }

    /// "N by the application (mean µs, max µs), M from the buffer (…)".
    pub fn summary(&self) -> String {
        let part = |i: usize, who: &str| {
            let n = self.count[i].load(Ordering::Relaxed);
            let mean = self.total_ns[i].load(Ordering::Relaxed) as f64 / n.max(1) as f64 / 1e3;
            let max = self.max_ns[i].load(Ordering::Relaxed) as f64 / 1e3;
            format!("{n} {who} (mean {mean:.1} µs, max {max:.0} µs)")
        };
        format!(
            "launches: {}, {}",
            part(0, "by the application"),
            part(1, "from the buffer")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn launch_times_are_kept_apart_per_thread_kind() {
        let t = LaunchTimes::default();
        let long_ago = Instant::now() - Duration::from_micros(30);
        t.done(long_ago, true);
        t.done(Instant::now(), true);
        t.done(long_ago, false);
        let s = t.summary();
        assert!(
            s.starts_with("launches: 2 by the application (mean "),
            "{s}"
        );
        assert!(s.contains(", 1 from the buffer (mean "), "{s}");
        assert!(t.max_ns[1].load(Ordering::Relaxed) >= 30_000, "{s}");
    }
}
