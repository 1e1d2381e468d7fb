//! Acceptance: programs compiled by clang that must be rejected, each with an error that says
//! why, naming the hook and the instruction; a rejected load leaves the active policy in place.

mod common;

use xpreempt_bpf::{BpfHooks, BpfProgram, LoadOptions};
use xpreempt_core::QueueId;
use xpreempt_core::sched::{Hooks, QueueInfo};

fn rejection(name: &str) -> String {
    let err = BpfProgram::load(name, &common::object(name), LoadOptions::default())
        .expect_err("must be rejected");
    err.to_string()
}

#[test]
fn infinite_loop_is_rejected() {
    let e = rejection("bad_loop");
    assert!(e.contains("task_init: instruction"), "{e}");
    assert!(e.contains("loops are not allowed"), "{e}");
}

#[test]
fn out_of_bounds_read_is_rejected() {
    let e = rejection("bad_oob");
    assert!(e.contains("task_init: instruction"), "{e}");
    assert!(
        e.contains(
            "out-of-bounds access to map `prio`'s value: offset 16 size 4, value is 4 bytes"
        ),
        "{e}"
    );
}

#[test]
fn wrong_section_name_is_rejected() {
    let e = rejection("bad_section");
    assert!(
        e.contains("section `gpu_sched/task_init` holds code but is not a hook"),
        "{e}"
    );
}

#[test]
fn input_write_and_unchecked_lookup_are_rejected() {
    assert!(rejection("bad_ctx_write").contains("only the outputs"));
    assert!(rejection("bad_null").contains("may be NULL"));
}

#[test]
fn a_rejected_load_keeps_the_previous_policy() {
    let mut h = BpfHooks::new(common::program("fixed_priority"));
    h.program_mut()
        .unwrap()
        .map_mut("priorities")
        .unwrap()
        .update(&1u64.to_le_bytes(), &77i32.to_le_bytes(), 0)
        .unwrap();
    let err = h
        .load(
            "bad_loop",
            &common::object("bad_loop"),
            LoadOptions::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("loop"));
    assert_eq!(h.program().unwrap().name(), "fixed_priority");
    let mut q = QueueInfo::new(QueueId(1), 0);
    h.task_init(&mut q);
    assert_eq!(q.priority, 77, "the previous policy still decides");
}

#[test]
fn objects_that_are_not_bpf_are_rejected() {
    let e = BpfProgram::load("x", b"\x7fELF junk", LoadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("not an ELF object"), "{e}");
}
