//! Programmable policies for xpreempt: four eBPF hook points (`task_init`,
//! `schedule`, `work_submit`, `task_destroy`) run in a user-space eBPF VM (rbpf).
//!
//! - [`elf`] reads objects built by `clang -target bpf` (hook sections, legacy `maps`
//!   definitions, map relocations);
//! - [`verifier`] proves a program safe and bounded before it may run;
//! - [`maps`] holds hash and array maps, [`helpers`] the functions programs call;
//! - [`vm`] wraps rbpf (interpreter by default, JIT only for verified programs);
//! - [`program`] ties an object's maps and programs together;
//! - [`hooks`] implements the scheduler's [`xpreempt_core::sched::Hooks`];
//! - [`ctx`] holds the context structs, shared with `include/xpreempt_bpf.h`;
//! - [`pin`] keeps an installed policy and its maps in a state directory for the CLI;
//! - [`rm`] runs the hooks at the NVIDIA driver's channel-group events (the shim's RM hooks).

pub mod ctx;
pub mod elf;
pub mod helpers;
pub mod hooks;
pub mod maps;
pub mod pin;
pub mod program;
pub mod rm;
pub mod verifier;
pub mod vm;

pub use ctx::Hook;
pub use hooks::{BpfHooks, HookRun};
pub use program::{BpfProgram, LoadError, LoadOptions, ProgramInfo};
pub use vm::ExecMode;

/// Where the build put `policies/*.c` and `tests/bpf/*.c` compiled with clang.
pub const BUILT_OBJECT_DIR: &str = env!("XPREEMPT_BPF_OBJ_DIR");

/// The object `NAME.o` the build compiled from `policies/NAME.c` (or a test program), or why
/// there is none (clang missing, a compile error).
pub fn built_object(name: &str) -> Result<std::path::PathBuf, NotBuilt> {
    let path = std::path::Path::new(BUILT_OBJECT_DIR).join(format!("{name}.o"));
    if path.is_file() {
        return Ok(path);
    }
    Err(NotBuilt {
        path,
        clang_error: env!("XPREEMPT_BPF_CLANG_ERROR"),
    })
}

/// An object the build did not compile; `clang_error` is what clang said, if it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotBuilt {
    pub path: std::path::PathBuf,
    pub clang_error: &'static str,
}

impl std::fmt::Display for NotBuilt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} was not built", self.path.display())?;
        if !self.clang_error.is_empty() {
            write!(f, " ({})", self.clang_error)?;
        }
        write!(
            f,
            "; the eBPF objects need clang (apt-get install -y clang), then rebuild"
        )
    }
}

impl std::error::Error for NotBuilt {}
