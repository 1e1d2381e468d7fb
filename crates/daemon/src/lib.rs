//! `xpreemptd`: global mode's daemon. One scheduler per device schedules the queues of every
//! process that runs an agent (`xpreempt-agent`).
//!
//! - The socket ([`server`]) takes registrations, hints, priority changes and operator requests,
//!   and checks who may change what (`SO_PEERCRED`).
//! - Each agent gets a shared segment; one thread per agent sleeps on its doorbell and runs the
//!   decision the moment a queue's state changes ([`state::State::take_reports`]); commands go
//!   back through the segment. The socket is not on that path.
//! - The fast path: the agents of one user also share a board, on which a queue that gets work
//!   stops the queues below it in the policy's order before the daemon decides; the daemon writes
//!   who preempts whom after every decision, confirms, and overrules (`state::fast`).
//! - A client that exits, crashes or is killed closes its socket: its queues leave the scheduler
//!   and whatever was suspended for them resumes at once. One that stops beating while it has
//!   work is taken out of contention by the watchdog.
//! - Malformed, truncated, oversized or wrong-version frames close that connection only.
//! - What a client can make the daemon hold is bounded ([`limits`]): connections, queues,
//!   devices, change rates, idle and stalled connections; refusals are counted by reason.
//! - With `--mps` it owns an MPS control daemon in private directories ([`mps`]) and tells
//!   clients where it is.

pub mod cli;
mod conn;
pub mod costs;
pub mod limits;
mod metrics;
pub mod mps;
mod remote;
mod requests;
pub mod server;
mod shared;
pub mod state;
pub mod trace;

pub use server::{Config, Daemon, DaemonError, PolicySpec};
