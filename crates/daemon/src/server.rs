//! The daemon's threads: the socket's accept loop and one thread per connection, one fast-path
//! thread per agent, and a ticker for timers and the watchdog.

use crate::state::{SchedulerFactory, State};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use thiserror::Error;
use xpreempt_bpf::{BpfHooks, LoadOptions};
use xpreempt_core::sched::Scheduler;
use xpreempt_core::{Nanos, policy};
use xpreempt_ipc::frame::{self, FrameError};
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, Role, hello_version};
use xpreempt_ipc::shm::{SLOTS, Segment};
use xpreempt_ipc::unix::{Cred, peer_cred, send_fd};

/// Which scheduler each device runs.
#[derive(Clone, Debug)]
pub enum PolicySpec {
    /// A built-in policy by name (`hpf`, `fifo`, …).
    Rust(String),
    /// An eBPF program at the four hooks, over a built-in base policy.
    Bpf { object: PathBuf, base: String },
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
        }
    }
}

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("another daemon is listening on {0}")]
    InUse(PathBuf),
    #[error("socket {path}")]
    Socket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("policy")]
    Policy(#[from] policy::UnknownPolicy),
    #[error("eBPF policy {path}")]
    Bpf {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("metrics listener on {addr}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("starting a thread")]
    Thread(#[source] io::Error),
}

pub(crate) struct Shared {
    state: Mutex<State>,
    /// Every open connection, so that a stop closes them as a dying daemon's would be.
    connections: Mutex<std::collections::BTreeMap<u64, UnixStream>>,
    next_connection: std::sync::atomic::AtomicU64,
    /// Wakes the ticker when a decision moved the next timer earlier, or at shutdown.
    pub(crate) ticker: Condvar,
    shutdown: AtomicBool,
    config: Config,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }
}

/// A running daemon; dropping it (or [`Daemon::stop`]) shuts it down and removes the socket.
pub struct Daemon {
    shared: Arc<Shared>,
    /// The listening socket, kept to wake the accept loop at shutdown even if the socket file
    /// is gone.
    listener: UnixListener,
    threads: Vec<JoinHandle<()>>,
    /// Stopped after the threads, so clients never see it go while the daemon serves.
    mps: Option<crate::mps::Mps>,
}

fn scheduler_factory(spec: &PolicySpec) -> Result<SchedulerFactory, DaemonError> {
    Ok(match spec.clone() {
        PolicySpec::Rust(name) => {
            policy::by_name(&name)?;
            Box::new(move || Ok(Scheduler::new(policy::by_name(&name)?)))
        }
        PolicySpec::Bpf { object, base } => {
            policy::by_name(&base)?;
            let bpf_err = |source: Box<dyn std::error::Error + Send + Sync>| DaemonError::Bpf {
                path: object.clone(),
                source,
            };
            let bytes = std::fs::read(&object).map_err(|e| bpf_err(Box::new(e)))?;
            let name = object
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("policy")
                .to_string();
            let make = BpfHooks::factory(&name, bytes, Vec::new(), LoadOptions::default())
                .map_err(|e| bpf_err(Box::new(e)))?;
            Box::new(move || Ok(Scheduler::new(policy::by_name(&base)?).with_hooks(make())))
        }
    })
}

impl Daemon {
    /// Binds the socket and starts serving.
    pub fn start(config: Config) -> Result<Self, DaemonError> {
        let mut state = State::new(scheduler_factory(&config.policy)?);
        if matches!(config.policy, PolicySpec::Bpf { .. }) {
            // The program's maps exist from the start, so that an operator can configure them
            // before the first process comes; other devices open with their first queue.
            state.open_device(0).map_err(|e| DaemonError::Bpf {
                path: PathBuf::from("device 0"),
                source: Box::new(e),
            })?;
        }
        let listener = bind(&config)?;
        let mps = config
            .mps
            .as_deref()
            .and_then(|dir| match crate::mps::Mps::start(dir) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(
                        error = %error_chain(&e),
                        "MPS could not start: clients run time-sliced (Lv3)"
                    );
                    None
                }
            });
        state.set_mps_pipe(mps.as_ref().map(|m| m.pipe_dir().display().to_string()));
        let wake = listener.try_clone().map_err(|source| DaemonError::Socket {
            path: config.socket.clone(),
            source,
        })?;
        let mut config = config;
        let metrics = match config.metrics {
            Some(addr) => {
                let l = std::net::TcpListener::bind(addr)
                    .map_err(|source| DaemonError::Metrics { addr, source })?;
                // Port 0 picks a free port: remember the one the system gave.
                config.metrics = l.local_addr().ok();
                Some(l)
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            connections: Mutex::new(std::collections::BTreeMap::new()),
            next_connection: std::sync::atomic::AtomicU64::new(0),
            ticker: Condvar::new(),
            shutdown: AtomicBool::new(false),
            config,
        });
        let mut threads = Vec::new();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(DaemonError::Thread)
        };
        let s = shared.clone();
        threads.push(spawn(
            "xpreemptd-accept",
            Box::new(move || accept(&s, listener)),
        )?);
        let s = shared.clone();
        threads.push(spawn("xpreemptd-ticker", Box::new(move || tick(&s)))?);
        if let Some(l) = metrics {
            let s = shared.clone();
            threads.push(spawn(
                "xpreemptd-metrics",
                Box::new(move || crate::metrics::serve(&s, l)),
            )?);
        }
        tracing::info!(socket = %shared.config.socket.display(), policy = ?shared.config.policy, "xpreemptd serving");
        Ok(Self {
            shared,
            listener: wake,
            threads,
            mps,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.shared.config.socket
    }

    /// Where the Prometheus metrics are served, if they are.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.shared.config.metrics
    }

    pub fn stats(&self) -> xpreempt_ipc::msg::DaemonStats {
        self.shared.lock().stats()
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Blocks until the daemon is stopped from another thread or by a signal handler that
    /// calls [`Daemon::stop`].
    pub fn wait(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    fn shutdown(&mut self) {
        if self.shared.shutdown.swap(true, Ordering::SeqCst) {
            return;
        }
        self.shared.ticker.notify_all();
        // Unblock the accept loop and the metrics listener, and close every connection.
        // SAFETY: shutdown(2) on a listening socket this daemon owns; accept then returns.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = UnixStream::connect(&self.shared.config.socket);
        for c in self
            .shared
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        if let Some(addr) = self.shared.config.metrics {
            let _ = std::net::TcpStream::connect(addr);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.shared.config.socket);
        drop(self.mps.take());
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn bind(config: &Config) -> Result<UnixListener, DaemonError> {
    let path = &config.socket;
    let err = |source| DaemonError::Socket {
        path: path.clone(),
        source,
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(DaemonError::InUse(path.clone()));
        }
        // Left behind by a daemon that died: nobody answers on it.
        std::fs::remove_file(path).map_err(err)?;
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(config.socket_mode))
        .map_err(err)?;
    if let Some(gid) = config.socket_group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(err)?;
    }
    Ok(listener)
}

fn accept(shared: &Arc<Shared>, listener: UnixListener) {
    for stream in listener.incoming() {
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%e, "accept");
                // Out of descriptors, say: give the system a moment instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("xpreemptd-client".into())
            .spawn(move || serve(&s, stream));
        if let Err(e) = spawned {
            tracing::error!(%e, "no thread for a new client; connection dropped");
        }
    }
}

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

fn serve(shared: &Arc<Shared>, stream: UnixStream) {
    let conn = shared.next_connection.fetch_add(1, Ordering::Relaxed);
    if let Ok(c) = stream.try_clone() {
        shared
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(conn, c);
    }
    serve_connection(shared, stream);
    shared
        .connections
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&conn);
}

fn serve_connection(shared: &Arc<Shared>, mut stream: UnixStream) {
    let cred = match peer_cred(&stream) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%e, "no peer credentials; connection dropped");
            return;
        }
    };
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let (role, name) = match hello(&mut stream, cred) {
        Ok(h) => h,
        Err(Hello::Gone) => {
            tracing::debug!(pid = cred.pid, "connection closed before hello");
            return;
        }
        Err(Hello::Refused(why)) => {
            shared.lock().stats.bad_frames += 1;
            tracing::warn!(pid = cred.pid, uid = cred.uid, "connection refused: {why}");
            let _ = frame::write(&mut stream, &DaemonMsg::Refused { reason: why });
            return;
        }
    };
    let _ = stream.set_read_timeout(None);
    let segment = match role {
        Role::Agent => match Segment::create(SLOTS) {
            Ok(s) => Some(Arc::new(s)),
            Err(e) => {
                tracing::error!(pid = cred.pid, "{e}");
                let _ = frame::write(
                    &mut stream,
                    &DaemonMsg::Refused {
                        reason: format!("the daemon could not create a shared segment: {e}"),
                    },
                );
                return;
            }
        },
        Role::Operator | Role::Rm => None,
    };
    let (id, seat) = {
        let mut st = shared.lock();
        let wants = st.wants_work();
        if let Some(s) = &segment {
            s.header()
                .wants_work
                .store(u32::from(wants), Ordering::Relaxed);
        }
        let id = st.add_client(cred, name.clone(), segment.clone());
        (id, st.clients.get(&id).and_then(|c| c.seat.clone()))
    };
    tracing::info!(pid = cred.pid, uid = cred.uid, %name, ?role, "client connected");
    let alive = Arc::new(AtomicBool::new(true));
    let fast_path = match &segment {
        Some(seg) => {
            let welcome = frame::write(
                &mut stream,
                &DaemonMsg::Welcome {
                    slots: seg.slots(),
                    bell: seat.as_ref().map(|s| s.bell),
                },
            )
            .map_err(|e| e.to_string())
            .and_then(|()| send_fd(&stream, seg.fd()).map_err(|e| e.to_string()))
            .and_then(|()| match &seat {
                Some(s) => send_fd(&stream, s.board.fd()).map_err(|e| e.to_string()),
                None => Ok(()),
            });
            if let Err(e) = welcome {
                tracing::warn!(pid = cred.pid, "welcome failed: {e}");
                shared.lock().remove_client(id);
                return;
            }
            let (s, seg, alive) = (shared.clone(), seg.clone(), alive.clone());
            std::thread::Builder::new()
                .name("xpreemptd-fast".into())
                .spawn(move || fast_path(&s, id, &seg, &alive))
                .ok()
        }
        None => {
            let _ = frame::write(&mut stream, &DaemonMsg::Ready);
            None
        }
    };
    loop {
        let msg = match frame::read::<ClientMsg>(&mut stream) {
            Ok(m) => m,
            Err(FrameError::Closed) => break,
            Err(e) => {
                shared.lock().stats.bad_frames += 1;
                tracing::warn!(pid = cred.pid, error = %e, "bad frame; connection closed");
                break;
            }
        };
        if let Some(reply) = crate::requests::handle(shared, id, cred, msg)
            && frame::write(&mut stream, &reply).is_err()
        {
            break;
        }
    }
    alive.store(false, Ordering::SeqCst);
    if let Some(seg) = &segment {
        seg.header().to_daemon.ring();
    }
    if let Some(t) = fast_path {
        let _ = t.join();
    }
    shared.lock().remove_client(id);
    shared.ticker.notify_all();
    tracing::info!(pid = cred.pid, %name, "client gone; its queues are removed");
}

enum Hello {
    /// The peer left without a word (a probe, or a client that died at once).
    Gone,
    Refused(String),
}

/// Reads the first frame: it must be a `Hello` of this protocol version.
fn hello(stream: &mut UnixStream, cred: Cred) -> Result<(Role, String), Hello> {
    let body = match frame::read_bytes(stream) {
        Ok(b) => b,
        Err(FrameError::Closed) => return Err(Hello::Gone),
        Err(e) => return Err(Hello::Refused(e.to_string())),
    };
    match hello_version(&body) {
        Some(v) if v == xpreempt_ipc::PROTOCOL_VERSION => {}
        Some(v) => {
            return Err(Hello::Refused(format!(
                "client (pid {}) speaks protocol version {v}; this daemon speaks {}",
                cred.pid,
                xpreempt_ipc::PROTOCOL_VERSION
            )));
        }
        None => return Err(Hello::Refused("the first message must be Hello".into())),
    }
    match frame::decode::<ClientMsg>(&body) {
        Ok(ClientMsg::Hello { role, name, .. }) => Ok((role, name)),
        Ok(_) => Err(Hello::Refused("the first message must be Hello".into())),
        Err(e) => Err(Hello::Refused(e.to_string())),
    }
}

/// How long a fast-path thread spins on its doorbell before it sleeps in the kernel. The daemon
/// is its own process, never the application's; 50 µs met the decision-latency goals on the
/// 16-core H100 host and ten times longer bought nothing for up to 1.6 cores
/// (bench/results/2026-11-23-h100-session9.md, section 2).
const SPIN: Duration = Duration::from_micros(50);

/// Sleeps on the agent's doorbell and decides on every state change it rings for.
fn fast_path(shared: &Shared, id: u64, segment: &Segment, alive: &AtomicBool) {
    let bell = &segment.header().to_daemon;
    let mut seen = bell.value();
    let mut rung = false;
    while alive.load(Ordering::SeqCst) {
        let mut st = shared.lock();
        if rung {
            st.stats.fast_path_wakeups += 1;
        }
        let before = st.run_timers();
        st.take_reports(id);
        let after = st.run_timers();
        drop(st);
        if after.is_some() && (before.is_none() || after < before) {
            shared.ticker.notify_all();
        }
        let now = bell.wait(seen, SPIN, Duration::from_millis(100));
        rung = now != seen;
        seen = now;
    }
}

/// Timers of the policies, and the watchdog.
fn tick(shared: &Shared) {
    let bound = shared.config.watchdog;
    let check = (bound / 4).max(Duration::from_millis(1));
    let mut st = shared.lock();
    while !shared.shutdown.load(Ordering::SeqCst) {
        st.watchdog(bound);
        let next = st.run_timers();
        let now: Nanos = st.now();
        let busy = st.clients.values().any(|c| !c.queues.is_empty());
        let mut sleep = if busy { check } else { Duration::from_secs(1) };
        if let Some(at) = next {
            sleep = sleep.min(Duration::from_nanos(at.saturating_sub(now)));
        }
        st = shared
            .ticker
            .wait_timeout(st, sleep)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}
