//! Encoding checks and the loop check: what rbpf must never meet.

use super::*;

impl Checker<'_> {
    /// Checks one instruction's encoding; returns how many 8-byte slots it takes.
    pub(super) fn syntax(&self, i: Insn) -> Res<usize> {
        if i.dst > 10 || i.src > 10 {
            return Err(Violation::NoSuchRegister {
                dst: i.dst,
                src: i.src,
            });
        }
        let class = i.opc & 0x07;
        // rbpf refuses r10 as the destination of anything but a store, jumps included.
        if i.dst == 10 && class != ebpf::BPF_ST && class != ebpf::BPF_STX {
            return Err(Violation::FramePointerWrite);
        }
        match i.opc {
            LD_DW_IMM => {
                if self.pc + 1 >= self.len {
                    return Err(Violation::LdImm64Truncated);
                }
                let n = decode(self.code, self.pc + 1);
                if n.opc != 0 || n.dst != 0 || n.src != 0 || n.off != 0 {
                    return Err(Violation::LdImm64Malformed);
                }
                if i.src == PSEUDO_MAP as usize && i.imm as u32 as usize >= self.maps.len() {
                    return Err(Violation::MapIndex {
                        index: i.imm as u32,
                        maps: self.maps.len(),
                    });
                }
                if i.src != 0 && i.src != PSEUDO_MAP as usize {
                    return Err(Violation::LdImm64Source { src: i.src });
                }
                if i.off != 0 {
                    return Err(Violation::LdImm64Offset);
                }
                return Ok(2);
            }
            ebpf::LD_B_REG | ebpf::LD_H_REG | ebpf::LD_W_REG | ebpf::LD_DW_REG => {}
            ebpf::ST_B_IMM | ebpf::ST_H_IMM | ebpf::ST_W_IMM | ebpf::ST_DW_IMM => {}
            ebpf::ST_B_REG | ebpf::ST_H_REG | ebpf::ST_W_REG | ebpf::ST_DW_REG => {}
            ebpf::LE | ebpf::BE => {
                if !matches!(i.imm, 16 | 32 | 64) {
                    return Err(Violation::SwapWidth { width: i.imm });
                }
            }
            ebpf::CALL => {
                if i.src != 0 {
                    return Err(Violation::LocalCall);
                }
                if HelperId::from_imm(i.imm).is_none() {
                    return Err(Violation::UnknownHelper { id: i.imm });
                }
            }
            ebpf::EXIT | ebpf::JA => {}
            o if is_alu(o) || is_cond_jump(o) => {}
            o => {
                return Err(Violation::UnsupportedOpcode { opcode: o });
            }
        }
        // ALU instructions with a non-zero offset are eBPF v4 (signed division, sign-extending
        // moves), which rbpf would silently run as something else.
        if is_alu(i.opc) && i.off != 0 {
            return Err(Violation::AluOffset);
        }
        if let Some(target) = self.jump_target(i) {
            if target < 0 || target >= self.len as i64 {
                return Err(Violation::JumpOutside {
                    target,
                    len: self.len,
                });
            }
            if decode(self.code, target as usize).opc == 0 {
                return Err(Violation::JumpIntoLdImm64 { at: target - 1 });
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
    pub(super) fn find_loop(&self) -> Option<(usize, usize)> {
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
}
