//! The operator's side of the socket: lists, statistics and priority changes, as the CLI and
//! `xpreempt top` ask for them.
//!
//! Every wait on the daemon is bounded: connecting, its answer to Hello and each answer after
//! ([`OPERATOR_TIMEOUT`] for operator commands, [`APPLICATION_TIMEOUT`] for code that runs
//! inside an application, such as the shim's RM hooks), so that a stopped or overloaded daemon
//! makes a command fail with [`OperatorError::Timeout`] instead of hanging.

use crate::frame::{self, FrameError};
use crate::msg::{ClientMsg, DaemonMsg, DaemonStats, PolicyMap, QueueRow, Role, Target};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;
use xpreempt_types::{Hints, Priority};

/// How long an operator command waits for the daemon at each step.
pub const OPERATOR_TIMEOUT: Duration = Duration::from_secs(5);

/// How long code inside an application waits for the daemon at each step: past it the
/// application goes on without the daemon.
pub const APPLICATION_TIMEOUT: Duration = Duration::from_millis(100);

#[derive(Debug, Error)]
pub enum OperatorError {
    #[error(
        "the daemon at {path} did not answer within {} ms (it is stopped, hung or overloaded)",
        limit.as_millis()
    )]
    Timeout { path: PathBuf, limit: Duration },
    #[error("no xpreempt daemon at {path} (start one with `xpreemptd` or `xpreempt daemon`)")]
    NoDaemon {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the daemon refused: {0}")]
    Refused(String),
    #[error("the daemon answered with an unexpected message")]
    Unexpected,
    #[error("talking to the daemon")]
    Frame(#[from] FrameError),
}

pub struct Operator {
    stream: UnixStream,
    path: PathBuf,
    limit: Duration,
}

impl Operator {
    /// An operator's connection, every wait bounded by [`OPERATOR_TIMEOUT`].
    pub fn connect(path: &Path) -> Result<Self, OperatorError> {
        Self::connect_within(path, Role::Operator, "xpreempt", OPERATOR_TIMEOUT)
    }

    /// A connection in another role that asks and is answered (the shim's RM hooks: `Role::Rm`,
    /// bounded by [`APPLICATION_TIMEOUT`] since it runs inside an application).
    pub fn connect_as(path: &Path, role: Role, name: &str) -> Result<Self, OperatorError> {
        let limit = match role {
            Role::Operator => OPERATOR_TIMEOUT,
            Role::Agent | Role::Rm => APPLICATION_TIMEOUT,
        };
        Self::connect_within(path, role, name, limit)
    }

    /// Connects and says hello within `limit` in all; each later answer is awaited for at most
    /// `limit` too.
    pub fn connect_within(
        path: &Path,
        role: Role,
        name: &str,
        limit: Duration,
    ) -> Result<Self, OperatorError> {
        let started = Instant::now();
        let timeout = || OperatorError::Timeout {
            path: path.to_path_buf(),
            limit,
        };
        let stream = crate::unix::connect_within(path, limit).map_err(|source| {
            if crate::unix::is_timeout(&source) {
                timeout()
            } else {
                OperatorError::NoDaemon {
                    path: path.to_path_buf(),
                    source,
                }
            }
        })?;
        let mut op = Self {
            stream,
            path: path.to_path_buf(),
            limit,
        };
        op.tell(&ClientMsg::Hello {
            version: crate::PROTOCOL_VERSION,
            role,
            name: name.into(),
        })?;
        let reply = op.read();
        // The handshake had `limit` in all; every answer after it has `limit` of its own.
        if started.elapsed() < limit {
            op.set_timeout(Some(limit)).map_err(|_| timeout())?;
        }
        match reply? {
            DaemonMsg::Ready => Ok(op),
            DaemonMsg::Refused { reason } => Err(OperatorError::Refused(reason)),
            _ => Err(OperatorError::Unexpected),
        }
    }

    /// Bounds every later read and write (`None`: wait for ever), so that a stuck daemon cannot
    /// hold the caller.
    pub fn set_timeout(&self, limit: Option<Duration>) -> std::io::Result<()> {
        self.stream.set_read_timeout(limit)?;
        self.stream.set_write_timeout(limit)
    }

    /// A frame error, with a read or write that ran out of time said as such.
    fn frame_error(&self, e: FrameError) -> OperatorError {
        match e {
            FrameError::Io(io) if crate::unix::is_timeout(&io) => OperatorError::Timeout {
                path: self.path.clone(),
                limit: self
                    .stream
                    .read_timeout()
                    .ok()
                    .flatten()
                    .unwrap_or(self.limit),
            },
            e => OperatorError::Frame(e),
        }
    }

    fn read(&mut self) -> Result<DaemonMsg, OperatorError> {
        frame::read::<DaemonMsg>(&mut self.stream).map_err(|e| self.frame_error(e))
    }

    /// Sends a message the daemon does not answer.
    pub fn tell(&mut self, msg: &ClientMsg) -> Result<(), OperatorError> {
        frame::write(&mut self.stream, msg).map_err(|e| self.frame_error(e))
    }

    pub fn ask(&mut self, msg: &ClientMsg) -> Result<DaemonMsg, OperatorError> {
        self.tell(msg)?;
        match self.read()? {
            DaemonMsg::Refused { reason } => Err(OperatorError::Refused(reason)),
            reply => Ok(reply),
        }
    }

    pub fn list(&mut self) -> Result<Vec<QueueRow>, OperatorError> {
        match self.ask(&ClientMsg::List)? {
            DaemonMsg::List(rows) => Ok(rows),
            _ => Err(OperatorError::Unexpected),
        }
    }

    pub fn stats(&mut self) -> Result<DaemonStats, OperatorError> {
        match self.ask(&ClientMsg::Stats)? {
            DaemonMsg::Stats(s) => Ok(s),
            _ => Err(OperatorError::Unexpected),
        }
    }

    /// What stopping and restarting cost on each device, by mechanism.
    pub fn costs(&mut self) -> Result<Vec<crate::costs::DeviceCosts>, OperatorError> {
        match self.ask(&ClientMsg::Costs)? {
            DaemonMsg::Costs(c) => Ok(c),
            _ => Err(OperatorError::Unexpected),
        }
    }

    /// The maps of the eBPF program each device runs (empty without one).
    pub fn policy_maps(&mut self) -> Result<Vec<PolicyMap>, OperatorError> {
        match self.ask(&ClientMsg::PolicyMaps)? {
            DaemonMsg::PolicyMaps(m) => Ok(m),
            _ => Err(OperatorError::Unexpected),
        }
    }

    /// Stores (or with `None` deletes) a key in a map on every device; returns how many changed.
    pub fn policy_map_update(
        &mut self,
        map: &str,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    ) -> Result<u32, OperatorError> {
        let msg = ClientMsg::PolicyMapUpdate {
            map: map.to_string(),
            key,
            value,
        };
        match self.ask(&msg)? {
            DaemonMsg::Done { changed } => Ok(changed),
            _ => Err(OperatorError::Unexpected),
        }
    }

    /// Returns how many queues changed.
    pub fn set_hints(&mut self, target: Target, hints: Hints) -> Result<u32, OperatorError> {
        match self.ask(&ClientMsg::SetHints { target, hints })? {
            DaemonMsg::Done { changed } => Ok(changed),
            _ => Err(OperatorError::Unexpected),
        }
    }

    /// Returns how many queues changed.
    pub fn set_priority(
        &mut self,
        target: Target,
        priority: Priority,
    ) -> Result<u32, OperatorError> {
        match self.ask(&ClientMsg::SetPriority { target, priority })? {
            DaemonMsg::Done { changed } => Ok(changed),
            _ => Err(OperatorError::Unexpected),
        }
    }
}
