//! Commands a front end submits to an XQueue.
//!
//! A command is backend-neutral except for the kernel payload `P`, which each backend defines
//! (a CUDA function and its arguments, an AQL dispatch packet, a simulated duration). The
//! properties decide what each preemption level may do with the command.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Position of a command in its queue, counted from 0 at queue creation. Completion is reported
/// as a watermark over these numbers because a queue completes in submission order.
pub type Seq = u64;

/// Identifies an event shared between queues (record on one, wait on another).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventId(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyDirection {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// What a level may do with a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandProps {
    /// Running it again gives the same result, so a reset-style preemption may redo it.
    pub idempotent: bool,
    /// Lv2 may stop it part-way and finish it later (a kernel built with the preemption guard,
    /// or a kernel in a queue the hardware can unmap).
    pub deactivatable: bool,
    /// The host waits for it (a synchronous copy, a host callback); a suspension that holds it
    /// back stalls the caller too.
    pub blocking: bool,
}

impl CommandProps {
    pub const fn new(idempotent: bool, deactivatable: bool, blocking: bool) -> Self {
        Self {
            idempotent,
            deactivatable,
            blocking,
        }
    }
}

/// Host-side work run in queue order.
pub type HostFn = Box<dyn FnOnce() + Send + Sync + 'static>;

pub enum Op<P> {
    Kernel(P),
    Memcpy {
        dst: u64,
        src: u64,
        bytes: u64,
        direction: CopyDirection,
    },
    Memset {
        dst: u64,
        value: u8,
        bytes: u64,
    },
    EventRecord(EventId),
    EventWait(EventId),
    HostCallback(HostFn),
    /// Every earlier command of the queue completes before any later one starts.
    Barrier,
}

/// The kind of an [`Op`], without its data; what policies and hooks see.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u32)]
pub enum OpKind {
    Kernel = 0,
    Memcpy = 1,
    Memset = 2,
    EventRecord = 3,
    EventWait = 4,
    HostCallback = 5,
    Barrier = 6,
}

impl<P> Op<P> {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Kernel(_) => OpKind::Kernel,
            Op::Memcpy { .. } => OpKind::Memcpy,
            Op::Memset { .. } => OpKind::Memset,
            Op::EventRecord(_) => OpKind::EventRecord,
            Op::EventWait(_) => OpKind::EventWait,
            Op::HostCallback(_) => OpKind::HostCallback,
            Op::Barrier => OpKind::Barrier,
        }
    }

    /// The properties a command of this kind has unless the submitter says otherwise.
    pub fn default_props(&self) -> CommandProps {
        match self {
            // A plain kernel may write what it reads; only the backend or the submitter knows
            // better (guard-built kernels, kernels declared idempotent).
            Op::Kernel(_) => CommandProps::new(false, false, false),
            Op::Memcpy { direction, .. } => CommandProps::new(
                true,
                false,
                matches!(direction, CopyDirection::DeviceToHost),
            ),
            Op::Memset { .. } => CommandProps::new(true, false, false),
            Op::EventRecord(_) | Op::EventWait(_) | Op::Barrier => {
                CommandProps::new(true, false, false)
            }
            Op::HostCallback(_) => CommandProps::new(false, false, true),
        }
    }
}

pub struct Command<P> {
    pub op: Op<P>,
    pub props: CommandProps,
}

impl<P> Command<P> {
    /// A command with the default properties of its kind.
    pub fn new(op: Op<P>) -> Self {
        let props = op.default_props();
        Self { op, props }
    }

    pub fn kernel(payload: P) -> Self {
        Self::new(Op::Kernel(payload))
    }

    pub fn with_props(mut self, props: CommandProps) -> Self {
        self.props = props;
        self
    }

    pub fn kind(&self) -> OpKind {
        self.op.kind()
    }
}

impl<P: fmt::Debug> fmt::Debug for Op<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Kernel(p) => f.debug_tuple("Kernel").field(p).finish(),
            Op::Memcpy {
                dst,
                src,
                bytes,
                direction,
            } => f
                .debug_struct("Memcpy")
                .field("dst", dst)
                .field("src", src)
                .field("bytes", bytes)
                .field("direction", direction)
                .finish(),
            Op::Memset { dst, value, bytes } => f
                .debug_struct("Memset")
                .field("dst", dst)
                .field("value", value)
                .field("bytes", bytes)
                .finish(),
            Op::EventRecord(e) => f.debug_tuple("EventRecord").field(e).finish(),
            Op::EventWait(e) => f.debug_tuple("EventWait").field(e).finish(),
            Op::HostCallback(_) => f.write_str("HostCallback"),
            Op::Barrier => f.write_str("Barrier"),
        }
    }
}

impl<P: fmt::Debug> fmt::Debug for Command<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Command")
            .field("op", &self.op)
            .field("props", &self.props)
            .finish()
    }
}

/// A command the XQueue has launched and not yet seen complete: an entry of the in-flight log
/// that Lv2/Lv3 hand back to the HAL on resume.
#[derive(Debug)]
pub struct Launched<P> {
    pub seq: Seq,
    pub command: Command<P>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_props_follow_the_kind() {
        let k: Command<()> = Command::kernel(());
        assert_eq!(k.props, CommandProps::new(false, false, false));
        let d2h: Command<()> = Command::new(Op::Memcpy {
            dst: 0,
            src: 0,
            bytes: 8,
            direction: CopyDirection::DeviceToHost,
        });
        assert!(d2h.props.blocking && d2h.props.idempotent);
        let cb: Command<()> = Command::new(Op::HostCallback(Box::new(|| {})));
        assert_eq!(cb.kind(), OpKind::HostCallback);
        assert!(cb.props.blocking && !cb.props.idempotent);
    }
}
