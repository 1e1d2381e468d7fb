//! Hash and array maps, sized from the object's definitions.
//!
//! Values live in one arena per map, allocated in full when the map is created and never moved
//! (like Linux's preallocated maps), so a value pointer handed to a program stays valid for the
//! whole call, and the VM can be told one address range per map. The arena is only ever touched
//! through `Vec::as_mut_ptr`, which does not assert uniqueness over the buffer, because a running
//! program holds raw pointers into it while helpers run.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;
use thiserror::Error;

pub const MAP_TYPE_HASH: u32 = 1;
pub const MAP_TYPE_ARRAY: u32 = 2;

pub const UPDATE_ANY: u64 = 0;
pub const UPDATE_NOEXIST: u64 = 1;
pub const UPDATE_EXIST: u64 = 2;

/// Largest key and value we accept: enough for any policy struct, small enough that a bad
/// definition cannot make us allocate gigabytes.
pub const MAX_KEY_SIZE: u32 = 512;
pub const MAX_VALUE_SIZE: u32 = 4096;
pub const MAX_ENTRIES: u32 = 1 << 20;
pub const MAX_MAP_BYTES: u64 = 64 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MapKind {
    Hash,
    Array,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapDef {
    pub name: String,
    pub kind: MapKind,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MapError {
    #[error("map `{0}`: unknown map type {1} (supported: 1 = hash, 2 = array)")]
    Type(String, u32),
    #[error("map `{name}`: {what}")]
    Size { name: String, what: String },
    #[error("map `{name}`: key is {got} bytes, the map's keys are {want}")]
    KeySize { name: String, got: usize, want: u32 },
    #[error("map `{name}`: value is {got} bytes, the map's values are {want}")]
    ValueSize { name: String, got: usize, want: u32 },
    #[error("map `{0}`: no such key")]
    NotFound(String),
    #[error("map `{0}`: the key exists (update with NOEXIST)")]
    Exists(String),
    #[error("map `{0}`: full")]
    Full(String),
    #[error("map `{name}`: index {index} is out of range (max_entries {max})")]
    Index { name: String, index: u32, max: u32 },
    #[error("map `{0}`: array elements cannot be deleted")]
    ArrayDelete(String),
    #[error("map `{0}`: bad update flags {1}")]
    Flags(String, u64),
}

impl MapError {
    /// The negative errno a helper returns for this error (Linux's numbers).
    pub fn errno(&self) -> i64 {
        match self {
            MapError::NotFound(_) => -2,
            MapError::Exists(_) => -17,
            MapError::Full(_) => -7,
            _ => -22,
        }
    }
}

impl MapDef {
    pub fn validate(&self) -> Result<(), MapError> {
        let bad = |what: String| MapError::Size {
            name: self.name.clone(),
            what,
        };
        if self.key_size == 0 || self.key_size > MAX_KEY_SIZE {
            return Err(bad(format!(
                "key size {} not in 1..={MAX_KEY_SIZE}",
                self.key_size
            )));
        }
        if self.value_size == 0 || self.value_size > MAX_VALUE_SIZE {
            return Err(bad(format!(
                "value size {} not in 1..={MAX_VALUE_SIZE}",
                self.value_size
            )));
        }
        if self.max_entries == 0 || self.max_entries > MAX_ENTRIES {
            return Err(bad(format!(
                "max_entries {} not in 1..={MAX_ENTRIES}",
                self.max_entries
            )));
        }
        if self.kind == MapKind::Array && self.key_size != 4 {
            return Err(bad(format!(
                "array keys are 4-byte indices, not {} bytes",
                self.key_size
            )));
        }
        let bytes = self.max_entries as u64 * (self.value_size as u64 + self.key_size as u64);
        if bytes > MAX_MAP_BYTES {
            return Err(bad(format!(
                "needs {bytes} bytes, more than {MAX_MAP_BYTES}"
            )));
        }
        Ok(())
    }
}

#[derive(Debug)]
pub struct Map {
    def: MapDef,
    /// max_entries × value_size bytes; never reallocated.
    values: Vec<u8>,
    /// Hash maps: key → slot. Arrays: unused.
    index: HashMap<Box<[u8]>, u32>,
    free: Vec<u32>,
}

impl Map {
    pub fn new(def: MapDef) -> Result<Self, MapError> {
        def.validate()?;
        let values = vec![0u8; def.max_entries as usize * def.value_size as usize];
        let free = match def.kind {
            MapKind::Hash => (0..def.max_entries).rev().collect(),
            MapKind::Array => Vec::new(),
        };
        Ok(Self {
            def,
            values,
            index: HashMap::new(),
            free,
        })
    }

    pub fn def(&self) -> &MapDef {
        &self.def
    }

    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The address range of the value arena (what the VM may load from and store to).
    pub fn value_region(&mut self) -> Range<u64> {
        let start = self.values.as_mut_ptr() as u64;
        start..start + self.values.len() as u64
    }

    fn check_key(&self, key: &[u8]) -> Result<(), MapError> {
        if key.len() != self.def.key_size as usize {
            return Err(MapError::KeySize {
                name: self.def.name.clone(),
                got: key.len(),
                want: self.def.key_size,
            });
        }
        Ok(())
    }

    fn slot(&self, key: &[u8]) -> Result<Option<u32>, MapError> {
        self.check_key(key)?;
        Ok(match self.def.kind {
            MapKind::Hash => self.index.get(key).copied(),
            MapKind::Array => {
                let i = u32::from_le_bytes([key[0], key[1], key[2], key[3]]);
                (i < self.def.max_entries).then_some(i)
            }
        })
    }

    /// Pointer to the value stored under `key`, for the lookup helper.
    pub fn lookup_ptr(&mut self, key: &[u8]) -> Option<*mut u8> {
        let slot = self.slot(key).ok()??;
        let off = slot as usize * self.def.value_size as usize;
        // SAFETY: slot < max_entries, so off + value_size <= values.len().
        Some(unsafe { self.values.as_mut_ptr().add(off) })
    }

    pub fn get(&self, key: &[u8]) -> Result<Vec<u8>, MapError> {
        let slot = self
            .slot(key)?
            .ok_or_else(|| MapError::NotFound(self.def.name.clone()))?;
        let vs = self.def.value_size as usize;
        let off = slot as usize * vs;
        Ok(self.values[off..off + vs].to_vec())
    }

    pub fn update(&mut self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        if value.len() != self.def.value_size as usize {
            return Err(MapError::ValueSize {
                name: self.def.name.clone(),
                got: value.len(),
                want: self.def.value_size,
            });
        }
        // SAFETY: value is a valid slice of value_size bytes (it may point into this map's
        // arena; `update_raw` copies with overlap allowed).
        unsafe { self.update_raw(key, value.as_ptr(), flags) }
    }

    /// Update from a raw value pointer: the helper's path, where the value may live in this
    /// very arena.
    ///
    /// # Safety
    /// `value` must be readable for `value_size` bytes.
    pub unsafe fn update_raw(
        &mut self,
        key: &[u8],
        value: *const u8,
        flags: u64,
    ) -> Result<(), MapError> {
        if flags > UPDATE_EXIST {
            return Err(MapError::Flags(self.def.name.clone(), flags));
        }
        let existing = self.slot(key)?;
        let slot = match (self.def.kind, existing) {
            (_, Some(_)) if flags == UPDATE_NOEXIST => {
                return Err(MapError::Exists(self.def.name.clone()));
            }
            (_, Some(s)) => s,
            (MapKind::Array, None) => {
                return Err(MapError::Index {
                    name: self.def.name.clone(),
                    index: u32::from_le_bytes([key[0], key[1], key[2], key[3]]),
                    max: self.def.max_entries,
                });
            }
            (MapKind::Hash, None) if flags == UPDATE_EXIST => {
                return Err(MapError::NotFound(self.def.name.clone()));
            }
            (MapKind::Hash, None) => {
                let s = self
                    .free
                    .pop()
                    .ok_or_else(|| MapError::Full(self.def.name.clone()))?;
                self.index.insert(key.into(), s);
                s
            }
        };
        let vs = self.def.value_size as usize;
        // SAFETY: slot < max_entries; the caller guarantees `value` is readable for vs bytes;
        // ptr::copy allows the source to overlap the destination.
        unsafe {
            std::ptr::copy(value, self.values.as_mut_ptr().add(slot as usize * vs), vs);
        }
        Ok(())
    }

    pub fn delete(&mut self, key: &[u8]) -> Result<(), MapError> {
        self.check_key(key)?;
        if self.def.kind == MapKind::Array {
            return Err(MapError::ArrayDelete(self.def.name.clone()));
        }
        let slot = self
            .index
            .remove(key)
            .ok_or_else(|| MapError::NotFound(self.def.name.clone()))?;
        let vs = self.def.value_size as usize;
        let off = slot as usize * vs;
        // A reused slot starts zeroed, as a fresh element would. Written through the raw
        // pointer: a program may hold pointers into the arena while this helper runs.
        // SAFETY: slot < max_entries, so off + vs <= values.len().
        unsafe { std::ptr::write_bytes(self.values.as_mut_ptr().add(off), 0, vs) };
        self.free.push(slot);
        Ok(())
    }

    /// Every entry, sorted by key (arrays: every index).
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let vs = self.def.value_size as usize;
        let value = |slot: u32| self.values[slot as usize * vs..(slot as usize + 1) * vs].to_vec();
        match self.def.kind {
            MapKind::Array => (0..self.def.max_entries)
                .map(|i| (i.to_le_bytes().to_vec(), value(i)))
                .collect(),
            MapKind::Hash => {
                let mut v: Vec<_> = self
                    .index
                    .iter()
                    .map(|(k, &s)| (k.to_vec(), value(s)))
                    .collect();
                v.sort();
                v
            }
        }
    }

    pub fn len(&self) -> usize {
        match self.def.kind {
            MapKind::Array => self.def.max_entries as usize,
            MapKind::Hash => self.index.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A map's definition and contents as a file stores them (the CLI's pinned maps).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapSnapshot {
    pub def: MapDef,
    /// (key, value) as lowercase hex.
    pub entries: Vec<(String, String)>,
}

impl MapSnapshot {
    pub fn of(map: &Map) -> Self {
        Self {
            def: map.def.clone(),
            entries: map
                .entries()
                .into_iter()
                .map(|(k, v)| (to_hex(&k), to_hex(&v)))
                .collect(),
        }
    }

    /// Loads the entries into `map`, whose definition must match (a recompiled object with a
    /// different layout starts empty rather than misreading old bytes).
    pub fn restore_into(&self, map: &mut Map) -> Result<(), SnapshotError> {
        if self.def != map.def {
            return Err(SnapshotError::Definition {
                pinned: self.def.clone(),
                object: map.def.clone(),
            });
        }
        for (k, v) in &self.entries {
            let hex = |source| SnapshotError::Hex {
                name: self.def.name.clone(),
                source,
            };
            let (k, v) = (from_hex(k).map_err(hex)?, from_hex(v).map_err(hex)?);
            map.update(&k, &v, UPDATE_ANY)
                .map_err(|source| SnapshotError::Entry {
                    name: self.def.name.clone(),
                    source,
                })?;
        }
        Ok(())
    }
}

/// Why a pinned snapshot cannot be loaded into a map.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    #[error(
        "pinned map `{}` has a different definition ({pinned:?} vs {object:?})",
        .object.name
    )]
    Definition { pinned: MapDef, object: MapDef },
    #[error("pinned map `{name}`: an entry is not valid hex")]
    Hex {
        name: String,
        #[source]
        source: HexError,
    },
    #[error("pinned map `{name}`: an entry does not fit the map")]
    Entry {
        name: String,
        #[source]
        source: MapError,
    },
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HexError {
    #[error("hex `{0}` has an odd number of digits")]
    OddLength(String),
    #[error("hex `{0}` has characters that are not hex digits")]
    NotAscii(String),
    #[error("hex `{text}`: `{byte}` is not a hex byte")]
    Digit {
        text: String,
        byte: String,
        #[source]
        source: std::num::ParseIntError,
    },
}

pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn from_hex(s: &str) -> Result<Vec<u8>, HexError> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    // Checked first: slicing by two bytes below would split a multi-byte character.
    if !s.is_ascii() {
        return Err(HexError::NotAscii(s.to_string()));
    }
    if !s.len().is_multiple_of(2) {
        return Err(HexError::OddLength(s.to_string()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            let byte = &s[i..i + 2];
            u8::from_str_radix(byte, 16).map_err(|source| HexError::Digit {
                text: s.to_string(),
                byte: byte.to_string(),
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(kind: MapKind, key_size: u32, max: u32) -> MapDef {
        MapDef {
            name: "m".into(),
            kind,
            key_size,
            value_size: 8,
            max_entries: max,
            flags: 0,
        }
    }

    #[test]
    fn hash_update_flags_and_capacity() {
        let mut m = Map::new(def(MapKind::Hash, 8, 2)).unwrap();
        let k = |i: u64| i.to_le_bytes();
        m.update(&k(1), &7u64.to_le_bytes(), UPDATE_ANY).unwrap();
        assert_eq!(m.get(&k(1)).unwrap(), 7u64.to_le_bytes());
        assert!(matches!(
            m.update(&k(1), &[0; 8], UPDATE_NOEXIST),
            Err(MapError::Exists(_))
        ));
        assert!(matches!(
            m.update(&k(2), &[0; 8], UPDATE_EXIST),
            Err(MapError::NotFound(_))
        ));
        m.update(&k(2), &[1; 8], UPDATE_ANY).unwrap();
        assert!(matches!(
            m.update(&k(3), &[0; 8], UPDATE_ANY),
            Err(MapError::Full(_))
        ));
        m.delete(&k(1)).unwrap();
        m.update(&k(3), &[2; 8], UPDATE_ANY).unwrap();
        assert_eq!(m.entries().len(), 2);
        assert!(matches!(m.get(&k(1)), Err(MapError::NotFound(_))));
        assert!(matches!(m.get(&[1, 2]), Err(MapError::KeySize { .. })));
    }

    #[test]
    fn array_is_indexed_and_bounded() {
        let mut m = Map::new(def(MapKind::Array, 4, 3)).unwrap();
        m.update(&2u32.to_le_bytes(), &9u64.to_le_bytes(), UPDATE_ANY)
            .unwrap();
        assert_eq!(m.get(&2u32.to_le_bytes()).unwrap(), 9u64.to_le_bytes());
        assert!(matches!(
            m.update(&3u32.to_le_bytes(), &[0; 8], 0),
            Err(MapError::Index { .. })
        ));
        assert!(matches!(
            m.delete(&0u32.to_le_bytes()),
            Err(MapError::ArrayDelete(_))
        ));
        assert_eq!(m.entries().len(), 3);
    }

    #[test]
    fn bad_definitions_are_refused() {
        assert!(Map::new(def(MapKind::Array, 8, 1)).is_err());
        assert!(Map::new(def(MapKind::Hash, 8, 0)).is_err());
        assert!(Map::new(def(MapKind::Hash, 8, u32::MAX)).is_err());
    }

    #[test]
    fn snapshot_round_trips() {
        let mut m = Map::new(def(MapKind::Hash, 8, 4)).unwrap();
        m.update(&5u64.to_le_bytes(), &6u64.to_le_bytes(), 0)
            .unwrap();
        let snap = MapSnapshot::of(&m);
        let mut m2 = Map::new(def(MapKind::Hash, 8, 4)).unwrap();
        snap.restore_into(&mut m2).unwrap();
        assert_eq!(m2.entries(), m.entries());
        let mut other = Map::new(def(MapKind::Hash, 4, 4)).unwrap();
        assert!(matches!(
            snap.restore_into(&mut other),
            Err(SnapshotError::Definition { .. })
        ));
    }

    #[test]
    fn hex_errors_say_what_is_wrong() {
        assert_eq!(from_hex("0x0aff").unwrap(), vec![10, 255]);
        assert!(matches!(from_hex("abc"), Err(HexError::OddLength(_))));
        assert!(matches!(from_hex("zz"), Err(HexError::Digit { .. })));
        assert!(matches!(from_hex("é0"), Err(HexError::NotAscii(_))));
    }
}
