//! Stream captures in progress in the process. While one runs, work on the capturing stream,
//! and on every stream that joins it through an event, is captured into a graph instead of run;
//! an event recorded there is captured with it, and querying it then invalidates the capture. So
//! a pass-through queue's observer, which records its events from its own thread behind the
//! application's work, records none while a capture is in progress (`observe.rs`), and the
//! front end fences the observers before the capture begins ([`CudaQueue::fence_capture`]).
//! The gate is the whole process's, since a stream joins a capture through any event wait: while
//! a capture runs, an observed stream's Idle waits for its end (a capture left open for good
//! would keep them Ready).

use super::CudaQueue;
use std::sync::atomic::{AtomicUsize, Ordering};

static CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// A capture is about to begin: counted before it does, then the observers are fenced.
pub fn begins() {
    CAPTURES.fetch_add(1, Ordering::SeqCst);
}

/// A capture ended (or failed to begin).
pub fn ends() {
    let _ = CAPTURES.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1));
}

/// Whether a capture is in progress in the process.
pub fn in_progress() -> bool {
    CAPTURES.load(Ordering::SeqCst) > 0
}

impl CudaQueue {
    /// After [`begins`]: returns once this queue's observer is not between seeing no capture and
    /// recording its event (it does both under the queue's lock), so it records nothing until
    /// the capture ends.
    pub fn fence_capture(&self) {
        drop(self.lock());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{CUresult, Driver, Handle, SUCCESS};
    use crate::queue::{CudaQueueConfig, Deferred};
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;
    use xpreempt_hal::{Command, HwQueue};

    /// A driver whose events complete at once, counting the records.
    struct Counting {
        records: AtomicU32,
    }

    impl Driver for Counting {
        fn event_create(&self, ev: &mut Handle, _: u32) -> CUresult {
            *ev = std::ptr::dangling_mut();
            SUCCESS
        }
        fn event_record(&self, _: Handle, _: Handle) -> CUresult {
            self.records.fetch_add(1, Ordering::SeqCst);
            SUCCESS
        }
        fn event_query(&self, _: Handle) -> CUresult {
            SUCCESS
        }
        fn event_destroy(&self, _: Handle) -> CUresult {
            SUCCESS
        }
        fn ctx_get_current(&self, _: &mut Handle) -> CUresult {
            SUCCESS
        }
        fn ctx_push(&self, _: Handle) -> CUresult {
            SUCCESS
        }
        fn ctx_pop(&self, _: &mut Handle) -> CUresult {
            SUCCESS
        }
        fn stream_priority_range(&self, _: &mut i32, _: &mut i32) -> CUresult {
            SUCCESS
        }
        fn stream_create(&self, _: &mut Handle, _: u32, _: i32) -> CUresult {
            SUCCESS
        }
        fn stream_wait_event(&self, _: Handle, _: Handle, _: u32) -> CUresult {
            SUCCESS
        }
        fn stream_synchronize(&self, _: Handle) -> CUresult {
            SUCCESS
        }
        fn stream_destroy(&self, _: Handle) -> CUresult {
            SUCCESS
        }
        fn mem_alloc(&self, _: &mut u64, _: usize) -> CUresult {
            SUCCESS
        }
        fn mem_free(&self, _: u64) -> CUresult {
            SUCCESS
        }
        fn memset_d32_async(&self, _: u64, _: u32, _: usize, _: Handle) -> CUresult {
            SUCCESS
        }
    }

    static DRIVER: Counting = Counting {
        records: AtomicU32::new(0),
    };

    #[test]
    fn an_observer_records_nothing_while_a_capture_is_in_progress() {
        let cfg = CudaQueueConfig {
            observe: true,
            ..CudaQueueConfig::default()
        };
        let hal = CudaQueue::new(&DRIVER, std::ptr::null_mut(), std::ptr::dangling_mut(), cfg);
        let mut marker = Command::kernel(Deferred::new(|| SUCCESS));
        hal.launch(0, &mut marker, true).unwrap();

        begins();
        hal.fence_capture();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| hal.synchronize(1));
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(
                DRIVER.records.load(Ordering::SeqCst),
                0,
                "recorded during a capture"
            );
            assert!(!waiter.is_finished(), "the marker completed unobserved");
            ends();
            waiter.join().unwrap().unwrap();
        });
        assert_eq!(DRIVER.records.load(Ordering::SeqCst), 1);
        assert_eq!(hal.completed(), 1);
        assert!(!in_progress());
    }
}
