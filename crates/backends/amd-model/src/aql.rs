//! AQL packets: 64 bytes each, little-endian, with the HSA header layout
//! type [0..8), barrier [8], acquire fence scope [9..11), release fence scope [11..13),
//! reserved [13..16).
//!
//! The model keeps packets as real bytes in the ring, so the packet processor decodes what the
//! producer wrote and rejects what it cannot trust instead of guessing.

use thiserror::Error;

pub const PACKET_BYTES: usize = 64;

pub const TYPE_INVALID: u8 = 0;
pub const TYPE_VENDOR_SPECIFIC: u8 = 1;
pub const TYPE_KERNEL_DISPATCH: u8 = 2;
pub const TYPE_BARRIER_AND: u8 = 3;
pub const TYPE_AGENT_DISPATCH: u8 = 4;
pub const TYPE_BARRIER_OR: u8 = 5;

const BARRIER_BIT: u16 = 8;
const ACQUIRE_SHIFT: u16 = 9;
const RELEASE_SHIFT: u16 = 11;
const RESERVED_MASK: u16 = 0b111 << 13;

/// The model tracks each workgroup of a dispatch; this bounds what one packet can make it hold.
pub const MAX_WORKGROUPS: u64 = 1 << 24;

/// A signal handle of 0 means "no signal" in HSA.
pub const NO_SIGNAL: u64 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceScope {
    None = 0,
    Agent = 1,
    System = 2,
}

impl FenceScope {
    fn from_bits(bits: u16) -> Result<Self, AqlError> {
        match bits {
            0 => Ok(Self::None),
            1 => Ok(Self::Agent),
            2 => Ok(Self::System),
            other => Err(AqlError::FenceScope(other as u8)),
        }
    }
}

/// The 16-bit packet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    pub packet_type: u8,
    pub barrier: bool,
    pub acquire: FenceScope,
    pub release: FenceScope,
}

impl Header {
    /// What HIP writes for an in-order stream: the barrier bit keeps kernels of one queue in
    /// submission order, and agent-scope fences make results visible to the next kernel.
    pub fn dispatch() -> Self {
        Self {
            packet_type: TYPE_KERNEL_DISPATCH,
            barrier: true,
            acquire: FenceScope::Agent,
            release: FenceScope::Agent,
        }
    }

    pub fn barrier_and() -> Self {
        Self {
            packet_type: TYPE_BARRIER_AND,
            ..Self::dispatch()
        }
    }

    pub fn encode(self) -> u16 {
        u16::from(self.packet_type)
            | (u16::from(self.barrier) << BARRIER_BIT)
            | ((self.acquire as u16) << ACQUIRE_SHIFT)
            | ((self.release as u16) << RELEASE_SHIFT)
    }

    pub fn decode(raw: u16) -> Result<Self, AqlError> {
        if raw & RESERVED_MASK != 0 {
            return Err(AqlError::ReservedHeaderBits(raw));
        }
        Ok(Self {
            packet_type: (raw & 0xff) as u8,
            barrier: raw & (1 << BARRIER_BIT) != 0,
            acquire: FenceScope::from_bits((raw >> ACQUIRE_SHIFT) & 0b11)?,
            release: FenceScope::from_bits((raw >> RELEASE_SHIFT) & 0b11)?,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelDispatch {
    pub header: Header,
    /// Grid dimensions, 1 to 3 (setup bits 0..2).
    pub dimensions: u8,
    pub workgroup_size: [u16; 3],
    pub grid_size: [u32; 3],
    pub private_segment_size: u32,
    pub group_segment_size: u32,
    pub kernel_object: u64,
    pub kernarg_address: u64,
    pub completion_signal: u64,
}

impl KernelDispatch {
    /// A one-dimensional dispatch of `workgroups` groups of `wg_threads` threads.
    pub fn linear(kernel_object: u64, workgroups: u32, wg_threads: u16, signal: u64) -> Self {
        Self {
            header: Header::dispatch(),
            dimensions: 1,
            workgroup_size: [wg_threads, 1, 1],
            grid_size: [workgroups.saturating_mul(u32::from(wg_threads)), 1, 1],
            private_segment_size: 0,
            group_segment_size: 0,
            kernel_object,
            kernarg_address: 0,
            completion_signal: signal,
        }
    }

    /// Workgroups in the grid (grid sizes are in work-items, as in HSA).
    pub fn workgroups(&self) -> u64 {
        (0..3)
            .map(|i| {
                let wg = u64::from(self.workgroup_size[i]);
                u64::from(self.grid_size[i]).div_ceil(wg)
            })
            .product()
    }

    pub fn threads_per_workgroup(&self) -> u32 {
        self.workgroup_size.iter().map(|&d| u32::from(d)).product()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BarrierAnd {
    pub header: Header,
    pub dep_signals: [u64; 5],
    pub completion_signal: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Packet {
    Dispatch(KernelDispatch),
    Barrier(BarrierAnd),
}

impl Packet {
    pub fn header(&self) -> Header {
        match self {
            Packet::Dispatch(d) => d.header,
            Packet::Barrier(b) => b.header,
        }
    }

    pub fn completion_signal(&self) -> u64 {
        match self {
            Packet::Dispatch(d) => d.completion_signal,
            Packet::Barrier(b) => b.completion_signal,
        }
    }

    /// The packet's bytes with the header left INVALID: the producer writes the body first and
    /// publishes by storing the header last (see [`crate::ring::Ring::publish`]).
    pub fn encode_body(&self) -> [u8; PACKET_BYTES] {
        let mut b = [0u8; PACKET_BYTES];
        match self {
            Packet::Dispatch(d) => {
                let setup = u16::from(d.dimensions);
                b[2..4].copy_from_slice(&setup.to_le_bytes());
                for i in 0..3 {
                    b[4 + 2 * i..6 + 2 * i].copy_from_slice(&d.workgroup_size[i].to_le_bytes());
                    b[12 + 4 * i..16 + 4 * i].copy_from_slice(&d.grid_size[i].to_le_bytes());
                }
                b[24..28].copy_from_slice(&d.private_segment_size.to_le_bytes());
                b[28..32].copy_from_slice(&d.group_segment_size.to_le_bytes());
                b[32..40].copy_from_slice(&d.kernel_object.to_le_bytes());
                b[40..48].copy_from_slice(&d.kernarg_address.to_le_bytes());
                b[56..64].copy_from_slice(&d.completion_signal.to_le_bytes());
            }
            Packet::Barrier(p) => {
                for (i, s) in p.dep_signals.iter().enumerate() {
                    b[8 + 8 * i..16 + 8 * i].copy_from_slice(&s.to_le_bytes());
                }
                b[56..64].copy_from_slice(&p.completion_signal.to_le_bytes());
            }
        }
        b
    }

    /// All 64 bytes, header included.
    pub fn encode(&self) -> [u8; PACKET_BYTES] {
        let mut b = self.encode_body();
        b[0..2].copy_from_slice(&self.header().encode().to_le_bytes());
        b
    }

    /// Decodes and validates one published packet.
    pub fn decode(bytes: &[u8]) -> Result<Self, AqlError> {
        let b: &[u8; PACKET_BYTES] = bytes
            .try_into()
            .map_err(|_| AqlError::Length(bytes.len()))?;
        let header = Header::decode(u16_at(b, 0))?;
        match header.packet_type {
            TYPE_INVALID => Err(AqlError::NotPublished),
            TYPE_KERNEL_DISPATCH => decode_dispatch(header, b).map(Packet::Dispatch),
            TYPE_BARRIER_AND => Ok(Packet::Barrier(BarrierAnd {
                header,
                dep_signals: std::array::from_fn(|i| u64_at(b, 8 + 8 * i)),
                completion_signal: u64_at(b, 56),
            })),
            other => Err(AqlError::UnsupportedType(other)),
        }
    }
}

fn decode_dispatch(header: Header, b: &[u8; PACKET_BYTES]) -> Result<KernelDispatch, AqlError> {
    let setup = u16_at(b, 2);
    let dimensions = (setup & 0b11) as u8;
    if !(1..=3).contains(&dimensions) || setup >> 2 != 0 {
        return Err(AqlError::Setup(setup));
    }
    let d = KernelDispatch {
        header,
        dimensions,
        workgroup_size: std::array::from_fn(|i| u16_at(b, 4 + 2 * i)),
        grid_size: std::array::from_fn(|i| u32_at(b, 12 + 4 * i)),
        private_segment_size: u32_at(b, 24),
        group_segment_size: u32_at(b, 28),
        kernel_object: u64_at(b, 32),
        kernarg_address: u64_at(b, 40),
        completion_signal: u64_at(b, 56),
    };
    if u16_at(b, 10) != 0 || u64_at(b, 48) != 0 {
        return Err(AqlError::ReservedField);
    }
    for i in 0..3 {
        let used = i < usize::from(dimensions);
        let (wg, grid) = (d.workgroup_size[i], d.grid_size[i]);
        // Unused dimensions must be 1 (HSA); used ones must be non-empty.
        if (used && (wg == 0 || grid == 0)) || (!used && (wg != 1 || grid != 1)) {
            return Err(AqlError::Geometry {
                dim: i as u8,
                workgroup: wg,
                grid,
            });
        }
    }
    if d.kernel_object == 0 {
        return Err(AqlError::NullKernelObject);
    }
    Ok(d)
}

fn u16_at(b: &[u8; PACKET_BYTES], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8; PACKET_BYTES], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8; PACKET_BYTES], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AqlError {
    #[error("an AQL packet is 64 bytes, got {0}")]
    Length(usize),
    #[error("header type is INVALID: the slot has not been published")]
    NotPublished,
    #[error("packet type {0} is not supported by this packet processor")]
    UnsupportedType(u8),
    #[error("reserved header bits 13..16 are set (header {0:#06x})")]
    ReservedHeaderBits(u16),
    #[error("fence scope {0} is reserved (0 none, 1 agent, 2 system)")]
    FenceScope(u8),
    #[error("setup {0:#06x}: dimensions must be 1..=3 and the other bits zero")]
    Setup(u16),
    #[error(
        "dimension {dim}: workgroup size {workgroup} and grid size {grid} are not a valid geometry"
    )]
    Geometry { dim: u8, workgroup: u16, grid: u32 },
    #[error("reserved packet fields are not zero")]
    ReservedField,
    #[error("{0} workgroups in one dispatch: the model accepts at most {MAX_WORKGROUPS}")]
    TooManyWorkgroups(u64),
    #[error("kernel object is null")]
    NullKernelObject,
    #[error("kernel object {0:#x} is not a loaded code object")]
    UnknownKernelObject(u64),
    #[error("completion signal {0:#x} does not exist")]
    UnknownSignal(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bits_sit_where_hsa_puts_them() {
        let h = Header {
            packet_type: TYPE_KERNEL_DISPATCH,
            barrier: true,
            acquire: FenceScope::System,
            release: FenceScope::Agent,
        };
        assert_eq!(h.encode(), 2 | (1 << 8) | (2 << 9) | (1 << 11));
        assert_eq!(Header::decode(h.encode()), Ok(h));
    }

    #[test]
    fn packets_round_trip_through_bytes() {
        let d = Packet::Dispatch(KernelDispatch::linear(0x1000, 640, 256, 7));
        let bytes = d.encode();
        assert_eq!(bytes.len(), 64);
        assert_eq!(Packet::decode(&bytes), Ok(d));
        if let Packet::Dispatch(k) = d {
            assert_eq!(k.workgroups(), 640);
        }
        let b = Packet::Barrier(BarrierAnd {
            header: Header::barrier_and(),
            dep_signals: [1, 0, 0, 0, 0],
            completion_signal: 9,
        });
        assert_eq!(Packet::decode(&b.encode()), Ok(b));
    }

    #[test]
    fn malformed_bytes_are_rejected() {
        let good = Packet::Dispatch(KernelDispatch::linear(0x1000, 4, 64, 1)).encode();
        let mut bad = good;
        bad[0] = 0x07;
        assert_eq!(Packet::decode(&bad), Err(AqlError::UnsupportedType(7)));
        let mut bad = good;
        bad[1] |= 0x20; // bit 13
        assert!(matches!(
            Packet::decode(&bad),
            Err(AqlError::ReservedHeaderBits(_))
        ));
        let mut bad = good;
        bad[1] = (bad[1] & !0x06) | (3 << 1); // acquire scope 3
        assert_eq!(Packet::decode(&bad), Err(AqlError::FenceScope(3)));
        let mut bad = good;
        bad[2] = 0; // zero dimensions
        assert_eq!(Packet::decode(&bad), Err(AqlError::Setup(0)));
        let mut bad = good;
        bad[4] = 0;
        bad[5] = 0; // workgroup x = 0
        assert!(matches!(
            Packet::decode(&bad),
            Err(AqlError::Geometry { dim: 0, .. })
        ));
        let mut bad = good;
        bad[32..40].fill(0);
        assert_eq!(Packet::decode(&bad), Err(AqlError::NullKernelObject));
        assert_eq!(Packet::decode(&good[..63]), Err(AqlError::Length(63)));
        let mut unpublished = good;
        unpublished[0] = 0;
        unpublished[1] = 0;
        assert_eq!(Packet::decode(&unpublished), Err(AqlError::NotPublished));
    }
}
