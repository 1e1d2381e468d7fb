//! Reads a policy object built by `clang -target bpf`: one program per hook section, the map
//! definitions of the legacy `maps` section, and the relocations that make `ld_imm64` point at
//! a map.
//!
//! A relocated map reference becomes `ld_imm64 rX, <map index>` with the source register set to
//! 1 (`BPF_PSEUDO_MAP_FD`, as Linux marks it), so the verifier can tell a map from a number.
//! The interpreter ignores the source register of `ld_imm64`; the map helpers take the index.

use crate::ctx::Hook;
use crate::maps::{MAP_TYPE_ARRAY, MAP_TYPE_HASH, MapDef, MapKind};
use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionKind};
use thiserror::Error;

pub const MAPS_SECTION: &str = "maps";
/// Size of `struct xp_map_def`.
pub const MAP_DEF_SIZE: usize = 20;
pub const INSN_SIZE: usize = 8;
pub const LD_DW_IMM: u8 = 0x18;
pub const PSEUDO_MAP: u8 = 1;

#[derive(Debug, Error)]
pub enum ElfError {
    #[error("not an ELF object")]
    Parse(#[source] object::Error),
    #[error("not an ELF object: a {0:?} file")]
    Format(object::BinaryFormat),
    #[error("not an eBPF object (machine {0}); build it with `clang -target bpf`")]
    Machine(String),
    #[error(
        "section `{0}` holds code but is not a hook; program sections must be one of \
         xpreempt/task_init, xpreempt/schedule, xpreempt/work_submit, xpreempt/task_destroy"
    )]
    WrongSection(String),
    #[error("section `{0}` appears twice")]
    DuplicateSection(String),
    #[error(
        "the object has no program in any hook section (xpreempt/task_init, xpreempt/schedule, xpreempt/work_submit, xpreempt/task_destroy)"
    )]
    NoPrograms,
    #[error("section `{section}`: its size {size} is not a multiple of 8-byte instructions")]
    Truncated { section: String, size: usize },
    #[error("map `{name}`: its definition is {size} bytes, `struct xp_map_def` is {MAP_DEF_SIZE}")]
    MapDefSize { name: String, size: u64 },
    #[error("map `{name}`: unknown map type {ty} (1 = hash, 2 = array)")]
    MapType { name: String, ty: u32 },
    #[error("map `{0}` is defined twice")]
    DuplicateMap(String),
    #[error("{hook}: instruction {insn}: {what}")]
    Relocation {
        hook: Hook,
        insn: usize,
        what: String,
    },
}

/// One hook's code, relocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramCode {
    pub hook: Hook,
    pub code: Vec<u8>,
}

/// What an object file declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BpfObject {
    pub maps: Vec<MapDef>,
    pub programs: Vec<ProgramCode>,
}

impl BpfObject {
    pub fn program(&self, hook: Hook) -> Option<&ProgramCode> {
        self.programs.iter().find(|p| p.hook == hook)
    }
}

fn err(e: object::Error) -> ElfError {
    ElfError::Parse(e)
}

/// Parses and relocates an object file's bytes.
pub fn parse(data: &[u8]) -> Result<BpfObject, ElfError> {
    let file = object::File::parse(data).map_err(err)?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(ElfError::Format(file.format()));
    }
    if file.architecture() != object::Architecture::Bpf || !file.is_little_endian() {
        return Err(ElfError::Machine(format!(
            "{:?}, {}",
            file.architecture(),
            if file.is_little_endian() {
                "little-endian"
            } else {
                "big-endian"
            }
        )));
    }
    let (maps, map_symbols) = read_maps(&file)?;

    let mut programs: Vec<ProgramCode> = Vec::new();
    for section in file.sections() {
        let name = section.name().map_err(err)?;
        let hook = Hook::from_section(name);
        let is_code = section.kind() == SectionKind::Text || name.starts_with("xpreempt/");
        if !is_code || section.size() == 0 {
            continue;
        }
        let Some(hook) = hook else {
            return Err(ElfError::WrongSection(name.to_string()));
        };
        if programs.iter().any(|p| p.hook == hook) {
            return Err(ElfError::DuplicateSection(name.to_string()));
        }
        let mut code = section.data().map_err(err)?.to_vec();
        if !code.len().is_multiple_of(INSN_SIZE) {
            return Err(ElfError::Truncated {
                section: name.to_string(),
                size: code.len(),
            });
        }
        for (offset, reloc) in section.relocations() {
            let insn = offset as usize / INSN_SIZE;
            let fail = |what: String| ElfError::Relocation { hook, insn, what };
            let RelocationTarget::Symbol(sym_index) = reloc.target() else {
                return Err(fail("relocation does not name a symbol".into()));
            };
            let sym = file.symbol_by_index(sym_index).map_err(err)?;
            let sym_name = sym.name().unwrap_or("?").to_string();
            let at = offset as usize;
            if !at.is_multiple_of(INSN_SIZE)
                || at
                    .checked_add(2 * INSN_SIZE)
                    .is_none_or(|end| end > code.len())
            {
                return Err(fail(format!(
                    "relocation for `{sym_name}` at an odd offset"
                )));
            }
            if code[at] != LD_DW_IMM {
                let what = if code[at] == 0x85 {
                    format!(
                        "calls `{sym_name}`: calls between BPF functions are not supported (make it `static inline`)"
                    )
                } else {
                    format!(
                        "relocation for `{sym_name}` on opcode {:#04x}, not ld_imm64",
                        code[at]
                    )
                };
                return Err(fail(what));
            }
            let Some(&map_index) = map_symbols
                .iter()
                .find(|(idx, _)| *idx == sym_index)
                .map(|(_, m)| m)
            else {
                let section = sym
                    .section_index()
                    .and_then(|i| file.section_by_index(i).ok())
                    .and_then(|s| s.name().ok().map(str::to_string))
                    .unwrap_or_else(|| "?".into());
                return Err(fail(format!(
                    "refers to `{sym_name}` in section `{section}`: only maps (section `maps`) \
                     may be referenced; global variables and constant strings are not supported"
                )));
            };
            // dst register kept; source register := PSEUDO_MAP; imm := map index.
            code[at + 1] = (code[at + 1] & 0x0f) | (PSEUDO_MAP << 4);
            code[at + 4..at + 8].copy_from_slice(&(map_index as u32).to_le_bytes());
            code[at + 12..at + 16].copy_from_slice(&0u32.to_le_bytes());
        }
        programs.push(ProgramCode { hook, code });
    }
    if programs.is_empty() {
        return Err(ElfError::NoPrograms);
    }
    programs.sort_by_key(|p| p.hook);
    Ok(BpfObject { maps, programs })
}

type MapSymbols = Vec<(object::SymbolIndex, usize)>;

fn read_maps(file: &object::File<'_>) -> Result<(Vec<MapDef>, MapSymbols), ElfError> {
    let Some(section) = file.section_by_name(MAPS_SECTION) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let data = section.data().map_err(err)?;
    let mut found: Vec<(u64, object::SymbolIndex, String, u64)> = file
        .symbols()
        .filter(|s| {
            s.section_index() == Some(section.index()) && s.kind() != object::SymbolKind::Section
        })
        .map(|s| {
            (
                s.address(),
                s.index(),
                s.name().unwrap_or("?").to_string(),
                s.size(),
            )
        })
        .collect();
    found.sort_by_key(|f| f.0);
    let mut maps = Vec::new();
    let mut symbols = Vec::new();
    for (addr, index, name, size) in found {
        if size != MAP_DEF_SIZE as u64 {
            return Err(ElfError::MapDefSize { name, size });
        }
        let raw = usize::try_from(addr)
            .ok()
            .and_then(|at| data.get(at..at.checked_add(MAP_DEF_SIZE)?));
        let Some(raw) = raw else {
            return Err(ElfError::MapDefSize { name, size });
        };
        let word = |i: usize| {
            u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]])
        };
        let kind = match word(0) {
            MAP_TYPE_HASH => MapKind::Hash,
            MAP_TYPE_ARRAY => MapKind::Array,
            ty => return Err(ElfError::MapType { name, ty }),
        };
        if maps.iter().any(|m: &MapDef| m.name == name) {
            return Err(ElfError::DuplicateMap(name));
        }
        symbols.push((index, maps.len()));
        maps.push(MapDef {
            name,
            kind,
            key_size: word(1),
            value_size: word(2),
            max_entries: word(3),
            flags: word(4),
        });
    }
    Ok((maps, symbols))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_not_an_object() {
        let e = parse(b"not an elf file at all").unwrap_err();
        assert!(matches!(e, ElfError::Parse(_)), "{e}");
    }
}
