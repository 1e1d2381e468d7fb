//! Why the verifier rejected a program: where (hook and instruction) and what is wrong there.

use super::types::Val;
use super::{MAX_PROGRAM_INSNS, STACK_SIZE};
use crate::ctx::Hook;
use thiserror::Error;

/// A rejected program. Program-wide problems (its size, its last instruction) are reported at
/// the instruction where they show.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{hook}: instruction {insn} (opcode {opcode:#04x}): {violation}")]
pub struct VerifyError {
    pub hook: Hook,
    pub insn: usize,
    pub opcode: u8,
    pub violation: Violation,
}

/// What the verifier could not prove about an instruction (or the whole program).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Violation {
    // The program as a whole.
    #[error("code is {bytes} bytes, not a whole number of instructions")]
    CodeSize { bytes: usize },
    #[error("{insns} instructions, more than {MAX_PROGRAM_INSNS}")]
    TooLong { insns: usize },
    #[error("the program does not end with exit or a jump")]
    NoFinalJump,
    #[error("jump back to instruction {to} closes a loop: loops are not allowed (unroll them)")]
    Loop { to: usize },
    #[error("execution falls off the end of the program (no exit)")]
    FallsOffEnd,
    #[error("program too complex: more than {max_states} instructions explored over all paths")]
    TooComplex { max_states: usize },
    #[error("a path runs more than the per-call budget of {budget} instructions")]
    OverBudget { budget: usize },

    // Encoding: what rbpf must never meet.
    #[error("register r{dst} / r{src} does not exist")]
    NoSuchRegister { dst: usize, src: usize },
    #[error("r10 (the frame pointer) is read-only")]
    FramePointerWrite,
    #[error("ld_imm64 is missing its second half")]
    LdImm64Truncated,
    #[error("ld_imm64's second half is malformed")]
    LdImm64Malformed,
    #[error("ld_imm64 with source {src} is not supported")]
    LdImm64Source { src: usize },
    #[error("ld_imm64 with a non-zero offset")]
    LdImm64Offset,
    #[error("map reference {index} but the object has {maps} maps")]
    MapIndex { index: u32, maps: usize },
    #[error("byte swap of width {width} (must be 16, 32 or 64)")]
    SwapWidth { width: i32 },
    #[error("calls between BPF functions are not supported")]
    LocalCall,
    #[error("unknown helper {id}")]
    UnknownHelper { id: i32 },
    #[error(
        "opcode {opcode:#04x} is not supported (atomics, packet loads, tail calls and eBPF v4 \
         instructions are not)"
    )]
    UnsupportedOpcode { opcode: u8 },
    #[error("ALU instruction with a non-zero offset (eBPF v4; build with -mcpu=v3)")]
    AluOffset,
    #[error("jump to instruction {target}, outside the program ({len} instructions)")]
    JumpOutside { target: i64, len: usize },
    #[error("jump into the middle of ld_imm64 at {at}")]
    JumpIntoLdImm64 { at: i64 },

    // Types along a path.
    #[error("unexpected instruction class")]
    UnexpectedClass,
    #[error("r{reg} is read before it is written")]
    Uninit { reg: usize },
    #[error("32-bit move truncates the pointer in r{reg}")]
    PointerTruncated { reg: usize },
    #[error(
        "arithmetic on a pointer (r{reg} is {dst}, operand is {operand}): only adding or \
         subtracting a known constant is allowed"
    )]
    PointerArithmetic {
        reg: usize,
        dst: Operand,
        operand: Operand,
    },
    #[error("arithmetic on r{reg}, {what}")]
    ArithmeticOn { reg: usize, what: Operand },
    #[error("pointer offset in r{reg} out of range")]
    PointerOffset { reg: usize },

    // Memory.
    #[error(
        "context access at offset {off} size {size} is outside the {ctx_size}-byte {hook} context"
    )]
    ContextBounds {
        hook: Hook,
        off: i64,
        size: i64,
        ctx_size: i64,
    },
    #[error(
        "write to context offset {off} size {size}: only the outputs (bytes {start}..{end}) are writable"
    )]
    ContextInput {
        off: i64,
        size: i64,
        start: usize,
        end: usize,
    },
    #[error(
        "read of uninitialized stack at r10{off:+} size {size} (byte r10{at:+} was never written on this path)"
    )]
    UninitStack { off: i64, size: i64, at: i64 },
    #[error("stack access at r10{off:+} size {size} is outside the {STACK_SIZE}-byte stack")]
    StackBounds { off: i64, size: i64 },
    #[error(
        "access through a value of map `{map}` that may be NULL (check the lookup's result first)"
    )]
    MaybeNull { map: String },
    #[error(
        "out-of-bounds access to map `{map}`'s value: offset {off} size {size}, value is {value_size} bytes"
    )]
    MapValueBounds {
        map: String,
        off: i64,
        size: i64,
        value_size: i64,
    },
    #[error("memory access through {base}")]
    NotMemory { base: Operand },
    #[error("partial read of a pointer spilled at r10{off:+}")]
    PartialPointerRead { off: i64 },
    #[error("partial store of a pointer to r10{off:+}")]
    PartialPointerStore { off: i64 },
    #[error("storing a pointer ({value}) into {into} would leak an address")]
    PointerLeak { value: Operand, into: Operand },

    // Helper arguments; `arg` names the argument and its register, e.g. "the key (r2)".
    #[error("r1 must be a map, not {got}")]
    NotAMap { got: Operand },
    #[error("{arg} must point to the stack or a map value, not {got}")]
    ArgNotMemory { arg: &'static str, got: Operand },
    #[error("{arg}: {access}")]
    ArgAccess {
        arg: &'static str,
        access: Box<Violation>,
    },
    #[error("{arg} would pass a spilled pointer's bytes to a helper")]
    ArgSpilledPointer { arg: &'static str },
    #[error("{arg} must be a number")]
    ArgNotNumber { arg: &'static str },
    #[error("{arg} must be a known constant")]
    ArgNotConstant { arg: &'static str },
    #[error("{arg} is {n}, not in 1..={max}")]
    ArgSize { arg: &'static str, n: u64, max: u64 },
}

/// What the verifier knows a register or stack slot holds, as an error names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    Uninit,
    Number,
    Context { off: i64 },
    Stack { off: i64 },
    Map { index: usize },
    MapValue { map: usize, off: i64 },
    MaybeNullMapValue { map: usize },
}

impl From<Val> for Operand {
    fn from(v: Val) -> Self {
        match v {
            Val::Uninit => Operand::Uninit,
            Val::Scalar(_) => Operand::Number,
            Val::Ctx(off) => Operand::Context { off },
            Val::Stack(off) => Operand::Stack { off },
            Val::MapPtr(index) => Operand::Map { index },
            Val::MapValue {
                map, null: true, ..
            } => Operand::MaybeNullMapValue { map },
            Val::MapValue { map, off, .. } => Operand::MapValue { map, off },
        }
    }
}

impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Operand::Uninit => write!(f, "an uninitialized register"),
            Operand::Number => write!(f, "a number"),
            Operand::Context { off } => write!(f, "the context{off:+}"),
            Operand::Stack { off } => write!(f, "the stack r10{off:+}"),
            Operand::Map { index } => write!(f, "map #{index}"),
            Operand::MaybeNullMapValue { map } => {
                write!(f, "a map #{map} value that may be NULL")
            }
            Operand::MapValue { map, off } => write!(f, "map #{map}'s value{off:+}"),
        }
    }
}
