//! The operator's side of the socket: lists, statistics and priority changes, as the CLI and
//! `xpreempt top` ask for them.

use crate::frame::{self, FrameError};
use crate::msg::{ClientMsg, DaemonMsg, DaemonStats, PolicyMap, QueueRow, Role, Target};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use thiserror::Error;
use xpreempt_types::{Hints, Priority};

#[derive(Debug, Error)]
pub enum OperatorError {
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
}

impl Operator {
    pub fn connect(path: &Path) -> Result<Self, OperatorError> {
        Self::connect_as(path, Role::Operator, "xpreempt")
    }

    /// A connection in another role that asks and is answered (the shim's RM hooks: `Role::Rm`).
    pub fn connect_as(path: &Path, role: Role, name: &str) -> Result<Self, OperatorError> {
        let mut stream = UnixStream::connect(path).map_err(|source| OperatorError::NoDaemon {
            path: path.to_path_buf(),
            source,
        })?;
        frame::write(
            &mut stream,
            &ClientMsg::Hello {
                version: crate::PROTOCOL_VERSION,
                role,
                name: name.into(),
            },
        )?;
        match frame::read::<DaemonMsg>(&mut stream)? {
            DaemonMsg::Ready => Ok(Self { stream }),
            DaemonMsg::Refused { reason } => Err(OperatorError::Refused(reason)),
            _ => Err(OperatorError::Unexpected),
        }
    }

    /// Bounds every later read and write (`None`: wait for ever), so that a stuck daemon cannot
    /// hold the caller.
    pub fn set_timeout(&self, limit: Option<std::time::Duration>) -> std::io::Result<()> {
        self.stream.set_read_timeout(limit)?;
        self.stream.set_write_timeout(limit)
    }

    /// Sends a message the daemon does not answer.
    pub fn tell(&mut self, msg: &ClientMsg) -> Result<(), OperatorError> {
        Ok(frame::write(&mut self.stream, msg)?)
    }

    pub fn ask(&mut self, msg: &ClientMsg) -> Result<DaemonMsg, OperatorError> {
        frame::write(&mut self.stream, msg)?;
        match frame::read::<DaemonMsg>(&mut self.stream)? {
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
