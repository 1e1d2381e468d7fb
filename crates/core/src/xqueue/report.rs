//! What a queue owes the scheduler: a Ready when it has work that counts (at once, or once the
//! application waits for it where the queue was configured so), an Idle when it drained.

use super::XQueue;
use crate::sched::QueueReport;

impl<P> XQueue<P> {
    /// The Ready/Idle report owed to the scheduler, if the queue's activity changed since the
    /// last one.
    pub fn take_report(&mut self) -> Option<QueueReport> {
        if self.is_idle() {
            self.waited = false;
        }
        // A Ready stands until the queue is idle, whatever made it due.
        let active = !self.is_idle() && (self.reported_active || self.ready_due());
        if active == self.reported_active {
            return None;
        }
        self.reported_active = active;
        self.transitions += 1;
        let generation = self.transitions;
        Some(if active {
            QueueReport::Ready {
                pending: self.pending.len(),
                generation,
            }
        } else {
            QueueReport::Idle { generation }
        })
    }

    /// The application waits for this queue's work (it blocks on it, polls it or asks to be
    /// called back): a queue that reports Ready only then
    /// ([`crate::QueueConfig::with_ready_when_waited`]) owes it now.
    pub fn waited(&mut self) -> Option<QueueReport> {
        if !self.is_idle() {
            self.waited = true;
        }
        self.take_report()
    }

    /// Whether the queue's work is to count as Ready now: always, unless the queue waits to be
    /// waited for; then once it is, or once a suspension holds work back in its buffer.
    fn ready_due(&self) -> bool {
        !self.config.ready_when_waited()
            || self.waited
            || (self.suspended && !self.pending.is_empty())
    }
}
