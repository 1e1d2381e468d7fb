//! The agent: the part of global mode inside each application process (linked by the shim, the
//! client library and tests).
//!
//! It registers the process's queues with `xpreemptd` and then stays off the socket: a queue's
//! Ready/Idle goes into its slot of the shared segment and rings the daemon; a control thread
//! sleeps on the other doorbell and applies the daemon's suspend/resume to the local queues.
//! With no daemon the agent schedules the process's queues itself (`LocalScheduler`), says so
//! once, and connects when a daemon appears. If the daemon dies, the agent resumes whatever the
//! daemon held suspended at once and runs locally until it returns.
//!
//! The daemon never holds the application: connecting, the daemon's welcome and every answer
//! (a registration, say) are awaited for at most `XPREEMPT_AGENT_TIMEOUT_MS` (default 100 ms).
//! Past it the agent drops the connection and schedules locally, as with no daemon, says so
//! once, and keeps trying in the background; a queue the daemon refuses (a limit of the
//! daemon's, say) is scheduled locally too. A daemon that stops beating while it holds a queue
//! suspended is given up on the same way (`DAEMON_SILENCE`).
//!
//! The fast path: the agents of one user share a board (`xpreempt_ipc::board`). A queue that
//! gets work sets its bit there before its first launch and rings the agents of the queues it
//! preempts, which stop them at once; going idle, it clears the bit and they resume if the
//! daemon's suspension was only for it. The daemon writes who preempts whom and confirms. While
//! one of its queues has work and a higher queue exists, the control thread spins on its bell
//! (for 50 ms after the last such preemption) instead of sleeping, so that the stop costs no
//! wake-up.

mod control;
mod sink;

use control::Control;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;
use thiserror::Error;
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{QueueInfo, SchedError, Scheduler};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{QueueConfig, QueueId, XQueue, policy};
use xpreempt_hal::HwQueue;
use xpreempt_ipc::board::Board;
use xpreempt_ipc::frame::{self, FrameError};
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, QueueDecl, Role};
use xpreempt_ipc::shm::{Doorbell, SLOTS, Segment, ShmError};
use xpreempt_ipc::unix::recv_fd;

pub use xpreempt_ipc::msg::QueueDecl as Declaration;

#[derive(Debug, Error)]
pub enum AgentError {
    #[error("this process already has {SLOTS} queues")]
    TooManyQueues,
    #[error("the daemon refused: {0}")]
    Refused(String),
    #[error("the daemon did not answer within {} ms (stopped, hung or overloaded)", .0.as_millis())]
    Timeout(Duration),
    #[error("the connection to the daemon failed earlier and is being replaced")]
    Broken,
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
    /// The user's board and this agent's bell on it (the fast path), if the daemon gave one.
    pub board: Option<(Arc<Board>, u32)>,
    /// A request ran out of time: the stream may carry a late answer, so the connection is
    /// given up (the control thread goes local and reconnects).
    pub broken: AtomicBool,
}

impl Connection {
    /// Where the control thread waits and the daemon rings: the bell on the board, else the
    /// segment's doorbell.
    pub fn bell_ref(&self) -> BellRef {
        match &self.board {
            Some((board, bell)) => BellRef::Board(board.clone(), *bell),
            None => BellRef::Segment(self.segment.clone()),
        }
    }
}

/// Stands in for a bell the board does not have (never handed out: `connect` checks).
static EMPTY_BELL: Doorbell = Doorbell::new();

/// A doorbell with what keeps it mapped.
pub(crate) enum BellRef {
    Segment(Arc<Segment>),
    Board(Arc<Board>, u32),
}

impl BellRef {
    pub fn get(&self) -> &Doorbell {
        match self {
            BellRef::Board(board, bell) => match board.bell(*bell) {
                Some(b) => b,
                None => &EMPTY_BELL,
            },
            BellRef::Segment(seg) => &seg.header().to_agent,
        }
    }
}

pub(crate) struct Entry {
    pub queue: Arc<dyn Preemptible>,
    pub decl: QueueDecl,
    /// The daemon's id for the queue while connected.
    pub remote: Option<QueueId>,
    /// The last command generation applied, and whether the queue is suspended now (by the
    /// daemon's command or the board).
    pub applied: u64,
    pub suspended: bool,
    /// The report word under which the control thread last saw the queue's board bit set
    /// while the queue was idle (a fast-path hint whose submission never reported).
    pub stale_bit: Option<u64>,
}

pub(crate) struct Inner {
    pub mode: RwLock<Mode>,
    pub queues: Mutex<Vec<Option<Entry>>>,
    /// Each queue's newest Ready/Idle report as a slot word, kept in both modes so that a switch
    /// hands the other scheduler the queue's current state.
    pub reports: Vec<AtomicU64>,
    /// Each slot's report whose ring of the daemon is put off
    /// ([`xpreempt_ipc::shm::Quiet::Late`]) until the queue's completion watcher flushes it, or
    /// the next heartbeat.
    pub rings_owed: Vec<AtomicBool>,
    /// Each slot's bit on the board plus one (0: none), read on every submission.
    pub bits: Vec<AtomicU32>,
    /// Slots scheduled locally while connected: the daemon refused the queue, or did not answer
    /// when it registered.
    pub local_slots: Vec<AtomicBool>,
    pub local: LocalScheduler,
    pub local_sink: xpreempt_core::xqueue::threaded::EventSink,
    /// Whether the scheduler in charge wants work reports (see `sink::mirror_wants_work`).
    pub wants_work: Arc<AtomicBool>,
    pub socket: PathBuf,
    pub name: String,
    pub shutdown: AtomicBool,
    /// Said once: the process runs without a daemon.
    pub said_local: AtomicBool,
    /// How long the control thread keeps spinning after a fast-path preemption.
    pub hot: Duration,
    /// The longest wait on the daemon (connect, welcome, each answer).
    pub timeout: Duration,
    /// Said once: a queue the daemon refused or did not answer for runs locally.
    pub said_queue_local: AtomicBool,
}

impl Inner {
    /// Whether `queue` is with the local scheduler although the agent is connected.
    pub fn is_local_slot(&self, queue: QueueId) -> bool {
        self.local_slots
            .get(queue.0 as usize)
            .is_some_and(|l| l.load(Ordering::SeqCst))
    }

    pub fn set_local_slot(&self, slot: usize, local: bool) {
        if let Some(l) = self.local_slots.get(slot) {
            l.store(local, Ordering::SeqCst);
        }
    }

    pub fn lock_queues(&self) -> MutexGuard<'_, Vec<Option<Entry>>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Options {
    pub socket: PathBuf,
    /// The policy of the local scheduler used while no daemon answers.
    pub local_policy: String,
    pub name: String,
    /// How long the control thread spins on its doorbell before sleeping, when nothing makes
    /// it hot (default: not at all; spinning agents changed nothing measurable on an H100 host,
    /// 2026-11-23). For benchmarks.
    pub spin: Duration,
    /// While a queue of this process has work and a higher queue of its user exists, the
    /// control thread spins on its bell instead of sleeping, for this long after the last
    /// preemption it saw (and so does local mode's preemption thread; default
    /// [`DEFAULT_HOT`], 0: never): a higher queue's submission then stops this one without a
    /// wake-up, at the cost of a core while both are busy. Measured: without it the LC's p99 gap
    /// to the bench-only controller was +183.8 µs against +77.3 time-sliced and +87.9 against
    /// +50.7 under MPS (H100, driver 580.159.04, 2026-11-24); in global mode the fast path with
    /// it decided in 1.3 µs p50 against 34.9 without (docs/results/daemon-latency.md). For
    /// benchmarks and tests.
    pub hot: Duration,
    /// The longest the agent waits on the daemon at each step (`XPREEMPT_AGENT_TIMEOUT_MS`,
    /// default 100 ms); past it the process schedules its queues itself.
    pub timeout: Duration,
}

pub use xpreempt_core::sched::DEFAULT_HOT;

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
            spin: Duration::ZERO,
            hot: DEFAULT_HOT,
            timeout: Duration::from_millis(
                std::env::var("XPREEMPT_AGENT_TIMEOUT_MS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(100),
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
        let local = LocalScheduler::start_with(
            Scheduler::new(policy::by_name(&options.local_policy)?),
            options.hot,
        )?;
        let inner = Arc::new(Inner {
            mode: RwLock::new(Mode::Local),
            queues: Mutex::new((0..SLOTS).map(|_| None).collect()),
            reports: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            rings_owed: (0..SLOTS).map(|_| AtomicBool::new(false)).collect(),
            bits: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            local_slots: (0..SLOTS).map(|_| AtomicBool::new(false)).collect(),
            local_sink: local.sink(),
            wants_work: Arc::new(AtomicBool::new(false)),
            local,
            socket: options.socket,
            name: options.name,
            shutdown: AtomicBool::new(false),
            said_local: AtomicBool::new(false),
            hot: options.hot,
            timeout: options.timeout.max(Duration::from_millis(1)),
            said_queue_local: AtomicBool::new(false),
        });
        match connect(&inner, inner.timeout) {
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
            stale_bit: None,
        };
        let remote = match &*mode {
            Mode::Remote(conn) => match register_remote(conn, slot as u32, &entry.decl, 0) {
                Ok(r) => Some(r),
                Err(e) => {
                    say_queue_local(&self.inner, &e);
                    None
                }
            },
            Mode::Local => None,
        };
        match remote {
            Some((remote, bit)) => {
                entry.remote = Some(remote);
                set_bit(&self.inner, slot, bit);
            }
            // No daemon, or it refused or did not answer: the application runs all the same.
            None => {
                self.inner
                    .set_local_slot(slot, matches!(&*mode, Mode::Remote(_)));
                self.inner
                    .local
                    .register(local_info(id, &entry.decl), entry.queue.clone())?
            }
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
        self.inner.set_local_slot(queue.0 as usize, false);
        match (&*mode, entry.remote) {
            (Mode::Remote(conn), Some(remote)) => {
                set_bit(&self.inner, queue.0 as usize, None);
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
            conn.bell_ref().get().ring();
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
        compute_units: None,
        // The CUDA HAL cannot move a queue between SMs while it runs.
        confinable: false,
    }
}

/// A queue that the daemon refused, or did not answer for, is scheduled locally: said once.
fn say_queue_local(inner: &Inner, why: &AgentError) {
    if !inner.said_queue_local.swap(true, Ordering::SeqCst) {
        tracing::warn!("the xpreempt daemon did not take a queue ({why}); it is scheduled locally");
    }
}

/// An error of the socket, with a read or write that ran out of time said as such.
fn timed(e: impl Into<AgentError>, limit: Duration) -> AgentError {
    match e.into() {
        AgentError::Io(io) if xpreempt_ipc::unix::is_timeout(&io) => AgentError::Timeout(limit),
        AgentError::Frame(FrameError::Io(io)) if xpreempt_ipc::unix::is_timeout(&io) => {
            AgentError::Timeout(limit)
        }
        e => e,
    }
}

/// Connects, says hello as an agent and maps the segment the daemon hands over, all within
/// `limit`; later requests get the agent's timeout each.
pub(crate) fn connect(inner: &Inner, limit: Duration) -> Result<Connection, AgentError> {
    let started = std::time::Instant::now();
    let t = |e: AgentError| timed(e, limit);
    let mut stream =
        xpreempt_ipc::unix::connect_within(&inner.socket, limit).map_err(|e| t(e.into()))?;
    frame::write(
        &mut stream,
        &ClientMsg::Hello {
            version: xpreempt_ipc::PROTOCOL_VERSION,
            role: Role::Agent,
            name: inner.name.clone(),
        },
    )
    .map_err(|e| t(e.into()))?;
    let bell = match frame::read::<DaemonMsg>(&mut stream).map_err(|e| t(e.into()))? {
        DaemonMsg::Welcome { bell, .. } => bell,
        DaemonMsg::Refused { reason } => return Err(AgentError::Refused(reason)),
        _ => return Err(AgentError::Unexpected),
    };
    let segment = Arc::new(Segment::open(recv_fd(&stream).map_err(|e| t(e.into()))?)?);
    let board = match bell {
        Some(bell) => Some((
            Arc::new(Board::open(recv_fd(&stream).map_err(|e| t(e.into()))?)?),
            bell,
        ))
        .filter(|(b, bell)| b.bell(*bell).is_some()),
        None => None,
    };
    if started.elapsed() >= limit {
        return Err(AgentError::Timeout(limit));
    }
    stream.set_read_timeout(Some(inner.timeout))?;
    stream.set_write_timeout(Some(inner.timeout))?;
    Ok(Connection {
        stream: Mutex::new(stream),
        segment,
        board,
        broken: AtomicBool::new(false),
    })
}

/// Records slot `slot`'s board bit (`None`: it has none).
pub(crate) fn set_bit(inner: &Inner, slot: usize, bit: Option<u32>) {
    if let Some(b) = inner.bits.get(slot) {
        b.store(bit.map_or(0, |b| b + 1), Ordering::SeqCst);
    }
}

/// Registers slot `slot` with the daemon, publishing the queue's current report first; returns
/// the daemon's id of the queue and its board bit.
pub(crate) fn register_remote(
    conn: &Connection,
    slot: u32,
    decl: &QueueDecl,
    report: u64,
) -> Result<(QueueId, Option<u32>), AgentError> {
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
    let (queue, bit) = match reply {
        DaemonMsg::Registered { queue, bit } => (queue, bit),
        DaemonMsg::Refused { reason } => return Err(AgentError::Refused(reason)),
        _ => return Err(AgentError::Unexpected),
    };
    // The daemon reads the report on its next wake-up.
    conn.segment.header().to_daemon.ring();
    if let (Some((board, _)), Some(bit)) = (&conn.board, bit) {
        // A queue that registers with work already shows it.
        let active = matches!(
            xpreempt_ipc::shm::decode_report(report),
            Some(xpreempt_core::sched::QueueReport::Ready { .. })
        );
        board.announce(bit, active);
    }
    Ok((queue, bit))
}

/// One request and its answer, each awaited for at most the agent's timeout. A connection that
/// failed once is not used again (an answer may still be on its way).
pub(crate) fn request(conn: &Connection, msg: &ClientMsg) -> Result<DaemonMsg, AgentError> {
    if conn.broken.load(Ordering::SeqCst) {
        return Err(AgentError::Broken);
    }
    let mut s = conn.stream.lock().unwrap_or_else(|p| p.into_inner());
    let limit = s
        .read_timeout()
        .ok()
        .flatten()
        .unwrap_or(Duration::from_millis(100));
    let answer = frame::write(&mut *s, msg).and_then(|()| frame::read(&mut *s));
    answer.map_err(|e| {
        conn.broken.store(true, Ordering::SeqCst);
        timed(e, limit)
    })
}
