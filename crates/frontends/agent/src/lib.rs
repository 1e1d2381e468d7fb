//! The agent: the part of global mode inside each application process (linked by the shim, the
//! client library and tests).
//!
//! It registers the process's queues with `xpreemptd` and then stays off the socket: a queue's
//! Ready/Idle goes into its slot of the shared segment and rings the daemon; a control thread
//! sleeps on the other doorbell and applies the daemon's suspend/resume to the local queues.
//! With no daemon the agent schedules the process's queues itself (`LocalScheduler`), says so
//! once, and connects when a daemon appears. If the daemon dies, the agent resumes whatever the
//! daemon held suspended at once and runs locally until it returns.

mod control;
mod sink;

use control::Control;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use thiserror::Error;
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{QueueInfo, SchedError, Scheduler};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{QueueConfig, QueueId, XQueue, policy};
use xpreempt_hal::HwQueue;
use xpreempt_ipc::frame::{self, FrameError};
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, QueueDecl, Role};
use xpreempt_ipc::shm::{SLOTS, Segment, ShmError};
use xpreempt_ipc::unix::recv_fd;

pub use xpreempt_ipc::msg::QueueDecl as Declaration;

#[derive(Debug, Error)]
pub enum AgentError {
    #[error("this process already has {SLOTS} queues")]
    TooManyQueues,
    #[error("the daemon refused: {0}")]
    Refused(String),
    #[error("the daemon answered with an unexpected message")]
    Unexpected,
    #[error("talking to the daemon")]
    Frame(#[from] FrameError),
    #[error("the daemon's shared segment")]
    Shm(#[from] ShmError),
    #[error("receiving the shared segment")]
    Io(#[from] std::io::Error),
    #[error("local scheduler")]
    Local(#[from] SchedError),
    #[error("policy")]
    Policy(#[from] policy::UnknownPolicy),
}

/// Where the agent schedules: through the daemon, or by itself.
pub(crate) enum Mode {
    Remote(Connection),
    Local,
}

pub(crate) struct Connection {
    pub stream: Mutex<UnixStream>,
    pub segment: Arc<Segment>,
}

pub(crate) struct Entry {
    pub queue: Arc<dyn Preemptible>,
    pub decl: QueueDecl,
    /// The daemon's id for the queue while connected.
    pub remote: Option<QueueId>,
    /// The last command generation applied, and whether it left the queue suspended.
    pub applied: u64,
    pub suspended: bool,
}

pub(crate) struct Inner {
    pub mode: RwLock<Mode>,
    pub queues: Mutex<Vec<Option<Entry>>>,
    /// Each queue's newest Ready/Idle report as a slot word, kept in both modes so that a switch
    /// hands the other scheduler the queue's current state.
    pub reports: Vec<AtomicU64>,
    pub local: LocalScheduler,
    pub local_sink: xpreempt_core::xqueue::threaded::EventSink,
    /// Whether the scheduler in charge wants work reports (see `sink::mirror_wants_work`).
    pub wants_work: Arc<AtomicBool>,
    pub socket: PathBuf,
    pub name: String,
    pub shutdown: AtomicBool,
    /// Said once: the process runs without a daemon.
    pub said_local: AtomicBool,
}

impl Inner {
    pub fn lock_queues(&self) -> MutexGuard<'_, Vec<Option<Entry>>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Options {
    pub socket: PathBuf,
    /// The policy of the local scheduler used while no daemon answers.
    pub local_policy: String,
    pub name: String,
    /// How long the control thread spins on its doorbell before sleeping
    /// (`XPREEMPT_AGENT_SPIN_US`, default 20 µs): longer answers the daemon sooner and costs CPU.
    pub spin: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            socket: xpreempt_ipc::default_socket(),
            local_policy: "hpf".into(),
            name: std::env::args()
                .next()
                .and_then(|a| {
                    std::path::Path::new(&a)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                })
                .unwrap_or_else(|| "process".into()),
            spin: Duration::from_micros(
                std::env::var("XPREEMPT_AGENT_SPIN_US")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(20),
            ),
        }
    }
}

/// A process's connection to global mode. Queues made with [`Agent::queue`] are scheduled by
/// the daemon while one runs, else locally.
pub struct Agent {
    inner: Arc<Inner>,
    control: Option<JoinHandle<()>>,
}

impl Agent {
    pub fn start(options: Options) -> Result<Self, AgentError> {
        let local = LocalScheduler::start(Scheduler::new(policy::by_name(&options.local_policy)?))?;
        let inner = Arc::new(Inner {
            mode: RwLock::new(Mode::Local),
            queues: Mutex::new((0..SLOTS).map(|_| None).collect()),
            reports: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            local_sink: local.sink(),
            wants_work: Arc::new(AtomicBool::new(false)),
            local,
            socket: options.socket,
            name: options.name,
            shutdown: AtomicBool::new(false),
            said_local: AtomicBool::new(false),
        });
        match connect(&inner) {
            Ok(conn) => *inner.mode.write().unwrap_or_else(|p| p.into_inner()) = Mode::Remote(conn),
            Err(e) => control::say_local(&inner, &e),
        }
        let control = Control::start(inner.clone(), options.spin)?;
        Ok(Self {
            inner,
            control: Some(control),
        })
    }

    /// Whether the daemon schedules this process's queues now.
    pub fn is_remote(&self) -> bool {
        matches!(
            *self.inner.mode.read().unwrap_or_else(|p| p.into_inner()),
            Mode::Remote(_)
        )
    }

    /// The daemon's id of a queue while connected.
    pub fn remote_id(&self, queue: QueueId) -> Option<QueueId> {
        self.inner
            .lock_queues()
            .get(queue.0 as usize)
            .and_then(|e| e.as_ref())
            .and_then(|e| e.remote)
    }

    /// Makes a preemptible queue over `hal` and registers it (with the daemon, or locally).
    pub fn queue<H>(
        &self,
        decl: QueueDecl,
        config: QueueConfig,
        hal: H,
    ) -> Result<Arc<SharedXQueue<H>>, AgentError>
    where
        H: HwQueue + Send + Sync + 'static,
        H::Payload: Send + 'static,
    {
        // Lock order everywhere: mode, then queues.
        let mode = self.inner.mode.read().unwrap_or_else(|p| p.into_inner());
        let mut queues = self.inner.lock_queues();
        let slot = queues
            .iter()
            .position(|e| e.is_none())
            .ok_or(AgentError::TooManyQueues)?;
        let id = QueueId(slot as u32);
        self.inner.reports[slot].store(0, Ordering::SeqCst);
        let max = hal.max_level();
        let shared = Arc::new(SharedXQueue::new(
            XQueue::new(id, config, max),
            hal,
            Some(sink::sink(&self.inner)),
        ));
        let mut entry = Entry {
            queue: shared.clone(),
            decl,
            remote: None,
            applied: 0,
            suspended: false,
        };
        match &*mode {
            Mode::Remote(conn) => {
                entry.remote = Some(register_remote(conn, slot as u32, &entry.decl, 0)?)
            }
            Mode::Local => self
                .inner
                .local
                .register(local_info(id, &entry.decl), entry.queue.clone())?,
        }
        drop(mode);
        queues[slot] = Some(entry);
        drop(queues);
        // Registering may have given the device its hooks: they see this queue's first command.
        sink::mirror_wants_work(&self.inner);
        Ok(shared)
    }

    /// The queue is going away: the scheduler forgets it and its slot is free again.
    pub fn remove(&self, queue: QueueId) {
        let mode = self.inner.mode.read().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = self
            .inner
            .lock_queues()
            .get_mut(queue.0 as usize)
            .and_then(Option::take)
        else {
            return;
        };
        match (&*mode, entry.remote) {
            (Mode::Remote(conn), Some(remote)) => {
                let _ = request(conn, &ClientMsg::Unregister { queue: remote });
            }
            _ => self.inner.local.unregister(queue),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        if let Mode::Remote(conn) = &*self.inner.mode.read().unwrap_or_else(|p| p.into_inner()) {
            conn.segment.header().to_agent.ring();
        }
        if let Some(t) = self.control.take() {
            let _ = t.join();
        }
    }
}

pub(crate) fn local_info(id: QueueId, decl: &QueueDecl) -> QueueInfo {
    QueueInfo {
        id,
        process: std::process::id(),
        device: decl.device,
        priority: decl.priority,
        hints: decl.hints,
        interleave: decl.interleave,
    }
}

/// Connects, says hello as an agent and maps the segment the daemon hands over.
pub(crate) fn connect(inner: &Inner) -> Result<Connection, AgentError> {
    let mut stream = UnixStream::connect(&inner.socket)?;
    frame::write(
        &mut stream,
        &ClientMsg::Hello {
            version: xpreempt_ipc::PROTOCOL_VERSION,
            role: Role::Agent,
            name: inner.name.clone(),
        },
    )?;
    match frame::read::<DaemonMsg>(&mut stream)? {
        DaemonMsg::Welcome { .. } => {}
        DaemonMsg::Refused { reason } => return Err(AgentError::Refused(reason)),
        _ => return Err(AgentError::Unexpected),
    }
    let segment = Arc::new(Segment::open(recv_fd(&stream)?)?);
    Ok(Connection {
        stream: Mutex::new(stream),
        segment,
    })
}

/// Registers slot `slot` with the daemon, publishing the queue's current report first.
pub(crate) fn register_remote(
    conn: &Connection,
    slot: u32,
    decl: &QueueDecl,
    report: u64,
) -> Result<QueueId, AgentError> {
    if let Some(s) = conn.segment.slot(slot) {
        s.report.store(report, Ordering::SeqCst);
        s.applied.store(0, Ordering::SeqCst);
    }
    let reply = request(
        conn,
        &ClientMsg::Register {
            slot,
            decl: decl.clone(),
        },
    )?;
    let queue = match reply {
        DaemonMsg::Registered { queue } => queue,
        DaemonMsg::Refused { reason } => return Err(AgentError::Refused(reason)),
        _ => return Err(AgentError::Unexpected),
    };
    // The daemon reads the report on its next wake-up.
    conn.segment.header().to_daemon.ring();
    Ok(queue)
}

pub(crate) fn request(conn: &Connection, msg: &ClientMsg) -> Result<DaemonMsg, AgentError> {
    let mut s = conn.stream.lock().unwrap_or_else(|p| p.into_inner());
    frame::write(&mut *s, msg)?;
    Ok(frame::read(&mut *s)?)
}
