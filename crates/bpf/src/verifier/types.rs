//! The abstract interpretation: the type of every register and stack slot along each path.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Val {
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
pub(super) enum Slot {
    /// Plain bytes (which of them were written: [`State::written`]).
    Misc,
    /// A whole register stored by an aligned 8-byte store.
    Spill(Val),
}

#[derive(Clone, Debug)]
pub(super) struct State {
    pub(super) regs: [Val; 11],
    pub(super) stack: [Slot; SLOTS],
    /// One bit per stack byte: written on this path. A read of a byte never written is refused,
    /// as Linux refuses it for unprivileged programs, although the interpreter would read 0
    /// (it zeroes the stack for each call): a program must not depend on that.
    pub(super) written: [u64; SLOTS / 8],
}

impl State {
    /// Marks the stack bytes `[off, off+size)` (offsets from r10) written.
    fn write_bytes(&mut self, off: i64, size: i64) {
        for b in off..off + size {
            let i = (b + STACK_SIZE) as usize;
            self.written[i / 64] |= 1 << (i % 64);
        }
    }

    /// The first stack byte of `[off, off+size)` never written, if any.
    fn unwritten(&self, off: i64, size: i64) -> Option<i64> {
        (off..off + size).find(|&b| {
            let i = (b + STACK_SIZE) as usize;
            self.written[i / 64] & (1 << (i % 64)) == 0
        })
    }
}

impl Checker<'_> {
    fn read(&self, st: &State, r: usize) -> Res<Val> {
        match st.regs[r] {
            Val::Uninit => Err(Violation::Uninit { reg: r }),
            v => Ok(v),
        }
    }

    pub(super) fn step(&mut self, i: Insn, st: &mut State) -> Res<Flow> {
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
            _ => return Err(Violation::UnexpectedClass),
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
                    return Err(Violation::PointerTruncated { reg: i.src });
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
                return Err(Violation::PointerArithmetic {
                    reg: i.dst,
                    dst: p.into(),
                    operand: q.into(),
                });
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
                    return Err(Violation::ContextBounds {
                        hook: self.hook,
                        off: a,
                        size,
                        ctx_size: ctx,
                    });
                }
                let w = self.hook.ctx_writable();
                if write && (a < w.start as i64 || a + size > w.end as i64) {
                    return Err(Violation::ContextInput {
                        off: a,
                        size,
                        start: w.start,
                        end: w.end,
                    });
                }
                Ok(())
            }
            Val::Stack(o) => {
                let a = o + off;
                if a < -STACK_SIZE || a + size > 0 {
                    return Err(Violation::StackBounds { off: a, size });
                }
                Ok(())
            }
            Val::MapValue {
                null: true, map, ..
            } => Err(Violation::MaybeNull {
                map: self.maps[map].name.clone(),
            }),
            Val::MapValue { map, off: o, .. } => {
                let a = o + off;
                let vs = self.maps[map].value_size as i64;
                if a < 0 || a + size > vs {
                    return Err(Violation::MapValueBounds {
                        map: self.maps[map].name.clone(),
                        off: a,
                        size,
                        value_size: vs,
                    });
                }
                Ok(())
            }
            other => Err(Violation::NotMemory { base: other.into() }),
        }
    }

    fn load(&self, st: &State, base: Val, off: i64, size: i64) -> Res<Val> {
        self.check_access(base, off, size, false)?;
        if let Val::Stack(o) = base {
            let a = o + off;
            if let Some(at) = st.unwritten(a, size) {
                return Err(Violation::UninitStack { off: a, size, at });
            }
            let first = slot_of(a);
            let last = slot_of(a + size - 1);
            if size == 8 && a.rem_euclid(8) == 0 {
                if let Slot::Spill(v) = st.stack[first] {
                    return Ok(v);
                }
            } else if (first..=last).any(|s| matches!(st.stack[s], Slot::Spill(v) if v.is_ptr())) {
                return Err(Violation::PartialPointerRead { off: a });
            }
        }
        Ok(Val::Scalar(None))
    }

    fn store(&self, st: &mut State, base: Val, off: i64, size: i64, value: Val) -> Res<()> {
        self.check_access(base, off, size, true)?;
        match base {
            Val::Stack(o) => {
                let a = o + off;
                st.write_bytes(a, size);
                if size == 8 && a.rem_euclid(8) == 0 {
                    st.stack[slot_of(a)] = Slot::Spill(value);
                } else {
                    if value.is_ptr() {
                        return Err(Violation::PartialPointerStore { off: a });
                    }
                    for s in slot_of(a)..=slot_of(a + size - 1) {
                        st.stack[s] = Slot::Misc;
                    }
                }
                Ok(())
            }
            _ if value.is_ptr() => Err(Violation::PointerLeak {
                value: value.into(),
                into: base.into(),
            }),
            _ => Ok(()),
        }
    }

    /// A helper reads (or writes) `size` bytes at `ptr`.
    fn check_mem_arg(
        &self,
        st: &mut State,
        arg: &'static str,
        ptr: Val,
        size: i64,
        write: bool,
    ) -> Res<()> {
        match ptr {
            Val::Stack(_) | Val::MapValue { .. } => {}
            Val::Ctx(_) if !write => {}
            other => {
                return Err(Violation::ArgNotMemory {
                    arg,
                    got: other.into(),
                });
            }
        }
        self.check_access(ptr, 0, size, write)
            .map_err(|e| Violation::ArgAccess {
                arg,
                access: Box::new(e),
            })?;
        if let Val::Stack(o) = ptr {
            if write {
                st.write_bytes(o, size);
            } else if let Some(at) = st.unwritten(o, size) {
                return Err(Violation::ArgAccess {
                    arg,
                    access: Box::new(Violation::UninitStack { off: o, size, at }),
                });
            }
            for s in slot_of(o)..=slot_of(o + size - 1) {
                if write {
                    st.stack[s] = Slot::Misc;
                } else if matches!(st.stack[s], Slot::Spill(v) if v.is_ptr()) {
                    return Err(Violation::ArgSpilledPointer { arg });
                }
            }
        }
        Ok(())
    }

    fn map_arg(&self, st: &State) -> Res<usize> {
        match self.read(st, 1)? {
            Val::MapPtr(m) => Ok(m),
            other => Err(Violation::NotAMap { got: other.into() }),
        }
    }

    fn call(&mut self, i: Insn, st: &mut State) -> Res<()> {
        let Some(helper) = HelperId::from_imm(i.imm) else {
            return Err(Violation::UnknownHelper { id: i.imm });
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
                    return Err(Violation::ArgNotNumber {
                        arg: "the flags (r4)",
                    });
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
                    return Err(Violation::ArgNotConstant {
                        arg: "the format size (r2)",
                    });
                };
                if n == 0 || n > MAX_TRACE_FMT {
                    return Err(Violation::ArgSize {
                        arg: "the format size (r2)",
                        n,
                        max: MAX_TRACE_FMT,
                    });
                }
                let fmt = self.read(st, 1)?;
                self.check_mem_arg(st, "the format (r1)", fmt, n as i64, false)?;
                Val::Scalar(None)
            }
            HelperId::GetQueueInfo => {
                if self.read(st, 1)?.is_ptr() {
                    return Err(Violation::ArgNotNumber {
                        arg: "the queue id (r1)",
                    });
                }
                let Val::Scalar(Some(n)) = self.read(st, 3)? else {
                    return Err(Violation::ArgNotConstant {
                        arg: "the size (r3)",
                    });
                };
                if n == 0 || n > size_of::<QueueInfoOut>() as u64 {
                    return Err(Violation::ArgSize {
                        arg: "the size (r3)",
                        n,
                        max: size_of::<QueueInfoOut>() as u64,
                    });
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
        let n = o.checked_add(delta).filter(|n| n.unsigned_abs() < 1 << 30);
        n.ok_or(Violation::PointerOffset { reg })
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
        other => Err(Violation::ArithmeticOn {
            reg,
            what: other.into(),
        }),
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
