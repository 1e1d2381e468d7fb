//! Encoding checks and the loop check: what rbpf must never meet.

use super::*;

impl Checker<'_> {
    /// Checks one instruction's encoding; returns how many 8-byte slots it takes.
    pub(super) fn syntax(&self, i: Insn) -> Res<usize> {
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
