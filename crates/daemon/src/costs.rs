//! The measured cost of each mechanism per device, over the recent past: the suspend and resume
//! latencies that each queue's agent publishes in its slot (cumulative since the queue
//! registered) are sampled on the daemon's tick, and what each queue gained since the last
//! sample is added to its device's and level's current epoch; a suspension that drained
//! although the queue's level could stop the hardware counts as an Lv1 drain. An epoch spans
//! [`EPOCH`]; the newest [`EPOCHS`] epochs that hold samples are kept, so the costs describe the
//! last minute of suspensions on a busy device and the last ones measured on a quiet one (how
//! far back they reach is part of the answer).

use std::collections::{BTreeMap, VecDeque};
use xpreempt_core::{Level, Nanos, QueueId};
use xpreempt_ipc::costs::{self, CostSummary, DeviceCosts, Mechanism, MechanismCost};
use xpreempt_ipc::shm::LatencyCounts;

/// How long one epoch of samples lasts.
pub const EPOCH: Nanos = 10_000_000_000;
/// How many epochs with samples a device and level keep.
pub const EPOCHS: usize = 6;

/// A queue's suspend and resume latencies (cumulative, as its slot holds them): `suspend` by its
/// level's mechanism, `drain` for suspensions that drained instead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latencies {
    pub suspend: LatencyCounts,
    pub drain: LatencyCounts,
    pub resume: LatencyCounts,
}

struct Seen {
    device: u32,
    level: Level,
    last: Latencies,
}

/// Stop and restart latencies of one mechanism.
#[derive(Clone, Copy, Default)]
struct Samples {
    suspend: LatencyCounts,
    resume: LatencyCounts,
}

struct Epoch {
    start: Nanos,
    samples: Samples,
}

/// Every device's and level's recent suspend and resume latencies.
#[derive(Default)]
pub struct CostBook {
    seen: BTreeMap<QueueId, Seen>,
    epochs: BTreeMap<(u32, Level), VecDeque<Epoch>>,
}

impl CostBook {
    /// Takes what `queue` (of `device`, suspended at `level`) measured since it was last seen.
    pub fn observe(
        &mut self,
        queue: QueueId,
        device: u32,
        level: Level,
        now: Nanos,
        current: Latencies,
    ) {
        let seen = self.seen.entry(queue).or_insert(Seen {
            device,
            level,
            last: Latencies::default(),
        });
        let (device, level) = (seen.device, seen.level);
        let stops = Samples {
            suspend: costs::since(&current.suspend, &seen.last.suspend),
            resume: costs::since(&current.resume, &seen.last.resume),
        };
        let drains = Samples {
            suspend: costs::since(&current.drain, &seen.last.drain),
            resume: LatencyCounts::default(),
        };
        seen.last = current;
        self.add(device, level, now, stops);
        self.add(device, Level::Lv1, now, drains);
    }

    fn add(&mut self, device: u32, level: Level, now: Nanos, new: Samples) {
        if new.suspend.count == 0 && new.resume.count == 0 {
            return;
        }
        let epochs = self.epochs.entry((device, level)).or_default();
        match epochs.back_mut() {
            Some(e) if now.saturating_sub(e.start) < EPOCH => {
                costs::add(&mut e.samples.suspend, &new.suspend);
                costs::add(&mut e.samples.resume, &new.resume);
            }
            _ => {
                epochs.push_back(Epoch {
                    start: now,
                    samples: new,
                });
                if epochs.len() > EPOCHS {
                    epochs.pop_front();
                }
            }
        }
    }

    /// The queue is gone; what it measured stays in its epochs.
    pub fn forget(&mut self, queue: QueueId) {
        self.seen.remove(&queue);
    }

    /// The measured cost of stopping and restarting queues of `device` at `level` (the Lv1
    /// drain, the Lv2 block-boundary stop, the Lv3 switch), as of `now`.
    pub fn cost(&self, device: u32, level: Level, now: Nanos) -> MechanismCost {
        let mut merged = Samples::default();
        let mut oldest = None;
        for e in self.epochs.get(&(device, level)).into_iter().flatten() {
            costs::add(&mut merged.suspend, &e.samples.suspend);
            costs::add(&mut merged.resume, &e.samples.resume);
            oldest = oldest.or(Some(e.start));
        }
        MechanismCost {
            mechanism: Mechanism::of(level),
            level: Some(level),
            stop: CostSummary::of(&merged.suspend),
            restart: CostSummary::of(&merged.resume),
            over_ns: oldest.map(|start| now.saturating_sub(start)),
            note: None,
        }
    }

    /// Every mechanism on each of `devices`.
    pub fn devices(&self, devices: impl IntoIterator<Item = u32>, now: Nanos) -> Vec<DeviceCosts> {
        devices
            .into_iter()
            .map(|device| DeviceCosts {
                device,
                mechanisms: Mechanism::ALL
                    .iter()
                    .map(|&m| match m.level() {
                        Some(level) => self.cost(device, level, now),
                        None => MechanismCost::not_measured(m),
                    })
                    .collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_types::histogram::Histogram;

    const S: Nanos = 1_000_000_000;

    /// What a slot holds after these samples.
    fn counts(values: &[u64]) -> LatencyCounts {
        let mut h = Histogram::new();
        for &v in values {
            h.record(v);
        }
        LatencyCounts::of(&h)
    }

    fn lat(suspend: &[u64], resume: &[u64]) -> Latencies {
        Latencies {
            suspend: counts(suspend),
            drain: counts(&[]),
            resume: counts(resume),
        }
    }

    #[test]
    fn drains_of_a_higher_level_count_as_lv1_drains() {
        let mut b = CostBook::default();
        let mut l = lat(&[3_000_000], &[0]);
        l.drain = counts(&[200_000, 200_000]);
        b.observe(QueueId(0), 0, Level::Lv3, S, l);
        assert_eq!(b.cost(0, Level::Lv3, S).stop.unwrap().mean_ns, 3_000_000);
        let lv1 = b.cost(0, Level::Lv1, S);
        assert_eq!(lv1.stop.unwrap().samples, 2);
        assert_eq!(lv1.stop.unwrap().mean_ns, 200_000);
        // Seen again with nothing new: nothing is counted twice.
        b.observe(QueueId(0), 0, Level::Lv3, 2 * S, l);
        assert_eq!(b.cost(0, Level::Lv1, 2 * S).stop.unwrap().samples, 2);
    }

    #[test]
    fn queues_of_one_device_and_level_merge_and_levels_and_devices_stay_apart() {
        let mut b = CostBook::default();
        b.observe(
            QueueId(0),
            0,
            Level::Lv2,
            S,
            lat(&[40_000; 10], &[5_000; 10]),
        );
        b.observe(QueueId(1), 0, Level::Lv2, S, lat(&[60_000; 10], &[]));
        b.observe(
            QueueId(2),
            0,
            Level::Lv3,
            S,
            lat(&[3_000_000], &[2_000_000]),
        );
        b.observe(QueueId(3), 1, Level::Lv2, S, lat(&[900_000], &[]));
        let lv2 = b.cost(0, Level::Lv2, 2 * S);
        let stop = lv2.stop.unwrap();
        assert_eq!(stop.samples, 20);
        assert_eq!(stop.mean_ns, 50_000);
        assert!((32_768..65_536).contains(&stop.p50_ns), "{stop:?}");
        assert!(stop.p99_ns < 65_536, "{stop:?}");
        assert_eq!(lv2.restart.unwrap().samples, 10);
        assert_eq!(lv2.over_ns, Some(S));
        assert_eq!(lv2.mechanism, Mechanism::BlockStop);
        let lv3 = b.cost(0, Level::Lv3, 2 * S);
        assert_eq!(lv3.stop.unwrap().mean_ns, 3_000_000);
        assert_eq!(lv3.mechanism, Mechanism::Switch);
        let lv1 = b.cost(0, Level::Lv1, 2 * S);
        assert!(lv1.stop.is_none() && lv1.restart.is_none() && lv1.over_ns.is_none());
        assert_eq!(b.cost(1, Level::Lv2, 2 * S).stop.unwrap().samples, 1);
    }

    #[test]
    fn a_queue_counts_only_what_it_measured_since_it_was_last_seen() {
        let mut b = CostBook::default();
        b.observe(QueueId(0), 0, Level::Lv1, S, lat(&[10_000], &[]));
        b.observe(QueueId(0), 0, Level::Lv1, 2 * S, lat(&[10_000], &[]));
        b.observe(
            QueueId(0),
            0,
            Level::Lv1,
            3 * S,
            lat(&[10_000, 20_000], &[]),
        );
        let c = b.cost(0, Level::Lv1, 3 * S);
        assert_eq!(c.stop.unwrap().samples, 2);
        assert_eq!(c.stop.unwrap().mean_ns, 15_000);
        assert_eq!(c.mechanism, Mechanism::Drain);
        // Gone, its samples stay; a queue with the same id would start from nothing.
        b.forget(QueueId(0));
        assert_eq!(b.cost(0, Level::Lv1, 3 * S).stop.unwrap().samples, 2);
    }

    #[test]
    fn old_epochs_give_way_to_new_ones_and_a_quiet_device_keeps_its_last() {
        let mut b = CostBook::default();
        // One slow stop per epoch for a while, then fast ones.
        let mut slow = Vec::new();
        for i in 0..EPOCHS as u64 {
            slow.push(8_000_000);
            b.observe(QueueId(0), 0, Level::Lv2, i * EPOCH, lat(&slow, &[]));
        }
        assert_eq!(
            b.cost(0, Level::Lv2, EPOCHS as u64 * EPOCH)
                .stop
                .unwrap()
                .samples,
            EPOCHS as u64
        );
        let mut all = slow.clone();
        for i in 0..EPOCHS as u64 {
            all.push(20_000);
            b.observe(
                QueueId(0),
                0,
                Level::Lv2,
                (EPOCHS as u64 + i) * EPOCH,
                lat(&all, &[]),
            );
        }
        let now = 2 * EPOCHS as u64 * EPOCH;
        let c = b.cost(0, Level::Lv2, now);
        let stop = c.stop.unwrap();
        assert_eq!(stop.samples, EPOCHS as u64, "only the newest epochs count");
        assert_eq!(stop.mean_ns, 20_000, "the slow stops aged out");
        assert_eq!(c.over_ns, Some(EPOCHS as u64 * EPOCH));
        // Nothing new for an hour: the last measurements stand, and say how old they are.
        let later = now + 3_600 * S;
        let c = b.cost(0, Level::Lv2, later);
        assert_eq!(c.stop.unwrap().samples, EPOCHS as u64);
        assert_eq!(c.over_ns, Some(later - EPOCHS as u64 * EPOCH));
    }

    #[test]
    fn every_device_lists_every_mechanism_and_spatial_confinement_is_not_measured() {
        let mut b = CostBook::default();
        b.observe(
            QueueId(0),
            0,
            Level::Lv3,
            S,
            lat(&[1_000_000], &[1_000_000]),
        );
        let d = b.devices([0, 1], S);
        assert_eq!(d.len(), 2);
        for dev in &d {
            let ms: Vec<Mechanism> = dev.mechanisms.iter().map(|m| m.mechanism).collect();
            assert_eq!(ms, Mechanism::ALL);
            let spatial = dev.mechanisms.last().unwrap();
            assert!(spatial.stop.is_none() && spatial.note.as_deref() == Some("not measured"));
        }
        assert!(d[0].mechanisms[2].stop.is_some());
        assert!(d[1].mechanisms[2].stop.is_none());
    }
}
