//! CPSCH's hardware-queue allocator: per-pipe free bitmaps of the user-queue MEC and
//! KFD's round-robin "horizontal" allocation from `next_pipe_to_allocate`.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// MEC/pipe/queue shape of one XCC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Topology {
    pub mecs: u32,
    /// The MEC whose queues KFD hands to user processes (the others run kernel queues).
    pub user_mec: u32,
    pub pipes_per_mec: u32,
    pub queues_per_pipe: u32,
    /// Which XCCs (accelerator complex dies) exist; one MQD loads on every one of them.
    pub xcc_mask: u32,
}

impl Default for Topology {
    /// gfx942 as read from `gfx_v9_0.c`: 2 MECs, 4 pipes of 8 queues, MEC 0 for
    /// user queues. One XCC unless the scenario says otherwise.
    fn default() -> Self {
        Self {
            mecs: 2,
            user_mec: 0,
            pipes_per_mec: 4,
            queues_per_pipe: 8,
            xcc_mask: 0x1,
        }
    }
}

impl Topology {
    pub fn xccs(&self) -> u32 {
        self.xcc_mask.count_ones()
    }

    pub fn user_slots(&self) -> u32 {
        self.pipes_per_mec * self.queues_per_pipe
    }

    pub fn validate(&self) -> Result<(), CpschError> {
        let bad = |why: &'static str| Err(CpschError::Topology(why));
        if self.mecs == 0 || self.user_mec >= self.mecs {
            return bad("user_mec must name one of the MECs");
        }
        if self.pipes_per_mec == 0 || self.pipes_per_mec > 32 {
            return bad("pipes_per_mec must be 1..=32");
        }
        if self.queues_per_pipe == 0 || self.queues_per_pipe > 32 {
            return bad("queues_per_pipe must be 1..=32 (one bit each in a pipe's bitmap)");
        }
        if self.xcc_mask == 0 {
            return bad("xcc_mask must name at least one XCC");
        }
        Ok(())
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CpschError {
    /// KFD's `-EBUSY`: every HQD slot of the user MEC is taken.
    #[error("EBUSY: all {slots} HQD slots of MEC {mec} are allocated")]
    Busy { mec: u32, slots: u32 },
    #[error("HQD slot pipe {pipe} queue {queue} is not allocated")]
    NotAllocated { pipe: u32, queue: u32 },
    #[error("invalid topology: {0}")]
    Topology(&'static str),
}

/// A (pipe, queue) slot of the user MEC; the same slot is used on every XCC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HqdSlot {
    pub pipe: u32,
    pub queue: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PipePolicy {
    /// KFD's `allocate_hqd`: round-robin across pipes.
    #[default]
    Horizontal,
    /// A process starts at pipe `pid % pipes`, so processes do not share pipes
    /// while there are enough of them; falls back to the next pipes when its own is full.
    ProcessAware,
}

#[derive(Clone, Debug)]
pub struct Cpsch {
    topology: Topology,
    policy: PipePolicy,
    /// Bit set = queue slot free, as in `dqm->allocated_queues[pipe]`.
    allocated_queues: Vec<u32>,
    next_pipe_to_allocate: u32,
}

impl Cpsch {
    pub fn new(topology: Topology, policy: PipePolicy) -> Result<Self, CpschError> {
        topology.validate()?;
        let all = if topology.queues_per_pipe == 32 {
            u32::MAX
        } else {
            (1u32 << topology.queues_per_pipe) - 1
        };
        Ok(Self {
            topology,
            policy,
            allocated_queues: vec![all; topology.pipes_per_mec as usize],
            next_pipe_to_allocate: 0,
        })
    }

    pub fn topology(&self) -> Topology {
        self.topology
    }

    pub fn next_pipe_to_allocate(&self) -> u32 {
        self.next_pipe_to_allocate
    }

    pub fn free_slots(&self) -> u32 {
        self.allocated_queues.iter().map(|b| b.count_ones()).sum()
    }

    /// The free bitmap of one pipe (bit set = free).
    pub fn bitmap(&self, pipe: u32) -> Option<u32> {
        self.allocated_queues.get(pipe as usize).copied()
    }

    /// `allocate_hqd`: the first free queue (lowest bit) of the first pipe with one, searching
    /// from `next_pipe_to_allocate` (or the process's own pipe), which then moves past the pipe
    /// used.
    pub fn allocate(&mut self, process: u32) -> Result<HqdSlot, CpschError> {
        let pipes = self.topology.pipes_per_mec;
        let start = match self.policy {
            PipePolicy::Horizontal => self.next_pipe_to_allocate,
            PipePolicy::ProcessAware => process % pipes,
        };
        for i in 0..pipes {
            let pipe = (start + i) % pipes;
            let bits = &mut self.allocated_queues[pipe as usize];
            if *bits != 0 {
                let queue = bits.trailing_zeros();
                *bits &= !(1 << queue);
                if self.policy == PipePolicy::Horizontal {
                    self.next_pipe_to_allocate = (pipe + 1) % pipes;
                }
                tracing::debug!(pipe, queue, "hqd slot allocated");
                return Ok(HqdSlot { pipe, queue });
            }
        }
        Err(CpschError::Busy {
            mec: self.topology.user_mec,
            slots: self.topology.user_slots(),
        })
    }

    /// `deallocate_hqd`: sets the slot's bit again.
    pub fn deallocate(&mut self, slot: HqdSlot) -> Result<(), CpschError> {
        let not = CpschError::NotAllocated {
            pipe: slot.pipe,
            queue: slot.queue,
        };
        if slot.queue >= self.topology.queues_per_pipe {
            return Err(not);
        }
        let bits = self
            .allocated_queues
            .get_mut(slot.pipe as usize)
            .ok_or(not.clone())?;
        if *bits & (1 << slot.queue) != 0 {
            return Err(not);
        }
        *bits |= 1 << slot.queue;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_eight_queues_go_across_the_pipes() {
        let mut c = Cpsch::new(Topology::default(), PipePolicy::Horizontal).unwrap();
        let got: Vec<(u32, u32)> = (0..8)
            .map(|_| c.allocate(1).map(|s| (s.pipe, s.queue)).unwrap())
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0),
                (1, 0),
                (2, 0),
                (3, 0),
                (0, 1),
                (1, 1),
                (2, 1),
                (3, 1)
            ]
        );
        assert_eq!(c.bitmap(0), Some(0b1111_1100));
        assert_eq!(c.next_pipe_to_allocate(), 0);
    }

    #[test]
    fn the_33rd_queue_gets_ebusy_and_a_freed_slot_is_reused() {
        let mut c = Cpsch::new(Topology::default(), PipePolicy::Horizontal).unwrap();
        let slots: Vec<HqdSlot> = (0..32).map(|_| c.allocate(1).unwrap()).collect();
        assert_eq!(c.allocate(1), Err(CpschError::Busy { mec: 0, slots: 32 }));
        c.deallocate(slots[5]).unwrap();
        assert_eq!(c.allocate(1), Ok(slots[5]));
        assert!(c.deallocate(HqdSlot { pipe: 9, queue: 0 }).is_err());
        c.deallocate(slots[0]).unwrap();
        assert_eq!(
            c.deallocate(slots[0]),
            Err(CpschError::NotAllocated { pipe: 0, queue: 0 })
        );
    }

    #[test]
    fn process_aware_allocation_keeps_processes_on_their_own_pipes() {
        let mut c = Cpsch::new(Topology::default(), PipePolicy::ProcessAware).unwrap();
        let p1: Vec<u32> = (0..3).map(|_| c.allocate(1).unwrap().pipe).collect();
        let p2: Vec<u32> = (0..3).map(|_| c.allocate(2).unwrap().pipe).collect();
        assert_eq!((p1, p2), (vec![1, 1, 1], vec![2, 2, 2]));
    }

    #[test]
    fn bad_topologies_are_refused() {
        let t = Topology {
            user_mec: 2,
            ..Topology::default()
        };
        assert!(Cpsch::new(t, PipePolicy::Horizontal).is_err());
    }
}
