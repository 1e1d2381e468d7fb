//! The user-mode AQL ring: a power-of-two array of 64-byte slots with 64-bit write and
//! read dispatch ids that only ever grow, a doorbell, and header-last publication.
//!
//! The producer reserves a slot by bumping the write id, writes the body with the header still
//! INVALID, then stores the header (publishing the packet) and rings the doorbell. The packet
//! processor reads at the read id; an INVALID header there means "not yet published", so a
//! half-written packet is never executed. Preemption never touches either id.

use crate::aql::{PACKET_BYTES, Packet, TYPE_INVALID};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RingError {
    #[error("ring size {0} is not a power of two between 2 and 65536 packets")]
    Size(u32),
    #[error("ring is full: {size} packets, write id {write}, read id {read}")]
    Full { size: u32, write: u64, read: u64 },
    #[error(
        "dispatch id {id} is not a reserved, unpublished slot (write id {write}, read id {read})"
    )]
    NotReserved { id: u64, write: u64, read: u64 },
}

#[derive(Clone, Debug)]
pub struct Ring {
    bytes: Vec<u8>,
    mask: u64,
    write_id: u64,
    read_id: u64,
    doorbell: u64,
}

impl Ring {
    pub fn new(size: u32) -> Result<Self, RingError> {
        if !size.is_power_of_two() || !(2..=65536).contains(&size) {
            return Err(RingError::Size(size));
        }
        Ok(Self {
            bytes: vec![0; size as usize * PACKET_BYTES],
            mask: u64::from(size) - 1,
            write_id: 0,
            read_id: 0,
            doorbell: 0,
        })
    }

    pub fn size(&self) -> u32 {
        (self.mask + 1) as u32
    }

    pub fn write_id(&self) -> u64 {
        self.write_id
    }

    pub fn read_id(&self) -> u64 {
        self.read_id
    }

    /// The last value written to the doorbell.
    pub fn doorbell(&self) -> u64 {
        self.doorbell
    }

    /// Packets written and not yet retired (what Scheme A's monitor computes from rptr/wptr).
    pub fn pending(&self) -> u64 {
        self.write_id - self.read_id
    }

    pub fn free(&self) -> u64 {
        self.mask + 1 - self.pending()
    }

    fn slot(&self, id: u64) -> std::ops::Range<usize> {
        let at = (id & self.mask) as usize * PACKET_BYTES;
        at..at + PACKET_BYTES
    }

    /// Reserves the next slot and writes the packet body with an INVALID header.
    pub fn reserve_and_write_body(&mut self, packet: &Packet) -> Result<u64, RingError> {
        if self.free() == 0 {
            return Err(RingError::Full {
                size: self.size(),
                write: self.write_id,
                read: self.read_id,
            });
        }
        let id = self.write_id;
        self.write_id += 1;
        let range = self.slot(id);
        self.bytes[range].copy_from_slice(&packet.encode_body());
        Ok(id)
    }

    /// Stores the header of a reserved slot, making the packet visible to the packet processor.
    pub fn publish(&mut self, id: u64, header: u16) -> Result<(), RingError> {
        if id < self.read_id || id >= self.write_id {
            return Err(RingError::NotReserved {
                id,
                write: self.write_id,
                read: self.read_id,
            });
        }
        let at = self.slot(id).start;
        self.bytes[at..at + 2].copy_from_slice(&header.to_le_bytes());
        Ok(())
    }

    /// Writes raw bytes into the next slot, header included (for tests of malformed input and
    /// for producers that build packets themselves).
    pub fn write_raw(&mut self, bytes: &[u8; PACKET_BYTES]) -> Result<u64, RingError> {
        if self.free() == 0 {
            return Err(RingError::Full {
                size: self.size(),
                write: self.write_id,
                read: self.read_id,
            });
        }
        let id = self.write_id;
        self.write_id += 1;
        let range = self.slot(id);
        self.bytes[range].copy_from_slice(bytes);
        Ok(id)
    }

    pub fn ring_doorbell(&mut self, value: u64) {
        self.doorbell = value;
    }

    /// Raw bytes of the packet with dispatch id `id`, if it is between the read and write ids.
    pub fn bytes_at(&self, id: u64) -> Option<&[u8]> {
        (id >= self.read_id && id < self.write_id).then(|| &self.bytes[self.slot(id)])
    }

    /// Whether the slot's header has been stored (is not INVALID).
    pub fn is_published(&self, id: u64) -> bool {
        self.bytes_at(id).is_some_and(|b| b[0] != TYPE_INVALID)
    }

    /// Retires the packet at the read id: its header goes back to INVALID so that the slot can
    /// be reused, and the read id moves on. Only the packet processor calls this.
    pub fn retire(&mut self) {
        if self.read_id < self.write_id {
            let at = self.slot(self.read_id).start;
            self.bytes[at] = TYPE_INVALID;
            self.bytes[at + 1] = 0;
            self.read_id += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aql::{Header, KernelDispatch};

    #[test]
    fn sizes_must_be_powers_of_two() {
        assert_eq!(Ring::new(100).unwrap_err(), RingError::Size(100));
        assert!(Ring::new(256).is_ok());
    }

    #[test]
    fn a_packet_is_invisible_until_its_header_is_stored() {
        let mut r = Ring::new(4).unwrap();
        let p = Packet::Dispatch(KernelDispatch::linear(1, 2, 64, 1));
        let id = r.reserve_and_write_body(&p).unwrap();
        assert!(!r.is_published(id));
        r.publish(id, Header::dispatch().encode()).unwrap();
        r.ring_doorbell(id);
        assert!(r.is_published(id));
        assert_eq!(Packet::decode(r.bytes_at(id).unwrap()), Ok(p));
        assert_eq!(r.pending(), 1);
        r.retire();
        assert_eq!((r.read_id(), r.write_id(), r.pending()), (1, 1, 0));
    }

    #[test]
    fn ids_keep_growing_past_the_ring_size_and_a_full_ring_refuses() {
        let mut r = Ring::new(2).unwrap();
        let p = Packet::Dispatch(KernelDispatch::linear(1, 1, 64, 1));
        for round in 0..5u64 {
            let a = r.reserve_and_write_body(&p).unwrap();
            let b = r.reserve_and_write_body(&p).unwrap();
            assert_eq!((a, b), (2 * round, 2 * round + 1));
            assert!(matches!(
                r.reserve_and_write_body(&p),
                Err(RingError::Full { .. })
            ));
            r.retire();
            r.retire();
        }
        assert!(r.publish(3, 0).is_err());
    }
}
