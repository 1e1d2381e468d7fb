//! Timestamps on one clock across the processes of a scenario: each side records what it did
//! (an LC request's start and end; what the BE queue's hardware was told, and when its stop
//! settled) on `CLOCK_MONOTONIC`, so that a scenario's sides can be lined up afterwards to see
//! where an LC request's time went. Off unless a scenario asks for them (`--marks`).

use crate::{BenchError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use xpreempt_core::QueueId;
use xpreempt_core::sched::QueueReport;
use xpreempt_core::xqueue::threaded::{EventSink, ReportSink};
use xpreempt_hal::HalError;
use xpreempt_hal::observed::{HalOp, Observed, Observer};

/// Now on `CLOCK_MONOTONIC`, which every process of the machine shares.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What happened at a mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum What {
    RequestStart,
    RequestEnd,
    Launch,
    LaunchEnd,
    /// A submission to an XQueue returned (after its launch, the queue's reports).
    Submitted,
    /// The queue announced a submission to its scheduler (before the launch), and that returned.
    AnnounceStart,
    AnnounceEnd,
    /// The queue reported Ready to its scheduler (after the launch), and that returned.
    ReadyStart,
    ReadyEnd,
    /// The queue reported Idle to its scheduler (its watcher, once the work drained), and that
    /// returned (with the resumes it made on the reporting thread).
    IdleStart,
    IdleEnd,
    /// A stop ahead (`HwQueue::stop_ahead`) that went ahead: its call's start and end. One that
    /// found nothing to stop is not marked.
    StopAheadStart,
    StopAheadEnd,
    DeactivateStart,
    DeactivateEnd,
    ReactivateStart,
    ReactivateEnd,
    InterruptStart,
    InterruptEnd,
    RestoreStart,
    RestoreEnd,
    /// The first time a stop was seen to have taken effect (the hardware free of the queue).
    Settled,
    /// A stop (deactivate or interrupt) was made on an application's thread rather than one of
    /// xpreempt's (named `xpreempt-…`): in one process, the LC's own thread when the preemption
    /// thread had not taken its announcement by the LC's Ready. Marked with the stop's start.
    StopOnAppThread,
    /// Not a time: the GPU's own duration (ns) of the request just ended, from timing events
    /// around its launches (`XP_BENCH_GPU_ELAPSED=1`, plain streams only).
    GpuElapsed,
}

/// One side's marks, in the order they were taken, and the file they go to.
pub struct Marks {
    path: PathBuf,
    marks: Mutex<Vec<(u64, What)>>,
}

#[derive(Serialize, Deserialize)]
struct File {
    pid: u32,
    marks: Vec<(u64, What)>,
}

impl Marks {
    /// Marks for a side whose spec names a file for them.
    pub fn wanted(path: Option<&Path>) -> Option<Arc<Marks>> {
        path.map(|p| {
            Arc::new(Marks {
                path: p.to_path_buf(),
                marks: Mutex::default(),
            })
        })
    }

    pub fn mark(&self, what: What) {
        self.value(what, now_ns());
    }

    /// A duration rather than a time (see [`What::GpuElapsed`]).
    pub fn value(&self, what: What, v: u64) {
        self.marks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((v, what));
    }

    /// Writes the marks to their file as JSON (`{"pid": …, "marks": [[ns, "what"], …]}`).
    pub fn save(&self) -> Result<()> {
        let path = &self.path;
        let marks = self.marks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let file = File {
            pid: std::process::id(),
            marks,
        };
        let text =
            serde_json::to_string(&file).map_err(|e| BenchError::Spec(format!("marks: {e}")))?;
        std::fs::write(path, text).map_err(|source| BenchError::Io {
            what: format!("writing marks to {}", path.display()),
            source,
        })
    }
}

/// A scheduler's inbox whose announcements, Ready and Idle reports are marked: where a queue's
/// submission spends its time on the scheduler's side, and when its Idle came.
pub struct MarkedSink {
    pub inner: EventSink,
    pub marks: Arc<Marks>,
}

impl ReportSink for MarkedSink {
    fn report(&self, queue: QueueId, report: QueueReport) {
        let marked = match report {
            QueueReport::Ready { .. } => Some((What::ReadyStart, What::ReadyEnd)),
            QueueReport::Idle { .. } => Some((What::IdleStart, What::IdleEnd)),
            _ => None,
        };
        if let Some((start, _)) = marked {
            self.marks.mark(start);
        }
        self.inner.report(queue, report);
        if let Some((_, end)) = marked {
            self.marks.mark(end);
        }
    }

    fn wants_work(&self) -> bool {
        self.inner.wants_work()
    }

    fn submitting(&self, queue: QueueId) {
        self.marks.mark(What::AnnounceStart);
        self.inner.submitting(queue);
        self.marks.mark(What::AnnounceEnd);
    }

    fn submit_failed(&self, queue: QueueId) {
        self.inner.submit_failed(queue);
    }

    fn idle_from_waiter(&self, queue: QueueId) -> bool {
        self.inner.idle_from_waiter(queue)
    }

    fn flush(&self, queue: QueueId) {
        self.inner.flush(queue);
    }
}

/// A hardware queue whose launches, stops and restarts are marked (when it has marks), and when
/// a stop was first seen settled.
pub type Marked<H> = Observed<H, MarkCalls>;

pub fn marked<H>(inner: H, marks: Option<Arc<Marks>>) -> Marked<H> {
    Observed::new(
        inner,
        MarkCalls {
            marks,
            stopping: AtomicBool::new(false),
            ahead_start: AtomicU64::new(0),
        },
    )
}

pub struct MarkCalls {
    marks: Option<Arc<Marks>>,
    /// A stop was made and not yet seen settled (nor undone).
    stopping: AtomicBool,
    /// When the last stop ahead was called (marked if it went ahead).
    ahead_start: AtomicU64,
}

impl MarkCalls {
    fn mark(&self, what: What) {
        if let Some(m) = &self.marks {
            m.mark(what);
        }
    }
}

impl Observer for MarkCalls {
    fn before(&self, op: HalOp) -> std::result::Result<(), HalError> {
        let start = match op {
            HalOp::StopAhead => {
                // Marked only if it goes ahead (`went_ahead`).
                self.ahead_start.store(now_ns(), Ordering::SeqCst);
                return Ok(());
            }
            HalOp::Launch => What::Launch,
            HalOp::Deactivate => What::DeactivateStart,
            HalOp::Reactivate => What::ReactivateStart,
            HalOp::Interrupt => What::InterruptStart,
            HalOp::Restore => What::RestoreStart,
        };
        match op {
            HalOp::Deactivate | HalOp::Interrupt => {
                self.stopping.store(true, Ordering::SeqCst);
                let xpreempt_thread = std::thread::current()
                    .name()
                    .is_some_and(|n| n.starts_with("xpreempt-"));
                if !xpreempt_thread {
                    self.mark(What::StopOnAppThread);
                }
            }
            HalOp::Reactivate | HalOp::Restore => self.stopping.store(false, Ordering::SeqCst),
            HalOp::Launch | HalOp::StopAhead => {}
        }
        self.mark(start);
        Ok(())
    }

    fn after(&self, op: HalOp) {
        self.mark(match op {
            HalOp::StopAhead => return,
            HalOp::Launch => What::LaunchEnd,
            HalOp::Deactivate => What::DeactivateEnd,
            HalOp::Reactivate => What::ReactivateEnd,
            HalOp::Interrupt => What::InterruptEnd,
            HalOp::Restore => What::RestoreEnd,
        });
    }

    fn settled(&self, settled: bool) {
        if settled && self.stopping.swap(false, Ordering::SeqCst) {
            self.mark(What::Settled);
        }
    }

    fn went_ahead(&self, ahead: bool) {
        if let (true, Some(m)) = (ahead, &self.marks) {
            self.stopping.store(true, Ordering::SeqCst);
            m.value(
                What::StopAheadStart,
                self.ahead_start.load(Ordering::SeqCst),
            );
            m.mark(What::StopAheadEnd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_hal::reference::RefDevice;
    use xpreempt_hal::{HwQueue, Level};

    #[test]
    fn stops_restarts_and_the_first_settle_are_marked_in_order() {
        let dir = std::env::temp_dir().join(format!("xpreempt-marks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("be.json");
        let marks = Marks::wanted(Some(&path)).unwrap();
        let q = marked(
            RefDevice::new().create_queue(Level::Lv2),
            Some(marks.clone()),
        );
        // Stopped from one of xpreempt's threads: no StopOnAppThread mark.
        std::thread::scope(|sc| {
            std::thread::Builder::new()
                .name("xpreempt-test".into())
                .spawn_scoped(sc, || q.deactivate().ok())
                .unwrap();
        });
        assert!(q.settled() && q.settled());
        q.reactivate(&mut []).ok();
        marks.value(What::GpuElapsed, 7);
        let seen: Vec<What> = marks.marks.lock().unwrap().iter().map(|m| m.1).collect();
        assert_eq!(
            seen,
            [
                What::DeactivateStart,
                What::DeactivateEnd,
                What::Settled,
                What::ReactivateStart,
                What::ReactivateEnd,
                What::GpuElapsed
            ],
            "one settle per stop"
        );
        let times: Vec<u64> = marks.marks.lock().unwrap()[..5]
            .iter()
            .map(|m| m.0)
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        marks.save().unwrap();
        let back: File = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back.marks.len(), 6);
        assert_eq!(
            back.marks[5],
            (7, What::GpuElapsed),
            "a duration is kept as given"
        );
        assert_eq!(back.pid, std::process::id());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_stop_ahead_is_marked_only_when_it_went_ahead() {
        let marks = Marks::wanted(Some(Path::new("/nonexistent/be.json"))).unwrap();
        let q = marked(
            RefDevice::new().create_queue(Level::Lv2),
            Some(marks.clone()),
        );
        assert!(!q.stop_ahead(), "nothing in flight");
        assert!(marks.marks.lock().unwrap().is_empty());
        let mut k = xpreempt_hal::Command::kernel(xpreempt_hal::reference::RefKernel {
            blocks: 2,
            block_ns: 100,
        });
        q.launch(0, &mut k, true).unwrap();
        assert!(q.stop_ahead());
        let seen: Vec<(u64, What)> = marks.marks.lock().unwrap().clone();
        let kinds: Vec<What> = seen.iter().map(|m| m.1).collect();
        assert_eq!(
            kinds,
            [
                What::Launch,
                What::LaunchEnd,
                What::StopAheadStart,
                What::StopAheadEnd
            ]
        );
        assert!(seen[1].0 <= seen[2].0 && seen[2].0 <= seen[3].0, "{seen:?}");
    }

    #[test]
    fn a_stop_on_an_application_thread_is_marked_so() {
        let marks = Marks::wanted(Some(Path::new("/nonexistent/lc.json"))).unwrap();
        let q = marked(
            RefDevice::new().create_queue(Level::Lv2),
            Some(marks.clone()),
        );
        q.deactivate().ok();
        let seen: Vec<What> = marks.marks.lock().unwrap().iter().map(|m| m.1).collect();
        assert_eq!(
            seen[..2],
            [What::StopOnAppThread, What::DeactivateStart],
            "the test's own thread is an application's"
        );
    }

    #[test]
    fn a_marked_sink_marks_announcements_readies_and_idles_and_forwards_everything() {
        #[derive(Default)]
        struct Seen(Mutex<Vec<&'static str>>);
        impl ReportSink for Seen {
            fn report(&self, _: QueueId, r: QueueReport) {
                let what = match r {
                    QueueReport::Ready { .. } => "ready",
                    _ => "other",
                };
                self.0.lock().unwrap().push(what);
            }
            fn wants_work(&self) -> bool {
                true
            }
            fn submitting(&self, _: QueueId) {
                self.0.lock().unwrap().push("announce");
            }
            fn submit_failed(&self, _: QueueId) {
                self.0.lock().unwrap().push("failed");
            }
            fn idle_from_waiter(&self, _: QueueId) -> bool {
                true
            }
            fn flush(&self, _: QueueId) {
                self.0.lock().unwrap().push("flush");
            }
        }
        let inner = Arc::new(Seen::default());
        let marks = Marks::wanted(Some(Path::new("/nonexistent/lc.json"))).unwrap();
        let sink = MarkedSink {
            inner: inner.clone(),
            marks: marks.clone(),
        };
        let q = QueueId(1);
        sink.submitting(q);
        sink.report(
            q,
            QueueReport::Ready {
                pending: 1,
                generation: 1,
            },
        );
        sink.report(q, QueueReport::Idle { generation: 2 });
        sink.submit_failed(q);
        sink.flush(q);
        assert!(sink.wants_work());
        assert!(sink.idle_from_waiter(q));
        assert_eq!(
            *inner.0.lock().unwrap(),
            ["announce", "ready", "other", "failed", "flush"]
        );
        let seen: Vec<What> = marks.marks.lock().unwrap().iter().map(|m| m.1).collect();
        assert_eq!(
            seen,
            [
                What::AnnounceStart,
                What::AnnounceEnd,
                What::ReadyStart,
                What::ReadyEnd,
                What::IdleStart,
                What::IdleEnd
            ]
        );
    }

    #[test]
    fn unmarked_queues_record_nothing() {
        let q = marked(RefDevice::new().create_queue(Level::Lv2), None);
        q.deactivate().ok();
        assert!(q.settled());
    }
}
