//! A set of up to 128 bits shared between processes: the board's active queues and a slot's
//! stopping and lifting queues.

use std::sync::atomic::{AtomicU64, Ordering};

/// A set of up to 128 bits in two atomic words. Every bit means something on its own, so
/// reading the words one after the other is as good as reading them at once.
#[repr(C)]
#[derive(Default)]
pub struct Bits([AtomicU64; 2]);

impl Bits {
    pub fn load(&self) -> u128 {
        u128::from(self.0[0].load(Ordering::SeqCst))
            | (u128::from(self.0[1].load(Ordering::SeqCst)) << 64)
    }

    pub fn store(&self, v: u128) {
        self.0[0].store(v as u64, Ordering::SeqCst);
        self.0[1].store((v >> 64) as u64, Ordering::SeqCst);
    }

    fn word(&self, bit: u32) -> (&AtomicU64, u64) {
        (&self.0[(bit as usize / 64) & 1], 1u64 << (bit % 64))
    }

    /// Sets `bit`; returns whether it was clear.
    pub fn set(&self, bit: u32) -> bool {
        let (w, m) = self.word(bit);
        w.fetch_or(m, Ordering::SeqCst) & m == 0
    }

    /// Clears `bit`; returns whether it was set.
    pub fn clear(&self, bit: u32) -> bool {
        let (w, m) = self.word(bit);
        w.fetch_and(!m, Ordering::SeqCst) & m != 0
    }

    pub fn is_set(&self, bit: u32) -> bool {
        let (w, m) = self.word(bit);
        w.load(Ordering::SeqCst) & m != 0
    }

    /// The one-bit mask of `bit`.
    pub fn mask(bit: u32) -> u128 {
        1u128 << (bit % 128)
    }
}
