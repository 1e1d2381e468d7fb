//! Property: random programs either fail verification or run without crashing the runtime
//! (errors are fine; panics, aborts and segfaults are not).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use xpreempt_bpf::elf::{BpfObject, ProgramCode};
use xpreempt_bpf::helpers::QueueTable;
use xpreempt_bpf::maps::{MapDef, MapKind};
use xpreempt_bpf::{BpfProgram, Hook, LoadOptions};

fn insn(opc: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = opc;
    b[1] = (src << 4) | (dst & 0x0f);
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}

const ALU_OPS: [u8; 12] = [
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90, 0xa0, 0xb0, 0xc0,
];
const JMP_OPS: [u8; 11] = [
    0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0xa0, 0xb0, 0xc0, 0xd0,
];
const SIZES: [u8; 4] = [0x00, 0x08, 0x10, 0x18];

/// One instruction (or an ld_imm64 pair), biased towards what the verifier can accept.
fn instruction() -> impl Strategy<Value = Vec<[u8; 8]>> {
    let reg = 0u8..10;
    prop_oneof![
        (reg.clone(), -100i32..100).prop_map(|(d, i)| vec![insn(0xb7, d, 0, 0, i)]),
        (
            prop::sample::select(&ALU_OPS[..]),
            any::<bool>(),
            any::<bool>(),
            reg.clone(),
            0u8..11,
            -70i32..70
        )
            .prop_map(|(op, is64, x, d, s, i)| {
                let class = if is64 { 0x07 } else { 0x04 };
                vec![insn(op | class | if x { 0x08 } else { 0 }, d, s, 0, i)]
            }),
        (reg.clone(), 1u8..8)
            .prop_map(|(d, k)| vec![insn(0xbf, d, 10, 0, 0), insn(0x07, d, 0, 0, -8 * k as i32)]),
        (
            prop::sample::select(&SIZES[..]),
            reg.clone(),
            prop::sample::select(&[0u8, 1, 6, 10][..]),
            -80i16..80
        )
            .prop_map(|(sz, d, s, o)| vec![insn(0x61 | sz, d, s, o, 0)]),
        (
            prop::sample::select(&SIZES[..]),
            prop::sample::select(&[0u8, 1, 2, 10][..]),
            reg.clone(),
            -80i16..80,
            any::<bool>()
        )
            .prop_map(|(sz, d, s, o, x)| vec![insn(
                if x { 0x63 } else { 0x62 } | sz,
                d,
                s,
                o,
                7
            )]),
        (
            prop::sample::select(&JMP_OPS[..]),
            any::<bool>(),
            reg.clone(),
            reg.clone(),
            -3i16..6,
            -5i32..5
        )
            .prop_map(|(op, x, d, s, o, i)| vec![insn(
                op | 0x05 | if x { 0x08 } else { 0 },
                d,
                s,
                o,
                i
            )]),
        (0i16..4).prop_map(|o| vec![insn(0x05, 0, 0, o, 0)]),
        (reg.clone(), 0i32..3).prop_map(|(d, m)| vec![insn(0x18, d, 1, 0, m), insn(0, 0, 0, 0, 0)]),
        (reg.clone(), any::<i32>(), any::<i32>())
            .prop_map(|(d, lo, hi)| vec![insn(0x18, d, 0, 0, lo), insn(0, 0, 0, 0, hi)]),
        (
            prop::sample::select(&ALU_OPS[..]),
            reg.clone(),
            any::<i32>()
        )
            .prop_map(|(op, d, i)| vec![insn(op | 0x07, d, 0, 0, i)]),
        prop::sample::select(&[1i32, 2, 3, 5, 6, 100, 7][..])
            .prop_map(|h| vec![insn(0x85, 0, 0, 0, h)]),
        Just(vec![insn(0x95, 0, 0, 0, 0)]),
        any::<[u8; 8]>().prop_map(|b| vec![b]),
    ]
}

fn program() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(instruction(), 1..40).prop_map(|parts| {
        // Registers start written (r1 is the context), so that more programs get past the
        // uninitialized-read check and reach the memory and helper checks.
        let mut code: Vec<u8> = [0u8, 2, 3, 4, 5, 6, 7, 8, 9]
            .iter()
            .flat_map(|&r| insn(0xb7, r, 0, 0, 0))
            .collect();
        code.extend(parts.into_iter().flatten().flatten());
        code.extend_from_slice(&insn(0x95, 0, 0, 0, 0));
        code
    })
}

fn maps() -> Vec<MapDef> {
    let def = |name: &str, kind, key_size, value_size| MapDef {
        name: name.into(),
        kind,
        key_size,
        value_size,
        max_entries: 8,
        flags: 0,
    };
    vec![
        def("h8", MapKind::Hash, 8, 8),
        def("a4", MapKind::Array, 4, 16),
        def("h4", MapKind::Hash, 4, 4),
    ]
}

#[test]
fn random_programs_never_crash_the_runtime() {
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        failure_persistence: None,
        ..Config::default()
    });
    let accepted = std::cell::Cell::new(0usize);
    let ran = std::cell::Cell::new(0usize);
    let strategy = (
        program(),
        prop::sample::select(&Hook::ALL[..]),
        prop::collection::vec(any::<u8>(), 64),
    );
    runner
        .run(&strategy, |(code, hook, ctx_seed)| {
            let object = BpfObject {
                maps: maps(),
                programs: vec![ProgramCode { hook, code }],
            };
            let Ok(mut policy) = BpfProgram::from_object("random", object, LoadOptions::default())
            else {
                return Ok(());
            };
            accepted.set(accepted.get() + 1);
            let mut queues = QueueTable::new();
            queues.insert(3, Default::default());
            for round in 0..3u8 {
                let mut ctx: Vec<u8> = ctx_seed
                    .iter()
                    .map(|b| b.wrapping_add(round))
                    .take(hook.ctx_size())
                    .collect();
                let r = policy.run(hook, &mut ctx, &queues, 1_000);
                // A verified program must not fail at run time either.
                prop_assert!(r.is_ok(), "verified program failed: {r:?}");
                ran.set(ran.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    // The generator must reach the interesting part: some programs pass the verifier and run.
    let (accepted, ran) = (accepted.get(), ran.get());
    assert!(
        accepted >= 60,
        "only {accepted} of 3000 random programs were accepted"
    );
    assert!(ran >= 180, "{ran} runs");
    eprintln!("{accepted} of 3000 random programs accepted, {ran} runs");
}

/// Property: a damaged object file is rejected or runs; the loader never panics on it.
#[test]
fn damaged_objects_never_crash_the_loader() {
    let path = xpreempt_bpf::built_object("lcbe").unwrap_or_else(|e| panic!("{e}"));
    let original = std::fs::read(path).unwrap();
    let len = original.len();
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        ..Config::default()
    });
    let loaded = std::cell::Cell::new(0usize);
    let flips = prop::collection::vec((0..len, any::<u8>()), 1..6);
    runner
        .run(
            &(flips, prop_oneof![9 => Just(len), 1 => 0..=len]),
            |(flips, cut)| {
                let mut bytes = original.clone();
                for (at, v) in flips {
                    bytes[at] = v;
                }
                bytes.truncate(cut.max(1));
                if let Ok(mut p) = BpfProgram::load("damaged", &bytes, LoadOptions::default()) {
                    loaded.set(loaded.get() + 1);
                    for hook in Hook::ALL {
                        let mut ctx = vec![0u8; hook.ctx_size()];
                        let r = p.run(hook, &mut ctx, &QueueTable::new(), 0);
                        prop_assert!(r.is_ok(), "{r:?}");
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    // Most single-byte damage hits code or padding and still loads: the runs above are real.
    assert!(
        loaded.get() >= 200,
        "only {} damaged objects loaded",
        loaded.get()
    );
    eprintln!("{} of 2000 damaged objects still loaded", loaded.get());
}
