//! `xpreempt daemon --trace FILE`: a timeline of a real run in the Chrome/Perfetto JSON trace
//! format (open it at ui.perfetto.dev or chrome://tracing). One track per queue (a process per
//! device): a span for each state the queue was in (ready, running, suspended), and at every
//! suspension an instant event that names the queue it was stopped for, so that a user can see
//! why their job waited. Beside each device's tracks, two counters per queue show what the queue
//! measured of its GPU time as its agent last published it: its busy fraction u (%) and the GPU
//! time of one command (µs), sampled on the daemon's tick and written when they change.
//!
//! Events are written as decisions happen and flushed at least every 100 ms; the closing `]`
//! comes at the end, which the format lets a reader do without if the daemon was killed.

use serde_json::json;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};
use xpreempt_core::policy::QueueView;
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_core::stats::GpuTimeSummary;
use xpreempt_core::{Nanos, QueueId};

const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// What a track shows now.
struct Span {
    state: QueueState,
    since: Nanos,
}

pub struct Trace {
    out: BufWriter<File>,
    /// Per (device, queue): the open span.
    spans: BTreeMap<(u32, QueueId), Span>,
    /// Per (device, queue): the counters last written (busy %, µs per command).
    counters: BTreeMap<(u32, QueueId), (f64, Option<f64>)>,
    /// Per (device, queue): its drained suspensions as last written.
    drains: BTreeMap<(u32, QueueId), u64>,
    flushed: Instant,
}

/// A busy fraction that moved less than this (in %) is not written again.
const BUSY_STEP_PERCENT: f64 = 0.5;

fn us(ns: Nanos) -> f64 {
    ns as f64 / 1_000.0
}

impl Trace {
    /// Creates (truncates) `path` and writes the array's opening.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(b"[\n")?;
        out.flush()?;
        Ok(Self {
            out,
            spans: BTreeMap::new(),
            counters: BTreeMap::new(),
            drains: BTreeMap::new(),
            flushed: Instant::now(),
        })
    }

    fn event(&mut self, e: serde_json::Value) {
        // A trace that cannot be written must not stop the daemon: the error is logged once
        // by whoever notices the file missing; events are best effort.
        let _ = serde_json::to_writer(&mut self.out, &e);
        let _ = self.out.write_all(b",\n");
        if self.flushed.elapsed() >= FLUSH_EVERY {
            let _ = self.out.flush();
            self.flushed = Instant::now();
        }
    }

    /// Names a queue's track: its owner's process name and pid.
    pub fn name(&mut self, device: u32, queue: QueueId, name: &str) {
        self.event(json!({
            "ph": "M", "name": "thread_name", "pid": device, "tid": queue.0,
            "args": { "name": format!("{queue} {name}") },
        }));
        self.event(json!({
            "ph": "M", "name": "process_name", "pid": device, "tid": queue.0,
            "args": { "name": format!("device {device}") },
        }));
    }

    /// After a decision on `device`: every queue whose state changed closes its span and
    /// opens the next; a suspension names the highest queue with work that holds it back.
    pub fn observe(&mut self, device: u32, now: Nanos, views: &[QueueView]) {
        for v in views {
            let key = (device, v.id);
            if self.spans.get(&key).is_some_and(|s| s.state == v.state) {
                continue;
            }
            self.close(key, now);
            if v.state == QueueState::Suspended {
                let by = views
                    .iter()
                    .filter(|h| v.held_back_by(h))
                    .max_by_key(|h| h.effective_priority);
                self.event(json!({
                    "ph": "i", "s": "t", "name": "suspend", "pid": device, "tid": v.id.0,
                    "ts": us(now),
                    "args": {
                        "for": by.map(|h| h.id.to_string()),
                        "for_priority": by.map(|h| h.effective_priority),
                        "priority": v.effective_priority,
                    },
                }));
            }
            if v.state != QueueState::Idle {
                self.spans.insert(
                    key,
                    Span {
                        state: v.state,
                        since: now,
                    },
                );
            }
        }
    }

    /// What `queue` measured of its GPU time, as of `now`: its counters, where they moved.
    pub fn gpu(&mut self, device: u32, queue: QueueId, now: Nanos, gpu: &GpuTimeSummary) {
        let busy = (gpu.busy_fraction * 100.0).clamp(0.0, 100.0);
        let per = gpu.per_command_ns.map(us);
        let key = (device, queue);
        let last = self.counters.get(&key).copied();
        let busy_moved = last.is_none_or(|(b, _)| (b - busy).abs() >= BUSY_STEP_PERCENT);
        let per_moved = per.is_some() && last.is_none_or(|(_, p)| p != per);
        if busy_moved {
            self.event(json!({
                "ph": "C", "name": format!("{queue} busy %"), "pid": device, "ts": us(now),
                "args": { "u": busy },
            }));
        }
        if per_moved {
            self.event(json!({
                "ph": "C", "name": format!("{queue} GPU time per command (µs)"), "pid": device,
                "ts": us(now), "args": { "us": per },
            }));
        }
        // The next sample is compared with what the timeline shows.
        let shown = if busy_moved {
            busy
        } else {
            last.map_or(busy, |l| l.0)
        };
        self.counters.insert(key, (shown, per));
    }

    /// How many of `queue`'s suspensions drained although its level could stop the hardware
    /// (its commands too short for the stop to pay, or the stop failed), where that moved: the
    /// timeline then says which suspensions did not stop the queue's work on the device.
    pub fn drains(&mut self, device: u32, queue: QueueId, now: Nanos, total: u64) {
        let last = self.drains.insert((device, queue), total);
        if last != Some(total) && (total > 0 || last.is_some()) {
            self.event(json!({
                "ph": "C", "name": format!("{queue} drained suspensions"), "pid": device,
                "ts": us(now), "args": { "drained": total },
            }));
        }
    }

    /// The queue is gone: its span ends.
    pub fn forget(&mut self, device: u32, queue: QueueId, now: Nanos) {
        self.close((device, queue), now);
        self.counters.remove(&(device, queue));
        self.drains.remove(&(device, queue));
    }

    fn close(&mut self, key: (u32, QueueId), now: Nanos) {
        if let Some(s) = self.spans.remove(&key) {
            self.event(json!({
                "ph": "X", "name": s.state.name(), "pid": key.0, "tid": key.1.0,
                "ts": us(s.since), "dur": us(now.saturating_sub(s.since)),
            }));
        }
    }

    /// Ends every open span and the array.
    pub fn finish(&mut self, now: Nanos) {
        let keys: Vec<_> = self.spans.keys().copied().collect();
        for k in keys {
            self.close(k, now);
        }
        let _ = self.out.write_all(b"{}]\n");
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_core::Hints;

    fn view(id: u32, prio: i32, state: QueueState) -> QueueView {
        QueueView {
            id: QueueId(id),
            process: 1,
            logical_priority: prio,
            effective_priority: prio,
            state,
            pending: 0,
            hints: Hints::default(),
            active_since: None,
            running_since: None,
            run_ns: 0,
            compute_units: None,
        }
    }

    /// The events of a timeline that `write` fills and that ends at `end`, parsed back.
    fn traced(tag: &str, end: Nanos, write: impl FnOnce(&mut Trace)) -> Vec<serde_json::Value> {
        let dir = std::env::temp_dir().join(format!("xp-trace-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.json");
        let mut t = Trace::create(&path).unwrap();
        write(&mut t);
        t.finish(end);
        let events = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        events
    }

    #[test]
    fn a_timeline_parses_and_names_what_stopped_a_queue() {
        let events = traced("states", 12_000, |t| {
            t.name(0, QueueId(1), "train");
            t.name(0, QueueId(2), "infer");
            t.observe(
                0,
                1_000,
                &[
                    view(1, 0, QueueState::Running),
                    view(2, 9, QueueState::Idle),
                ],
            );
            t.observe(
                0,
                5_000,
                &[
                    view(1, 0, QueueState::Suspended),
                    view(2, 9, QueueState::Running),
                ],
            );
            t.observe(
                0,
                9_000,
                &[
                    view(1, 0, QueueState::Running),
                    view(2, 9, QueueState::Idle),
                ],
            );
        });
        let named = |n: &str| events.iter().filter(|e| e["name"] == n).count();
        assert_eq!(named("running"), 3, "{events:?}");
        assert_eq!(named("suspended"), 1);
        let suspend = events.iter().find(|e| e["name"] == "suspend").unwrap();
        assert_eq!(suspend["args"]["for"], "q2");
        assert_eq!(suspend["ts"], 5.0);
        let stopped = events.iter().find(|e| e["name"] == "suspended").unwrap();
        assert_eq!(
            (stopped["ts"].as_f64(), stopped["dur"].as_f64()),
            (Some(5.0), Some(4.0))
        );
    }

    #[test]
    fn gpu_counters_are_written_when_they_move() {
        let events = traced("gpu", 8_000, |t| {
            let mut g = GpuTimeSummary::default();
            // Nothing measured: u is 0 and there is no command time yet.
            t.gpu(0, QueueId(4), 1_000, &g);
            g.busy_fraction = 0.5;
            g.per_command_ns = Some(2_000_000);
            t.gpu(0, QueueId(4), 2_000, &g);
            // Unchanged, then a move too small to show: nothing written.
            t.gpu(0, QueueId(4), 3_000, &g);
            g.busy_fraction = 0.502;
            t.gpu(0, QueueId(4), 4_000, &g);
            // The small moves add up against what the timeline shows.
            g.busy_fraction = 0.506;
            g.per_command_ns = Some(2_500_000);
            t.gpu(0, QueueId(4), 5_000, &g);
            t.forget(0, QueueId(4), 6_000);
            t.gpu(0, QueueId(4), 7_000, &g);
        });
        let series = |name: &str, arg: &str| -> Vec<(f64, f64)> {
            events
                .iter()
                .filter(|e| e["ph"] == "C" && e["name"] == name)
                .map(|e| (e["ts"].as_f64().unwrap(), e["args"][arg].as_f64().unwrap()))
                .collect()
        };
        assert_eq!(
            series("q4 busy %", "u"),
            [(1.0, 0.0), (2.0, 50.0), (5.0, 50.6), (7.0, 50.6)]
        );
        assert_eq!(
            series("q4 GPU time per command (µs)", "us"),
            [(2.0, 2_000.0), (5.0, 2_500.0), (7.0, 2_500.0)]
        );
    }

    #[test]
    fn drained_suspensions_are_written_when_they_grow() {
        // None yet: no series; then each new total once.
        let events = traced("drains", 5_000, |t| {
            for (now, total) in [(1_000, 0), (2_000, 3), (3_000, 3), (4_000, 5)] {
                t.drains(0, QueueId(2), now, total);
            }
        });
        let series: Vec<(f64, u64)> = events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == "q2 drained suspensions")
            .map(|e| {
                (
                    e["ts"].as_f64().unwrap(),
                    e["args"]["drained"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(series, [(2.0, 3), (4.0, 5)]);
    }
}
