//! Hand-assembled programs: what the verifier must accept and what it must reject, and why.

use super::*;
use crate::maps::{MapDef, MapKind};

fn maps() -> Vec<MapDef> {
    vec![MapDef {
        name: "m".into(),
        kind: MapKind::Hash,
        key_size: 8,
        value_size: 4,
        max_entries: 4,
        flags: 0,
    }]
}

/// Assembles `src`; `lddw rX, map` lines become map references (source register 1).
fn asm(src: &str) -> Vec<u8> {
    let text = src.replace(", map", ", 0");
    let mut code = rbpf::assembler::assemble(&text).expect("test program assembles");
    let mut pc = 0;
    for line in src.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("lddw") && line.ends_with(", map") {
            code[pc * 8 + 1] |= PSEUDO_MAP << 4;
        }
        pc += if line.starts_with("lddw") { 2 } else { 1 };
    }
    code
}

fn check(hook: Hook, src: &str) -> Result<Verified, VerifyError> {
    verify(hook, &asm(src), &maps(), Limits::default())
}

fn rejects(hook: Hook, src: &str, why: &str) -> VerifyError {
    let e = check(hook, src).expect_err("program must be rejected");
    assert!(e.to_string().contains(why), "expected `{why}` in: {e}");
    assert!(
        e.to_string().starts_with(hook.name()),
        "names the hook: {e}"
    );
    e
}

const LOOKUP: &str = "
    ldxdw r2, [r1]
    stxdw [r10-8], r2
    mov64 r2, r10
    add64 r2, -8
    lddw r1, map
    call 1
";

#[test]
fn accepts_a_minimal_program_and_reports_its_longest_path() {
    let v = check(Hook::Schedule, "mov64 r0, 0\nstw [r1+20], 0\nexit").unwrap();
    assert_eq!(
        v,
        Verified {
            insns: 3,
            longest_path: 3
        }
    );
}

#[test]
fn accepts_a_checked_lookup_and_a_backward_jump_that_is_no_loop() {
    let src = format!(
        "{LOOKUP}
        ja +2
        ldxw r3, [r0]
        exit
        jne r0, 0, -3
        exit"
    );
    let v = check(Hook::TaskInit, &src).unwrap();
    assert_eq!(v.insns, 12);
}

#[test]
fn rejects_an_infinite_loop_naming_the_instruction() {
    let e = rejects(Hook::TaskInit, "mov64 r0, 0\nja -1\nexit", "loop");
    assert_eq!(e.insn, 1);
}

#[test]
fn rejects_a_conditional_loop() {
    rejects(
        Hook::TaskInit,
        "mov64 r0, 0\nadd64 r0, 1\njne r0, 100, -2\nexit",
        "loops are not allowed",
    );
}

#[test]
fn rejects_out_of_bounds_context_reads_and_input_writes() {
    let e = rejects(
        Hook::TaskInit,
        "ldxdw r0, [r1+64]\nexit",
        "outside the 64-byte task_init context",
    );
    assert_eq!(e.insn, 0);
    rejects(Hook::WorkSubmit, "ldxw r0, [r1-4]\nexit", "outside");
    rejects(Hook::TaskInit, "stdw [r1+0], 1\nexit", "only the outputs");
    rejects(Hook::TaskDestroy, "stw [r1+8], 1\nexit", "only the outputs");
}

#[test]
fn rejects_out_of_bounds_stack_and_map_value_access() {
    rejects(
        Hook::TaskInit,
        "stxdw [r10+0], r1\nexit",
        "outside the 512-byte stack",
    );
    rejects(
        Hook::TaskInit,
        "ldxdw r0, [r10-520]\nexit",
        "outside the 512-byte stack",
    );
    let src = format!("{LOOKUP}\njeq r0, 0, +1\nldxw r3, [r0+4]\nexit");
    rejects(
        Hook::TaskInit,
        &src,
        "out-of-bounds access to map `m`'s value",
    );
}

#[test]
fn rejects_an_unchecked_lookup_result() {
    let src = format!("{LOOKUP}\nldxw r3, [r0]\nexit");
    rejects(Hook::TaskInit, &src, "may be NULL");
    // Copies share the check: a check of r0 makes r6 usable, on the right branch only.
    let ok = format!("{LOOKUP}\nmov64 r6, r0\njeq r0, 0, +1\nldxw r3, [r6]\nexit");
    check(Hook::TaskInit, &ok).unwrap();
    let bad = format!("{LOOKUP}\nmov64 r6, r0\njne r0, 0, +1\nldxw r3, [r6]\nexit");
    rejects(Hook::TaskInit, &bad, "memory access through a number");
}

#[test]
fn rejects_uninitialized_registers_and_falling_off_the_end() {
    rejects(
        Hook::TaskInit,
        "mov64 r0, r3\nexit",
        "r3 is read before it is written",
    );
    rejects(
        Hook::TaskInit,
        "ldxdw r0, [r1]\nja +1\nexit\njeq r0, 0, -2",
        "falls off the end",
    );
    rejects(Hook::TaskInit, "mov64 r0, 0", "does not end with exit");
    rejects(Hook::TaskInit, "ja +5\nexit", "outside the program");
}

#[test]
fn rejects_paths_longer_than_the_budget() {
    let body = "add64 r0, 1\n".repeat(20);
    let src = format!("mov64 r0, 0\n{body}exit");
    let limits = Limits {
        budget: 10,
        ..Limits::default()
    };
    let e = verify(Hook::TaskInit, &asm(&src), &maps(), limits).unwrap_err();
    assert!(e.to_string().contains("budget of 10"), "{e}");
    assert_eq!(
        verify(Hook::TaskInit, &asm(&src), &maps(), Limits::default())
            .unwrap()
            .longest_path,
        22
    );
}

#[test]
fn rejects_pointer_leaks_and_pointer_arithmetic() {
    rejects(
        Hook::TaskInit,
        "stxdw [r1+48], r10\nexit",
        "would leak an address",
    );
    rejects(
        Hook::TaskInit,
        "mov64 r2, r10\nmul64 r2, 2\nexit",
        "arithmetic on a pointer",
    );
    rejects(
        Hook::TaskInit,
        "ldxdw r3, [r1]\nmov64 r2, r10\nadd64 r2, r3\nexit",
        "known constant",
    );
    rejects(
        Hook::TaskInit,
        "mov32 r2, r10\nexit",
        "truncates the pointer",
    );
}

#[test]
fn rejects_bad_helper_calls_and_instructions() {
    rejects(Hook::TaskInit, "call 99\nexit", "unknown helper 99");
    rejects(
        Hook::TaskInit,
        "mov64 r1, 0\nmov64 r2, r10\ncall 1\nexit",
        "r1 must be a map",
    );
    rejects(
        Hook::TaskInit,
        "lddw r1, map\nmov64 r2, r10\nadd64 r2, -4\ncall 1\nexit",
        "the key (r2)",
    );
    let mut swap = asm("mov64 r0, 1\nle16 r0\nexit");
    swap[8 + 4] = 8; // width 8 would hit `unreachable!()` in rbpf
    let e = verify(Hook::TaskInit, &swap, &maps(), Limits::default()).unwrap_err();
    assert!(e.to_string().contains("byte swap of width 8"), "{e}");
    let mut xadd = asm("stxdw [r10-8], r1\nexit");
    xadd[0] = 0xdb;
    let e = verify(Hook::TaskInit, &xadd, &maps(), Limits::default()).unwrap_err();
    assert!(e.to_string().contains("not supported"), "{e}");
}

#[test]
fn extreme_pointer_offsets_are_rejected_not_overflowed() {
    rejects(
        Hook::TaskInit,
        "mov64 r2, r10\nlddw r3, 0x8000000000000000\nsub64 r2, r3\nexit",
        "out of range",
    );
    rejects(
        Hook::TaskInit,
        "mov64 r2, r10\nlddw r3, 0x7fffffffffffffff\nadd64 r2, r3\nexit",
        "out of range",
    );
}

#[test]
fn rejects_a_read_of_stack_never_written_on_its_path() {
    rejects(
        Hook::TaskInit,
        "ldxdw r0, [r10-8]\nexit",
        "read of uninitialized stack at r10-8 size 8",
    );
    // Half a slot written: the other half is still never written.
    rejects(
        Hook::TaskInit,
        "stw [r10-8], 1\nldxdw r0, [r10-8]\nexit",
        "byte r10-4 was never written",
    );
    check(Hook::TaskInit, "stw [r10-8], 1\nldxw r0, [r10-8]\nexit").unwrap();
    check(Hook::TaskInit, "stdw [r10-8], 1\nldxdw r0, [r10-8]\nexit").unwrap();
    // Written on one path only.
    rejects(
        Hook::TaskInit,
        "ldxdw r2, [r1]\njeq r2, 0, +1\nstdw [r10-8], 1\nldxdw r0, [r10-8]\nexit",
        "uninitialized stack",
    );
    // A helper reads its key from the stack: it must have been written too.
    rejects(
        Hook::TaskInit,
        "mov64 r2, r10\nadd64 r2, -8\nlddw r1, map\ncall 1\nmov64 r0, 0\nexit",
        "the key (r2): read of uninitialized stack",
    );
}

#[test]
fn division_by_zero_is_accepted_and_yields_zero_as_in_the_kernel() {
    for (src, want) in [
        ("mov64 r0, 7\nmov64 r2, 0\ndiv64 r0, r2\nexit", 0),
        ("mov64 r0, 7\nmov64 r2, 0\nmod64 r0, r2\nexit", 7),
    ] {
        let verified = check(Hook::TaskInit, src).unwrap();
        let vm = crate::vm::HookProgram::new(
            Hook::TaskInit,
            asm(src),
            verified,
            &[],
            crate::vm::ExecMode::Interpreter,
        )
        .unwrap();
        let mut ctx = vec![0u8; Hook::TaskInit.ctx_size()];
        assert_eq!(vm.run(&mut ctx).unwrap(), want, "{src}");
    }
}
