//! Checks a hook program before it may run.
//!
//! rbpf's own checks are syntactic, and its interpreter panics on some inputs they let through
//! (falling off the end of the code, a byte-swap of width 8); its JIT checks no memory access at
//! all. So every program passes this verifier first, which proves:
//! - every instruction is one the interpreter implements, with valid registers and fields;
//! - every jump lands on an instruction inside the program; the control-flow graph has no cycle
//!   (a depth-first search finds no back edge), so there are no loops; no path falls off the end;
//! - no path is longer than the per-call instruction budget (rbpf cannot count instructions at
//!   run time; a loop-free program executes each instruction at most once per path, so the
//!   longest path is an exact bound on the work of one call);
//! - memory is accessed only inside the context (writes only to its output fields), the stack,
//!   and map values whose lookup was checked against NULL, at offsets known statically;
//! - helpers get arguments of the right kind (a map, a key or value of the map's size);
//! - no stack byte is read (by the program or a helper) before the path wrote it, as Linux
//!   requires of unprivileged programs (the interpreter zeroes the stack, but a program that
//!   relied on it would fail under the kernel's verifier).
//!
//! Division or modulo by zero is not refused: as in the kernel's eBPF, `x / 0` is 0 and `x % 0`
//! is `x` (the interpreter implements exactly that), so a program need not guard a divisor.
//!
//! It walks every path with an abstract state per register (its type) and per 8-byte stack slot,
//! like Linux's verifier but without range tracking: pointer offsets must be constants.

use crate::ctx::{Hook, QueueInfoOut};
use crate::elf::{INSN_SIZE, LD_DW_IMM, PSEUDO_MAP};
use crate::helpers::HelperId;
use crate::maps::MapDef;
use rbpf::ebpf;

/// Instructions one call may execute, by default.
pub const DEFAULT_BUDGET: usize = 4096;
/// Abstract instructions the verifier may walk before it gives up on a program.
pub const DEFAULT_MAX_STATES: usize = 200_000;
/// Longest program accepted (rbpf computes jump targets in i16).
pub const MAX_PROGRAM_INSNS: usize = 16_384;
const STACK_SIZE: i64 = ebpf::STACK_SIZE as i64;
const SLOTS: usize = ebpf::STACK_SIZE / 8;
const MAX_TRACE_FMT: u64 = 256;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Per-call instruction budget: the longest path may not exceed it.
    pub budget: usize,
    pub max_states: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            max_states: DEFAULT_MAX_STATES,
        }
    }
}

/// What the verifier proved about an accepted program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Verified {
    pub insns: usize,
    /// Instructions on the longest path: the most one call can execute.
    pub longest_path: usize,
}

#[derive(Clone, Copy)]
struct Insn {
    opc: u8,
    dst: usize,
    src: usize,
    off: i16,
    imm: i32,
}

fn decode(code: &[u8], pc: usize) -> Insn {
    let b = &code[pc * INSN_SIZE..(pc + 1) * INSN_SIZE];
    Insn {
        opc: b[0],
        dst: (b[1] & 0x0f) as usize,
        src: (b[1] >> 4) as usize,
        off: i16::from_le_bytes([b[2], b[3]]),
        imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    }
}

struct Checker<'a> {
    hook: Hook,
    maps: &'a [MapDef],
    code: &'a [u8],
    len: usize,
    pc: usize,
    opc: u8,
    next_id: u32,
}

type Res<T> = Result<T, Violation>;

/// Verifies one hook's code against the object's maps.
pub fn verify(
    hook: Hook,
    code: &[u8],
    maps: &[MapDef],
    limits: Limits,
) -> Result<Verified, VerifyError> {
    let len = code.len() / INSN_SIZE;
    let mut c = Checker {
        hook,
        maps,
        code,
        len,
        pc: 0,
        opc: 0,
        next_id: 0,
    };
    let fail = |insn: usize, opcode: u8, violation: Violation| VerifyError {
        hook,
        insn,
        opcode,
        violation,
    };
    if code.is_empty() || !code.len().is_multiple_of(INSN_SIZE) {
        return Err(fail(0, 0, Violation::CodeSize { bytes: code.len() }));
    }
    if len > MAX_PROGRAM_INSNS {
        return Err(fail(0, 0, Violation::TooLong { insns: len }));
    }
    if code[(len - 1) * INSN_SIZE] & 0x07 != ebpf::BPF_JMP {
        return Err(fail(
            len - 1,
            code[(len - 1) * INSN_SIZE],
            Violation::NoFinalJump,
        ));
    }
    // Syntax of every instruction, reachable or not, so that rbpf never meets one it cannot run.
    let mut pc = 0;
    while pc < len {
        let i = decode(code, pc);
        c.pc = pc;
        c.opc = i.opc;
        let width = c.syntax(i).map_err(|r| fail(pc, i.opc, r))?;
        pc += width;
    }
    if let Some((from, to)) = c.find_loop() {
        return Err(fail(from, code[from * INSN_SIZE], Violation::Loop { to }));
    }
    // Every path, with types.
    let mut entry = State {
        regs: [Val::Uninit; 11],
        stack: [Slot::Misc; SLOTS],
        written: [0; SLOTS / 8],
    };
    entry.regs[1] = Val::Ctx(0);
    entry.regs[10] = Val::Stack(0);
    let mut work = vec![(0usize, 0usize, entry)];
    let mut walked = 0usize;
    let mut longest = 0usize;
    while let Some((mut pc, mut depth, mut st)) = work.pop() {
        loop {
            if pc >= len {
                return Err(fail(len.saturating_sub(1), 0, Violation::FallsOffEnd));
            }
            walked += 1;
            depth += 1;
            if walked > limits.max_states {
                return Err(fail(
                    pc,
                    code[pc * INSN_SIZE],
                    Violation::TooComplex {
                        max_states: limits.max_states,
                    },
                ));
            }
            if depth > limits.budget {
                return Err(fail(
                    pc,
                    code[pc * INSN_SIZE],
                    Violation::OverBudget {
                        budget: limits.budget,
                    },
                ));
            }
            let i = decode(code, pc);
            c.pc = pc;
            c.opc = i.opc;
            match c.step(i, &mut st).map_err(|r| fail(pc, i.opc, r))? {
                Flow::Next(n) => pc = n,
                Flow::Branch {
                    taken,
                    taken_state,
                    fall,
                } => {
                    work.push((taken, depth, *taken_state));
                    pc = fall;
                }
                Flow::Exit => {
                    longest = longest.max(depth);
                    break;
                }
            }
        }
    }
    Ok(Verified {
        insns: len,
        longest_path: longest,
    })
}

enum Flow {
    Next(usize),
    Branch {
        taken: usize,
        taken_state: Box<State>,
        fall: usize,
    },
    Exit,
}

fn size_of_ldst(opc: u8) -> i64 {
    match opc & 0x18 {
        ebpf::BPF_W => 4,
        ebpf::BPF_H => 2,
        ebpf::BPF_B => 1,
        _ => 8,
    }
}

fn is_alu(opc: u8) -> bool {
    let class = opc & 0x07;
    if class != ebpf::BPF_ALU && class != ebpf::BPF_ALU64 {
        return false;
    }
    let op = opc & 0xf0;
    match op {
        ebpf::BPF_NEG => opc & 0x08 == 0,
        ebpf::BPF_END => class == ebpf::BPF_ALU,
        o => o <= ebpf::BPF_ARSH,
    }
}

fn is_cond_jump(opc: u8) -> bool {
    let class = opc & 0x07;
    if class != ebpf::BPF_JMP && class != ebpf::BPF_JMP32 {
        return false;
    }
    matches!(
        opc & 0xf0,
        ebpf::BPF_JEQ
            | ebpf::BPF_JGT
            | ebpf::BPF_JGE
            | ebpf::BPF_JSET
            | ebpf::BPF_JNE
            | ebpf::BPF_JSGT
            | ebpf::BPF_JSGE
            | ebpf::BPF_JLT
            | ebpf::BPF_JLE
            | ebpf::BPF_JSLT
            | ebpf::BPF_JSLE
    )
}

mod error;
mod syntax;
mod types;

pub use error::{Operand, VerifyError, Violation};
use types::{Slot, State, Val};

#[cfg(test)]
mod tests;
