//! What the daemon's threads share: its configuration and, behind locks, its state, its open
//! connections and their admission; and how errors are told to clients and logs.

use crate::state::State;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Which scheduler each device runs.
#[derive(Clone, Debug)]
pub enum PolicySpec {
    /// A built-in policy by name (`hpf`, `fifo`, …).
    Rust(String),
    /// An eBPF program at the four hooks, over a built-in base policy.
    Bpf { object: PathBuf, base: String },
}

impl std::fmt::Display for PolicySpec {
    /// What operators are told runs: `hpf`, or `FILE.o (eBPF) over hpf`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicySpec::Rust(name) => f.write_str(name),
            PolicySpec::Bpf { object, base } => {
                write!(f, "{} (eBPF) over {base}", object.display())
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub socket: PathBuf,
    /// The socket file's mode (default 0666: every local user may connect; permissions on
    /// queues are checked per request).
    pub socket_mode: u32,
    /// Give the socket to this group (with a mode like 0660 to admit only its members).
    pub socket_group: Option<u32>,
    pub policy: PolicySpec,
    /// How long an agent may stay silent while it has work before the watchdog acts.
    pub watchdog: Duration,
    /// Prometheus text exposition on this (loopback) address.
    pub metrics: Option<SocketAddr>,
    /// Start and own an MPS control daemon with its pipe and log directories here.
    pub mps: Option<PathBuf>,
    /// Write a timeline of queue states and suspensions here ([`crate::trace`]).
    pub trace: Option<PathBuf>,
    /// What clients can make the daemon hold.
    pub limits: crate::limits::Limits,
}

impl Config {
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            socket_mode: 0o666,
            socket_group: None,
            policy: PolicySpec::Rust("hpf".into()),
            watchdog: Duration::from_millis(500),
            metrics: None,
            mps: None,
            trace: None,
            limits: crate::limits::Limits::default(),
        }
    }
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Every open connection, so that a stop closes them as a dying daemon's would be.
    pub(crate) connections: Mutex<std::collections::BTreeMap<u64, UnixStream>>,
    pub(crate) next_connection: std::sync::atomic::AtomicU64,
    /// Open connections in all and per user, against `config.limits`.
    pub(crate) admission: Mutex<crate::limits::Connections>,
    /// Wakes the ticker when a decision moved the next timer earlier, or at shutdown.
    pub(crate) ticker: Condvar,
    pub(crate) shutdown: AtomicBool,
    pub(crate) config: Config,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    pub(crate) fn admission(&self) -> MutexGuard<'_, crate::limits::Connections> {
        self.admission.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}
