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

mod bits;
pub mod board;
pub mod costs;
pub mod frame;
mod gpu_words;
mod mapping;
pub mod msg;
pub mod names;
pub mod operator;
pub mod shm;
pub mod unix;

use std::path::PathBuf;

/// Bumped whenever a message or the segment layout changes incompatibly.
pub const PROTOCOL_VERSION: u32 = 7;

/// The system daemon's socket (the systemd unit's).
pub const SYSTEM_SOCKET: &str = "/run/xpreempt/xpreempt.sock";

/// Where a daemon listens by default: `$XPREEMPT_SOCKET`, else `$XDG_RUNTIME_DIR/xpreempt.sock`
/// (a user's own daemon), else [`SYSTEM_SOCKET`].
pub fn daemon_socket() -> PathBuf {
    if let Some(p) = std::env::var_os("XPREEMPT_SOCKET") {
        return PathBuf::from(p);
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("xpreempt.sock"),
        None => PathBuf::from(SYSTEM_SOCKET),
    }
}

/// Where a client looks for the daemon: `$XPREEMPT_SOCKET`, else the user's own daemon's socket
/// where one exists, else the system daemon's where that exists (so that a system daemon is
/// found without a setting), else the user's path.
pub fn default_socket() -> PathBuf {
    client_socket(
        std::env::var_os("XPREEMPT_SOCKET").is_some(),
        daemon_socket(),
        std::path::Path::new(SYSTEM_SOCKET),
    )
}

fn client_socket(explicit: bool, own: PathBuf, system: &std::path::Path) -> PathBuf {
    if !explicit && !own.exists() && system.exists() {
        system.to_path_buf()
    } else {
        own
    }
}

#[cfg(test)]
mod socket_tests {
    use super::client_socket;

    #[test]
    fn a_client_finds_the_system_daemon_when_the_user_has_none() {
        let dir = std::env::temp_dir().join(format!("xp-sock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (own, system) = (dir.join("own.sock"), dir.join("system.sock"));
        assert_eq!(
            client_socket(false, own.clone(), &system),
            own,
            "neither exists"
        );
        std::fs::write(&system, b"").unwrap();
        assert_eq!(client_socket(false, own.clone(), &system), system);
        assert_eq!(
            client_socket(true, own.clone(), &system),
            own,
            "XPREEMPT_SOCKET wins"
        );
        std::fs::write(&own, b"").unwrap();
        assert_eq!(
            client_socket(false, own.clone(), &system),
            own,
            "the user's own first"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
