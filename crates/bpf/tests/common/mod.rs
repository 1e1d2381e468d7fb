//! Shared by the integration tests: the objects build.rs compiled.

#![allow(dead_code)]

use xpreempt_bpf::{BpfProgram, LoadOptions};

/// The bytes of a compiled object; fails the test (never skips it) when clang was missing.
pub fn object(name: &str) -> Vec<u8> {
    let path = xpreempt_bpf::built_object(name).unwrap_or_else(|e| panic!("{e}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

pub fn program(name: &str) -> BpfProgram {
    BpfProgram::load(name, &object(name), LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}
