//! The wire of global mode, shared by the daemon (`xpreemptd`) and the agent in each process.
//!
//! Two channels, because they have different jobs:
//! - the Unix socket carries [`frame`]s — length-prefixed `postcard` messages ([`msg`]) that
//!   start with the protocol version — for registration, hints, operator requests and control;
//! - a shared-memory segment per client ([`shm`]) carries the hot path: each queue's Ready/Idle
//!   state (agent → daemon) and run/suspend command (daemon → agent) as words, with futex
//!   wake-ups, so a decision crosses processes without a system call on the socket.
//!
//! [`unix`] passes the segment's file descriptor (`SCM_RIGHTS`) and reads peer credentials.
//!
//! The fast path ([`board`]): the agents of one user also share a board on which a queue that
//! gets work stops the queues it preempts directly; the daemon writes who preempts whom and
//! confirms or overrules.

pub mod board;
pub mod frame;
mod mapping;
pub mod msg;
pub mod names;
pub mod operator;
pub mod shm;
pub mod unix;

use std::path::PathBuf;

/// Bumped whenever a message or the segment layout changes incompatibly.
pub const PROTOCOL_VERSION: u32 = 4;

/// Where the daemon listens: `$XPREEMPT_SOCKET`, else `$XDG_RUNTIME_DIR/xpreempt.sock`, else
/// `/run/xpreempt/xpreempt.sock`.
pub fn default_socket() -> PathBuf {
    if let Some(p) = std::env::var_os("XPREEMPT_SOCKET") {
        return PathBuf::from(p);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("xpreempt.sock");
    }
    PathBuf::from("/run/xpreempt/xpreempt.sock")
}
