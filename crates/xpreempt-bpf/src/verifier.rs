//! Checks a hook program before it may run.
//!
//! rbpf's own checks are syntactic, and its interpreter panics on some inputs they let through
//! (falling off the end of the code, a byte-swap of width 8); its JIT checks no memory access at
//! all. So every program passes this verifier first, which proves:
//! - every instruction is one the interpreter implements, with valid registers and fields;
//! - every jump goes forward to an instruction inside the program (no back-edges, so no loops),
//!   and no path falls off the end;
//! - no path is longer than the per-call instruction budget (rbpf cannot count instructions at
//!   run time; a loop-free program executes each instruction at most once per path, so the
//!   longest path is an exact bound on the work of one call);
//! - memory is accessed only inside the context (writes only to its output fields), the stack,
//!   and map values whose lookup was checked against NULL, at offsets known statically;
//! - helpers get arguments of the right kind (a map, a key or value of the map's size).
//!
//! It walks every path with an abstract state per register (its type) and per 8-byte stack slot,
//! like Linux's verifier but without range tracking: pointer offsets must be constants.

use crate::ctx::{Hook, QueueInfoOut};
use crate::elf::{INSN_SIZE, LD_DW_IMM, PSEUDO_MAP};
use crate::helpers::HelperId;
use crate::maps::MapDef;
use rbpf::ebpf;
use thiserror::Error;

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

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{hook}: instruction {insn} (opcode {opcode:#04x}): {reason}")]
pub struct VerifyError {
    pub hook: Hook,
    pub insn: usize,
    pub opcode: u8,
    pub reason: String,
}

/// What the verifier proved about an accepted program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Verified {
    pub insns: usize,
    /// Instructions on the longest path: the most one call can execute.
    pub longest_path: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    Uninit,
    Scalar(Option<u64>),
    Ctx(i64),
    Stack(i64),
    MapPtr(usize),
    MapValue {
        map: usize,
        off: i64,
        null: bool,
        id: u32,
    },
}

impl Val {
    fn is_ptr(self) -> bool {
        !matches!(self, Val::Uninit | Val::Scalar(_))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Plain bytes (possibly never written: the interpreter zeroes the stack for each call).
    Misc,
    /// A whole register stored by an aligned 8-byte store.
    Spill(Val),
}

#[derive(Clone, Debug)]
struct State {
    regs: [Val; 11],
    stack: [Slot; SLOTS],
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

type Res<T> = Result<T, String>;

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
    let fail = |insn: usize, opcode: u8, reason: String| VerifyError {
        hook,
        insn,
        opcode,
        reason,
    };
    if code.is_empty() || !code.len().is_multiple_of(INSN_SIZE) {
        return Err(fail(
            0,
            0,
            format!(
                "code is {} bytes, not a whole number of instructions",
                code.len()
            ),
        ));
    }
    if len > MAX_PROGRAM_INSNS {
        return Err(fail(
            0,
            0,
            format!("{len} instructions, more than {MAX_PROGRAM_INSNS}"),
        ));
    }
    if code[(len - 1) * INSN_SIZE] & 0x07 != ebpf::BPF_JMP {
        return Err(fail(
            len - 1,
            code[(len - 1) * INSN_SIZE],
            "the program does not end with exit or a jump".into(),
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
        return Err(fail(
            from,
            code[from * INSN_SIZE],
            format!(
                "jump back to instruction {to} closes a loop: loops are not allowed (unroll them)"
            ),
        ));
    }
    // Every path, with types.
    let mut entry = State {
        regs: [Val::Uninit; 11],
        stack: [Slot::Misc; SLOTS],
    };
    entry.regs[1] = Val::Ctx(0);
    entry.regs[10] = Val::Stack(0);
    let mut work = vec![(0usize, 0usize, entry)];
    let mut walked = 0usize;
    let mut longest = 0usize;
    while let Some((mut pc, mut depth, mut st)) = work.pop() {
        loop {
            if pc >= len {
                return Err(fail(
                    len.saturating_sub(1),
                    0,
                    "execution falls off the end of the program (no exit)".into(),
                ));
            }
            walked += 1;
            depth += 1;
            if walked > limits.max_states {
                return Err(fail(
                    pc,
                    code[pc * INSN_SIZE],
                    format!(
                        "program too complex: more than {} instructions explored over all paths",
                        limits.max_states
                    ),
                ));
            }
            if depth > limits.budget {
                return Err(fail(
                    pc,
                    code[pc * INSN_SIZE],
                    format!(
                        "a path runs more than the per-call budget of {} instructions",
                        limits.budget
                    ),
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

impl Checker<'_> {
    /// Checks one instruction's encoding; returns how many 8-byte slots it takes.
    fn syntax(&self, i: Insn) -> Res<usize> {
        if i.dst > 10 || i.src > 10 {
            return Err(format!("register r{} / r{} does not exist", i.dst, i.src));
        }
        let class = i.opc & 0x07;
        // rbpf refuses r10 as the destination of anything but a store, jumps included.
        if i.dst == 10 && class != ebpf::BPF_ST && class != ebpf::BPF_STX {
            return Err("r10 (the frame pointer) is read-only".into());
        }
        match i.opc {
            LD_DW_IMM => {
                if self.pc + 1 >= self.len {
                    return Err("ld_imm64 is missing its second half".into());
                }
                let n = decode(self.code, self.pc + 1);
                if n.opc != 0 || n.dst != 0 || n.src != 0 || n.off != 0 {
                    return Err("ld_imm64's second half is malformed".into());
                }
                if i.src == PSEUDO_MAP as usize && i.imm as u32 as usize >= self.maps.len() {
                    return Err(format!(
                        "map reference {} but the object has {} maps",
                        i.imm as u32,
                        self.maps.len()
                    ));
                }
                if i.src != 0 && i.src != PSEUDO_MAP as usize {
                    return Err(format!("ld_imm64 with source {} is not supported", i.src));
                }
                if i.off != 0 {
                    return Err("ld_imm64 with a non-zero offset".into());
                }
                return Ok(2);
            }
            ebpf::LD_B_REG | ebpf::LD_H_REG | ebpf::LD_W_REG | ebpf::LD_DW_REG => {}
            ebpf::ST_B_IMM | ebpf::ST_H_IMM | ebpf::ST_W_IMM | ebpf::ST_DW_IMM => {}
            ebpf::ST_B_REG | ebpf::ST_H_REG | ebpf::ST_W_REG | ebpf::ST_DW_REG => {}
            ebpf::LE | ebpf::BE => {
                if !matches!(i.imm, 16 | 32 | 64) {
                    return Err(format!(
                        "byte swap of width {} (must be 16, 32 or 64)",
                        i.imm
                    ));
                }
            }
            ebpf::CALL => {
                if i.src != 0 {
                    return Err("calls between BPF functions are not supported".into());
                }
                if HelperId::from_imm(i.imm).is_none() {
                    return Err(format!("unknown helper {}", i.imm));
                }
            }
            ebpf::EXIT | ebpf::JA => {}
            o if is_alu(o) || is_cond_jump(o) => {}
            o => {
                return Err(format!(
                    "opcode {o:#04x} is not supported (atomics, packet loads, tail calls and eBPF v4 instructions are not)"
                ));
            }
        }
        // ALU instructions with a non-zero offset are eBPF v4 (signed division, sign-extending
        // moves), which rbpf would silently run as something else.
        if is_alu(i.opc) && i.off != 0 {
            return Err(
                "ALU instruction with a non-zero offset (eBPF v4; build with -mcpu=v3)".into(),
            );
        }
        if let Some(target) = self.jump_target(i) {
            if target < 0 || target >= self.len as i64 {
                return Err(format!(
                    "jump to instruction {target}, outside the program ({} instructions)",
                    self.len
                ));
            }
            if decode(self.code, target as usize).opc == 0 {
                return Err(format!(
                    "jump into the middle of ld_imm64 at {}",
                    target - 1
                ));
            }
        }
        Ok(1)
    }

    fn jump_target(&self, i: Insn) -> Option<i64> {
        (i.opc == ebpf::JA || is_cond_jump(i.opc)).then(|| self.pc as i64 + 1 + i.off as i64)
    }

    /// The instructions control may go to after `pc`.
    fn successors(&self, pc: usize) -> Vec<usize> {
        let i = decode(self.code, pc);
        match i.opc {
            ebpf::EXIT => vec![],
            LD_DW_IMM => vec![pc + 2],
            ebpf::JA => vec![(pc as i64 + 1 + i.off as i64) as usize],
            o if is_cond_jump(o) => vec![pc + 1, (pc as i64 + 1 + i.off as i64) as usize],
            _ => vec![pc + 1],
        }
    }

    /// Depth-first search of the control-flow graph: an edge back to an instruction still on
    /// the search path closes a loop. (A backward jump alone is not a loop: clang places
    /// blocks in any order.)
    fn find_loop(&self) -> Option<(usize, usize)> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            OnPath,
            Done,
        }
        let mut mark = vec![Mark::New; self.len + 1];
        let mut stack: Vec<(usize, Vec<usize>)> = vec![(0, self.successors(0))];
        mark[0] = Mark::OnPath;
        while let Some((pc, succ)) = stack.last_mut() {
            let pc = *pc;
            match succ.pop() {
                // Falling off the end is reported by the path walk.
                Some(next) if next >= self.len => {}
                Some(next) => match mark[next] {
                    Mark::OnPath => return Some((pc, next)),
                    Mark::Done => {}
                    Mark::New => {
                        mark[next] = Mark::OnPath;
                        let s = self.successors(next);
                        stack.push((next, s));
                    }
                },
                None => {
                    mark[pc] = Mark::Done;
                    stack.pop();
                }
            }
        }
        None
    }

    fn read(&self, st: &State, r: usize) -> Res<Val> {
        match st.regs[r] {
            Val::Uninit => Err(format!("r{r} is read before it is written")),
            v => Ok(v),
        }
    }

    fn step(&mut self, i: Insn, st: &mut State) -> Res<Flow> {
        let next = self.pc + 1;
        let class = i.opc & 0x07;
        match i.opc {
            LD_DW_IMM => {
                let hi = decode(self.code, self.pc + 1).imm as u32 as u64;
                st.regs[i.dst] = if i.src == PSEUDO_MAP as usize {
                    Val::MapPtr(i.imm as u32 as usize)
                } else {
                    Val::Scalar(Some((i.imm as u32 as u64) | (hi << 32)))
                };
                return Ok(Flow::Next(self.pc + 2));
            }
            ebpf::EXIT => return Ok(Flow::Exit),
            ebpf::CALL => {
                self.call(i, st)?;
                return Ok(Flow::Next(next));
            }
            ebpf::JA => return Ok(Flow::Next((next as i64 + i.off as i64) as usize)),
            _ => {}
        }
        if is_cond_jump(i.opc) {
            return self.cond_jump(i, st);
        }
        match class {
            ebpf::BPF_ALU | ebpf::BPF_ALU64 => self.alu(i, st)?,
            ebpf::BPF_LDX => {
                let size = size_of_ldst(i.opc);
                let base = self.read(st, i.src)?;
                st.regs[i.dst] = self.load(st, base, i.off as i64, size)?;
            }
            ebpf::BPF_ST | ebpf::BPF_STX => {
                let size = size_of_ldst(i.opc);
                let value = if class == ebpf::BPF_STX {
                    self.read(st, i.src)?
                } else {
                    Val::Scalar(Some(i.imm as i64 as u64))
                };
                let base = self.read(st, i.dst)?;
                self.store(st, base, i.off as i64, size, value)?;
            }
            _ => return Err("unexpected instruction class".into()),
        }
        Ok(Flow::Next(next))
    }

    fn alu(&mut self, i: Insn, st: &mut State) -> Res<()> {
        let is64 = i.opc & 0x07 == ebpf::BPF_ALU64;
        let op = i.opc & 0xf0;
        let uses_reg = i.opc & 0x08 == ebpf::BPF_X && op != ebpf::BPF_NEG && op != ebpf::BPF_END;
        let src = if uses_reg {
            self.read(st, i.src)?
        } else {
            Val::Scalar(Some(i.imm as i64 as u64))
        };
        if op == ebpf::BPF_MOV {
            st.regs[i.dst] = match (is64, src) {
                (true, v) => v,
                (false, v) if v.is_ptr() => {
                    return Err(format!("32-bit move truncates the pointer in r{}", i.src));
                }
                (false, Val::Scalar(Some(c))) => Val::Scalar(Some(c as u32 as u64)),
                (false, _) => Val::Scalar(None),
            };
            return Ok(());
        }
        let dst = self.read(st, i.dst)?;
        st.regs[i.dst] = match (dst, src) {
            (Val::Scalar(a), Val::Scalar(b)) => Val::Scalar(match (is64, op, a, b) {
                (true, ebpf::BPF_ADD, Some(a), Some(b)) => Some(a.wrapping_add(b)),
                (true, ebpf::BPF_SUB, Some(a), Some(b)) => Some(a.wrapping_sub(b)),
                _ => None,
            }),
            (p, Val::Scalar(Some(c)))
                if p.is_ptr() && is64 && (op == ebpf::BPF_ADD || op == ebpf::BPF_SUB) =>
            {
                let delta = if op == ebpf::BPF_ADD {
                    c as i64
                } else {
                    (c as i64).wrapping_neg()
                };
                offset_ptr(p, delta, i.dst)?
            }
            (Val::Scalar(Some(c)), p) if p.is_ptr() && is64 && op == ebpf::BPF_ADD => {
                offset_ptr(p, c as i64, i.src)?
            }
            (p, q) if p.is_ptr() || q.is_ptr() => {
                return Err(format!(
                    "arithmetic on a pointer (r{} is {}, operand is {}): only adding or subtracting a known constant is allowed",
                    i.dst,
                    describe(p),
                    describe(q)
                ));
            }
            _ => Val::Scalar(None),
        };
        Ok(())
    }

    fn cond_jump(&mut self, i: Insn, st: &mut State) -> Res<Flow> {
        let dst = self.read(st, i.dst)?;
        let uses_reg = i.opc & 0x08 == ebpf::BPF_X;
        if uses_reg {
            self.read(st, i.src)?;
        }
        let taken = (self.pc as i64 + 1 + i.off as i64) as usize;
        let fall = self.pc + 1;
        let mut taken_state = Box::new(st.clone());
        // A NULL check on a map lookup's result: one branch has the value, the other has 0.
        if let Val::MapValue { null: true, id, .. } = dst
            && !uses_reg
            && i.imm == 0
            && (i.opc == ebpf::JEQ_IMM || i.opc == ebpf::JNE_IMM)
        {
            let (is_null, non_null) = if i.opc == ebpf::JEQ_IMM {
                (&mut *taken_state, &mut *st)
            } else {
                (&mut *st, &mut *taken_state)
            };
            mark_null(is_null, id, true);
            mark_null(non_null, id, false);
        }
        Ok(Flow::Branch {
            taken,
            taken_state,
            fall,
        })
    }

    /// The byte range `[off, off+size)` of `base`'s region, checked. Returns the region kind.
    fn check_access(&self, base: Val, off: i64, size: i64, write: bool) -> Res<()> {
        match base {
            Val::Ctx(o) => {
                let a = o + off;
                let ctx = self.hook.ctx_size() as i64;
                if a < 0 || a + size > ctx {
                    return Err(format!(
                        "context access at offset {a} size {size} is outside the {ctx}-byte {} context",
                        self.hook
                    ));
                }
                let w = self.hook.ctx_writable();
                if write && (a < w.start as i64 || a + size > w.end as i64) {
                    return Err(format!(
                        "write to context offset {a} size {size}: only the outputs (bytes {}..{}) are writable",
                        w.start, w.end
                    ));
                }
                Ok(())
            }
            Val::Stack(o) => {
                let a = o + off;
                if a < -STACK_SIZE || a + size > 0 {
                    return Err(format!(
                        "stack access at r10{a:+} size {size} is outside the {STACK_SIZE}-byte stack"
                    ));
                }
                Ok(())
            }
            Val::MapValue {
                null: true, map, ..
            } => Err(format!(
                "access through a value of map `{}` that may be NULL (check the lookup's result first)",
                self.maps[map].name
            )),
            Val::MapValue { map, off: o, .. } => {
                let a = o + off;
                let vs = self.maps[map].value_size as i64;
                if a < 0 || a + size > vs {
                    return Err(format!(
                        "out-of-bounds access to map `{}`'s value: offset {a} size {size}, value is {vs} bytes",
                        self.maps[map].name
                    ));
                }
                Ok(())
            }
            other => Err(format!("memory access through {}", describe(other))),
        }
    }

    fn load(&self, st: &State, base: Val, off: i64, size: i64) -> Res<Val> {
        self.check_access(base, off, size, false)?;
        if let Val::Stack(o) = base {
            let a = o + off;
            let first = slot_of(a);
            let last = slot_of(a + size - 1);
            if size == 8 && a.rem_euclid(8) == 0 {
                if let Slot::Spill(v) = st.stack[first] {
                    return Ok(v);
                }
            } else if (first..=last).any(|s| matches!(st.stack[s], Slot::Spill(v) if v.is_ptr())) {
                return Err(format!("partial read of a pointer spilled at r10{a:+}"));
            }
        }
        Ok(Val::Scalar(None))
    }

    fn store(&self, st: &mut State, base: Val, off: i64, size: i64, value: Val) -> Res<()> {
        self.check_access(base, off, size, true)?;
        match base {
            Val::Stack(o) => {
                let a = o + off;
                if size == 8 && a.rem_euclid(8) == 0 {
                    st.stack[slot_of(a)] = Slot::Spill(value);
                } else {
                    if value.is_ptr() {
                        return Err(format!("partial store of a pointer to r10{a:+}"));
                    }
                    for s in slot_of(a)..=slot_of(a + size - 1) {
                        st.stack[s] = Slot::Misc;
                    }
                }
                Ok(())
            }
            _ if value.is_ptr() => Err(format!(
                "storing a pointer ({}) into {} would leak an address",
                describe(value),
                describe(base)
            )),
            _ => Ok(()),
        }
    }

    /// A helper reads (or writes) `size` bytes at `ptr`.
    fn check_mem_arg(
        &self,
        st: &mut State,
        arg: &str,
        ptr: Val,
        size: i64,
        write: bool,
    ) -> Res<()> {
        match ptr {
            Val::Stack(_) | Val::MapValue { .. } => {}
            Val::Ctx(_) if !write => {}
            other => {
                return Err(format!(
                    "{arg} must point to the stack or a map value, not {}",
                    describe(other)
                ));
            }
        }
        self.check_access(ptr, 0, size, write)
            .map_err(|e| format!("{arg}: {e}"))?;
        if let Val::Stack(o) = ptr {
            for s in slot_of(o)..=slot_of(o + size - 1) {
                if write {
                    st.stack[s] = Slot::Misc;
                } else if matches!(st.stack[s], Slot::Spill(v) if v.is_ptr()) {
                    return Err(format!(
                        "{arg} would pass a spilled pointer's bytes to a helper"
                    ));
                }
            }
        }
        Ok(())
    }

    fn map_arg(&self, st: &State) -> Res<usize> {
        match self.read(st, 1)? {
            Val::MapPtr(m) => Ok(m),
            other => Err(format!("r1 must be a map, not {}", describe(other))),
        }
    }

    fn call(&mut self, i: Insn, st: &mut State) -> Res<()> {
        let Some(helper) = HelperId::from_imm(i.imm) else {
            return Err(format!("unknown helper {}", i.imm));
        };
        let ret = match helper {
            HelperId::MapLookup => {
                let m = self.map_arg(st)?;
                let key = self.read(st, 2)?;
                self.check_mem_arg(st, "the key (r2)", key, self.maps[m].key_size as i64, false)?;
                self.next_id += 1;
                Val::MapValue {
                    map: m,
                    off: 0,
                    null: true,
                    id: self.next_id,
                }
            }
            HelperId::MapUpdate => {
                let m = self.map_arg(st)?;
                let key = self.read(st, 2)?;
                self.check_mem_arg(st, "the key (r2)", key, self.maps[m].key_size as i64, false)?;
                let value = self.read(st, 3)?;
                self.check_mem_arg(
                    st,
                    "the value (r3)",
                    value,
                    self.maps[m].value_size as i64,
                    false,
                )?;
                if self.read(st, 4)?.is_ptr() {
                    return Err("the flags (r4) must be a number".into());
                }
                Val::Scalar(None)
            }
            HelperId::MapDelete => {
                let m = self.map_arg(st)?;
                let key = self.read(st, 2)?;
                self.check_mem_arg(st, "the key (r2)", key, self.maps[m].key_size as i64, false)?;
                Val::Scalar(None)
            }
            HelperId::KtimeGetNs => Val::Scalar(None),
            HelperId::TracePrintk => {
                let Val::Scalar(Some(n)) = self.read(st, 2)? else {
                    return Err("the format size (r2) must be a known constant".into());
                };
                if n == 0 || n > MAX_TRACE_FMT {
                    return Err(format!("format size {n} is not in 1..={MAX_TRACE_FMT}"));
                }
                let fmt = self.read(st, 1)?;
                self.check_mem_arg(st, "the format (r1)", fmt, n as i64, false)?;
                Val::Scalar(None)
            }
            HelperId::GetQueueInfo => {
                if self.read(st, 1)?.is_ptr() {
                    return Err("the queue id (r1) must be a number".into());
                }
                let Val::Scalar(Some(n)) = self.read(st, 3)? else {
                    return Err("the size (r3) must be a known constant".into());
                };
                if n == 0 || n > size_of::<QueueInfoOut>() as u64 {
                    return Err(format!(
                        "size {n} is not in 1..={}",
                        size_of::<QueueInfoOut>()
                    ));
                }
                let out = self.read(st, 2)?;
                self.check_mem_arg(st, "the output (r2)", out, n as i64, true)?;
                Val::Scalar(None)
            }
        };
        for r in 1..=5 {
            st.regs[r] = Val::Uninit;
        }
        st.regs[0] = ret;
        Ok(())
    }
}

fn slot_of(stack_off: i64) -> usize {
    ((stack_off + STACK_SIZE) / 8) as usize
}

fn offset_ptr(p: Val, delta: i64, reg: usize) -> Res<Val> {
    // Offsets stay small so that later bounds arithmetic cannot overflow.
    let bump = |o: i64| -> Res<i64> {
        let n = o.checked_add(delta).filter(|n| n.abs() < 1 << 30);
        n.ok_or_else(|| format!("pointer offset in r{reg} out of range"))
    };
    match p {
        Val::Ctx(o) => Ok(Val::Ctx(bump(o)?)),
        Val::Stack(o) => Ok(Val::Stack(bump(o)?)),
        Val::MapValue {
            null: false,
            map,
            off,
            id,
        } => Ok(Val::MapValue {
            map,
            off: bump(off)?,
            null: false,
            id,
        }),
        Val::MapValue { null: true, .. } => Err(format!(
            "arithmetic on r{reg}, a map value that may be NULL"
        )),
        other => Err(format!("arithmetic on r{reg}, {}", describe(other))),
    }
}

fn mark_null(st: &mut State, id: u32, is_null: bool) {
    let fix = |v: &mut Val| {
        if let Val::MapValue {
            id: i, map, off, ..
        } = *v
            && i == id
        {
            *v = if is_null {
                Val::Scalar(Some(0))
            } else {
                Val::MapValue {
                    map,
                    off,
                    null: false,
                    id,
                }
            };
        }
    };
    st.regs.iter_mut().for_each(fix);
    for s in st.stack.iter_mut() {
        if let Slot::Spill(v) = s {
            fix(v);
        }
    }
}

fn describe(v: Val) -> String {
    match v {
        Val::Uninit => "an uninitialized register".into(),
        Val::Scalar(_) => "a number".into(),
        Val::Ctx(o) => format!("the context{o:+}"),
        Val::Stack(o) => format!("the stack r10{o:+}"),
        Val::MapPtr(m) => format!("map #{m}"),
        Val::MapValue {
            map, null: true, ..
        } => format!("a map #{map} value that may be NULL"),
        Val::MapValue { map, off, .. } => format!("map #{map}'s value{off:+}"),
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

#[cfg(test)]
#[path = "verifier_tests.rs"]
mod tests;
