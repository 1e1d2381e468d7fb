//! A deterministic discrete-event model of AMD GPU queue hardware, as the seeds describe it:
//! AQL packets in user-mode rings with doorbells and completion signals ([`aql`], [`ring`]),
//! CPSCH's HQD allocator ([`cpsch`]), MQD/HQD mapping through runlists with oversubscription and
//! multi-XCC ([`hws`]), compute units executing workgroups ([`compute`], [`packet_processor`]), CWSR
//! preemption ([`cwsr`]), the KFD-style calls ([`kfd`]) and Scheme A, an in-driver monitor
//! ([`scheme_a`]). [`hal`] is the model seen through xpreempt's HAL; Scheme B (the core's
//! scheduler driving it) and the scenario tooling live in `xpreempt-sim`.

pub mod aql;
pub mod compute;
pub mod config;
pub mod cpsch;
pub mod cwsr;
pub mod device;
pub mod error;
pub mod hal;
pub mod hws;
pub mod kfd;
pub mod packet_processor;
pub mod ring;
pub mod rng;
pub mod scheme_a;
pub mod sim;
pub mod trace;
pub mod unmap;

pub use config::{CwsrCost, GpuConfig, KernelCode};
pub use device::{Gpu, GpuStats, HqdStats, MqdState};
pub use error::ModelError;
pub use hal::{AmdHal, AmdKernel};
pub use kfd::{Caller, QueueProps};
pub use unmap::DestroyMode;
