//! A deterministic discrete-event model of AMD GPU queue hardware, as the seeds describe it:
//! AQL packets in user-mode rings with doorbells and completion signals ([`aql`], [`ring`]),
//! CPSCH's HQD allocator ([`cpsch`]), MQD/HQD mapping through runlists with oversubscription and
//! multi-XCC ([`hws`]), compute units executing workgroups ([`compute`], [`packet_processor`]), CWSR
//! preemption ([`cwsr`]) and the KFD-style calls ([`kfd`]). On top run the seed's Scheme A
//! monitor ([`scheme_a`]) and Scheme B, the core scheduler driving the model through the HAL
//! ([`scheme_b`]). [`runner`] plays a [`scenario`] under each mode and [`report`] compares them.

pub mod aql;
pub mod compute;
pub mod config;
pub mod cpsch;
pub mod cwsr;
pub mod device;
pub mod error;
pub mod hws;
pub mod kfd;
pub mod packet_processor;
pub mod report;
pub mod ring;
pub mod rng;
pub mod runner;
pub mod scenario;
pub mod scheme_a;
pub mod scheme_b;
pub mod sim;
pub mod trace;

pub use config::{CwsrCost, GpuConfig, KernelCode};
pub use cwsr::DestroyMode;
pub use device::{Gpu, GpuStats, MqdState};
pub use error::ModelError;
pub use kfd::{Caller, QueueProps};
