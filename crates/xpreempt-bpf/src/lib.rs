//! Programmable policies for xpreempt: the seed's four eBPF hook points (`task_init`,
//! `schedule`, `work_submit`, `task_destroy`) run in a user-space eBPF VM (rbpf).
//!
//! - [`elf`] reads objects built by `clang -target bpf` (hook sections, legacy `maps`
//!   definitions, map relocations);
//! - [`verifier`] proves a program safe and bounded before it may run;
//! - [`maps`] holds hash and array maps, [`helpers`] the functions programs call;
//! - [`vm`] wraps rbpf (interpreter by default, JIT only for verified programs);
//! - [`policy`] ties an object's maps and programs together;
//! - [`hooks`] implements the scheduler's [`xpreempt_core::scheduler::Hooks`];
//! - [`ctx`] holds the context structs, shared with `include/xpreempt_bpf.h`;
//! - [`pin`] keeps an installed policy and its maps in a state directory for the CLI.

pub mod ctx;
pub mod elf;
pub mod helpers;
pub mod hooks;
pub mod maps;
pub mod policy;
pub mod verifier;
pub mod vm;

pub use ctx::Hook;
pub use hooks::BpfHooks;
pub use policy::{LoadError, LoadOptions, Policy};
pub use vm::ExecMode;
