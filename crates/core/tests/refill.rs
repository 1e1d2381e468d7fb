//! `SharedXQueue::refill`: the caller takes in the completions the hardware can tell without
//! blocking and launches from the buffer into the room they made. The hardware here reports
//! completions only when asked that way, so the completion watcher alone can never refill the
//! window.

use std::sync::atomic::{AtomicU64, Ordering};
use xpreempt_core::xqueue::threaded::SharedXQueue;
use xpreempt_core::{Command, CommandProps, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_hal::HalError;
use xpreempt_types::Seq;

#[derive(Default)]
struct AskedHal {
    /// Commands launched (their seqs are 0..launched).
    launched: AtomicU64,
    /// Commands the device has finished.
    done: AtomicU64,
    /// What `completed()` says: only `take_in_completions` moves it.
    seen: AtomicU64,
}

impl HwQueue for &'static AskedHal {
    type Payload = ();

    fn max_level(&self) -> Level {
        Level::Lv1
    }

    fn launch(&self, seq: Seq, _: &mut Command<()>, _: bool) -> Result<(), HalError> {
        self.launched.store(seq + 1, Ordering::SeqCst);
        Ok(())
    }

    fn record_sync(&self) -> Result<(), HalError> {
        Ok(())
    }

    fn completed(&self) -> Seq {
        self.seen.load(Ordering::SeqCst)
    }

    fn synchronize(&self, _: Seq) -> Result<(), HalError> {
        Err(HalError::WouldBlock("completions are only taken in"))
    }

    fn take_in_completions(&self) {
        self.seen
            .store(self.done.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

fn backlog() -> (&'static AskedHal, SharedXQueue<&'static AskedHal>) {
    let hal: &'static AskedHal = Box::leak(Box::default());
    let config = QueueConfig::new(2, 1, Level::Lv1).unwrap();
    let q = SharedXQueue::new(XQueue::new(QueueId(1), config, Level::Lv1), hal, None);
    for _ in 0..4 {
        q.submit(command()).unwrap();
    }
    assert_eq!(
        (hal.launched.load(Ordering::SeqCst), q.pending_len()),
        (2, 2)
    );
    hal.done.store(2, Ordering::SeqCst);
    (hal, q)
}

fn command() -> Command<()> {
    Command::kernel(()).with_props(CommandProps::new(false, true, false))
}

#[test]
fn a_refill_before_a_submission_to_a_backlogged_queue_launches_from_its_buffer() {
    let (hal, q) = backlog();
    q.refill();
    q.submit(command()).unwrap();
    assert_eq!(
        hal.launched.load(Ordering::SeqCst),
        4,
        "the buffer's two went out"
    );
    assert_eq!(q.pending_len(), 1, "the new command waits behind them");
}

#[test]
fn without_it_the_submission_only_buffers() {
    let (hal, q) = backlog();
    q.submit(command()).unwrap();
    assert_eq!(hal.launched.load(Ordering::SeqCst), 2);
    assert_eq!(q.pending_len(), 3);
}

#[test]
fn a_suspended_queue_is_not_refilled() {
    use xpreempt_core::xqueue::threaded::Preemptible;
    let (hal, q) = backlog();
    q.suspend().unwrap();
    q.refill();
    assert_eq!(
        (hal.launched.load(Ordering::SeqCst), q.pending_len()),
        (2, 2)
    );
}
