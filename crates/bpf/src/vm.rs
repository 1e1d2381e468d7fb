//! One verified hook program inside rbpf: the interpreter by default, the x86-64 JIT on request
//! (only verified programs reach this type, and the JIT does no memory checks of its own).

use crate::ctx::Hook;
use crate::helpers::HelperId;
use crate::verifier::Verified;
use std::ops::Range;
use thiserror::Error;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecMode {
    #[default]
    Interpreter,
    Jit,
}

#[derive(Debug, Error)]
pub enum VmError {
    #[error("{hook}: rbpf refused the program")]
    Load {
        hook: Hook,
        #[source]
        source: std::io::Error,
    },
    #[error("{hook}: the JIT is not available here")]
    Jit {
        hook: Hook,
        #[source]
        source: std::io::Error,
    },
    #[error("{hook}: the JIT is not available here: rbpf's JIT targets x86-64 only")]
    JitUnsupported { hook: Hook },
    /// rbpf's message, with its instruction number corrected (see `renumber`): not its error
    /// as a source, whose text would name the wrong instruction.
    #[error("{hook}: the program failed at run time: {msg}")]
    Run { hook: Hook, msg: String },
    /// A panic's payload is text; there is no error value to keep.
    #[error("{hook}: the program failed at run time: the VM panicked: {msg}")]
    Panic { hook: Hook, msg: String },
}

/// The code, owned through a raw pointer so that the VM may borrow it for as long as it lives.
struct OwnedCode(*mut [u8]);

impl Drop for OwnedCode {
    fn drop(&mut self) {
        // SAFETY: the pointer came from Box::into_raw and is freed only here.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

/// rbpf's memory errors count the instruction after the faulting one (its counter has already
/// moved on); say which instruction it was, as the verifier numbers them.
fn renumber(msg: &str) -> String {
    let Some(at) = msg.find("(insn #") else {
        return msg.to_string();
    };
    let rest = &msg[at + 7..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<usize>() {
        Ok(n) if msg.contains("out of bounds memory") && n > 0 => format!(
            "{}(instruction {}{}",
            &msg[..at],
            n - 1,
            &rest[digits.len()..]
        ),
        _ => msg.to_string(),
    }
}

fn calls_helpers(code: &[u8]) -> bool {
    let mut pc = 0;
    while pc * 8 < code.len() {
        match code[pc * 8] {
            0x85 => return true,
            crate::elf::LD_DW_IMM => pc += 2,
            _ => pc += 1,
        }
    }
    false
}

pub struct HookProgram {
    // Field order matters: `vm` borrows `code` and must be dropped first.
    vm: rbpf::EbpfVmMbuff<'static>,
    code: OwnedCode,
    hook: Hook,
    mode: ExecMode,
    verified: Verified,
}

// SAFETY: the VM holds the code slice, helper function pointers, address ranges and (for the
// JIT) its executable memory, none tied to a thread; its one non-Send field is rbpf's stack
// usage calculator data, which we never set (it stays None). The code is owned by this struct.
unsafe impl Send for HookProgram {}

impl HookProgram {
    /// Wraps code the verifier accepted. `regions` are the map arenas the program may touch.
    pub fn new(
        hook: Hook,
        code: Vec<u8>,
        verified: Verified,
        regions: &[Range<u64>],
        mode: ExecMode,
    ) -> Result<Self, VmError> {
        let raw = Box::into_raw(code.into_boxed_slice());
        let owned = OwnedCode(raw);
        // SAFETY: `owned` keeps the allocation alive and unmodified until after `vm` is dropped
        // (field order); nothing else accesses it.
        let slice: &'static [u8] = unsafe { &*raw };
        let load = |source| VmError::Load { hook, source };
        let mut vm = rbpf::EbpfVmMbuff::new(Some(slice)).map_err(load)?;
        for h in HelperId::ALL {
            vm.register_helper(h as u32, h.function()).map_err(load)?;
        }
        for r in regions {
            vm.register_allowed_memory(r.clone());
        }
        // rbpf 0.4.1's x86-64 JIT calls helpers with the stack 8 bytes off the 16-byte alignment
        // the ABI requires, and Rust helpers then crash (SIGSEGV on aligned SSE stores). So the
        // JIT gets only programs that call no helper; the others stay on the interpreter.
        let mode = if mode == ExecMode::Jit && calls_helpers(slice) {
            tracing::info!(%hook, "calls helpers: runs on the interpreter, not the JIT");
            ExecMode::Interpreter
        } else {
            mode
        };
        if mode == ExecMode::Jit {
            Self::jit(&mut vm, hook)?;
        }
        Ok(Self {
            vm,
            code: owned,
            hook,
            mode,
            verified,
        })
    }

    #[cfg(all(target_arch = "x86_64", not(windows)))]
    fn jit(vm: &mut rbpf::EbpfVmMbuff<'static>, hook: Hook) -> Result<(), VmError> {
        vm.jit_compile()
            .map_err(|source| VmError::Jit { hook, source })
    }

    #[cfg(not(all(target_arch = "x86_64", not(windows))))]
    fn jit(_: &mut rbpf::EbpfVmMbuff<'static>, hook: Hook) -> Result<(), VmError> {
        Err(VmError::JitUnsupported { hook })
    }

    pub fn hook(&self) -> Hook {
        self.hook
    }

    pub fn verified(&self) -> Verified {
        self.verified
    }

    pub fn mode(&self) -> ExecMode {
        self.mode
    }

    pub fn code(&self) -> &[u8] {
        // SAFETY: the allocation lives as long as self and is never written.
        unsafe { &*self.code.0 }
    }

    /// Runs the program on `ctx` (r1 points to it). Helpers need [`crate::helpers::with_env`].
    pub fn run(&self, ctx: &mut [u8]) -> Result<u64, VmError> {
        let fail = |e: std::io::Error| VmError::Run {
            hook: self.hook,
            msg: renumber(&e.to_string()),
        };
        match self.mode {
            // rbpf writes through the context slice (its Raw VM passes its `&mut` on as `&[u8]`
            // the same way); the `&mut` borrow here keeps anyone else from seeing it meanwhile.
            ExecMode::Interpreter => self.vm.execute_program(ctx, &[]).map_err(fail),
            #[cfg(all(target_arch = "x86_64", not(windows)))]
            ExecMode::Jit => {
                // In rbpf's "mbuff" JIT, r1 is the metadata buffer: pass the context there. The
                // VM's lifetime is shortened (it is covariant) to the context's borrow.
                fn shorten<'s>(vm: &'s rbpf::EbpfVmMbuff<'static>) -> &'s rbpf::EbpfVmMbuff<'s> {
                    vm
                }
                let mut no_mem = [0u8; 0];
                // SAFETY: only verified programs are JIT-compiled: every memory access was proven
                // to stay inside the context, the stack or a map value.
                unsafe { shorten(&self.vm).execute_program_jit(&mut no_mem, ctx) }.map_err(fail)
            }
            #[cfg(not(all(target_arch = "x86_64", not(windows))))]
            ExecMode::Jit => Err(VmError::JitUnsupported { hook: self.hook }),
        }
    }
}
