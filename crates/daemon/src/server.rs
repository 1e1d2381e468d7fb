//! The daemon's threads: the socket's accept loop and one thread per connection, one fast-path
//! thread per agent, and a ticker for timers and the watchdog.

pub use crate::shared::{Config, PolicySpec};
use crate::shared::{Shared, error_chain};
use crate::state::{SchedulerFactory, State};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use thiserror::Error;
use xpreempt_bpf::{BpfHooks, LoadOptions};
use xpreempt_core::sched::Scheduler;
use xpreempt_core::{Nanos, policy};

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("another xpreemptd serves {0} (stop it first, or give this one another --socket)")]
    InUse(PathBuf),
    #[error("socket {path}")]
    Socket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("policy")]
    Policy(#[from] policy::UnknownPolicy),
    #[error("--trace {path}")]
    Trace {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
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

/// A running daemon; dropping it (or [`Daemon::stop`]) shuts it down and removes the socket.
pub struct Daemon {
    shared: Arc<Shared>,
    /// The listening socket, kept to wake the accept loop at shutdown even if the socket file
    /// is gone.
    listener: UnixListener,
    threads: Vec<JoinHandle<()>>,
    /// Stopped after the threads, so clients never see it go while the daemon serves.
    mps: Option<crate::mps::Mps>,
    /// The socket's lock file, held while the daemon lives.
    _lock: std::fs::File,
}

/// Removes the socket file when a start fails after binding it.
struct SocketFile(Option<PathBuf>);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Takes `SOCKET.lock` (created beside the socket) for this daemon's life, or says who has it.
fn lock_socket(socket: &Path) -> Result<std::fs::File, DaemonError> {
    let err = |source| DaemonError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    if let Some(dir) = socket.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut path = socket.as_os_str().to_owned();
    path.push(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(err)?;
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Err(DaemonError::InUse(socket.to_path_buf())),
            _ => Err(err(e)),
        };
    }
    Ok(file)
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
        let mut config = config;
        config.limits.fit_descriptors();
        let mut state = State::new(scheduler_factory(&config.policy)?);
        state.limits = config.limits.clone();
        if let Some(path) = &config.trace {
            state.trace =
                Some(
                    crate::trace::Trace::create(path).map_err(|source| DaemonError::Trace {
                        path: path.clone(),
                        source,
                    })?,
                );
        }
        if matches!(config.policy, PolicySpec::Bpf { .. }) {
            // The program's maps exist from the start, so that an operator can configure them
            // before the first process comes; other devices open with their first queue.
            state.open_device(0).map_err(|e| DaemonError::Bpf {
                path: PathBuf::from("device 0"),
                source: Box::new(e),
            })?;
        }
        // Held for the daemon's life: a second daemon on the same socket refuses at once, and a
        // socket file found without the lock's holder is stale and safe to replace.
        let lock = lock_socket(&config.socket)?;
        // Everything that can fail is set up before the socket appears, or removes it on the way
        // out: a failed start leaves no socket behind that would answer "connection refused".
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
        let listener = bind(&config)?;
        let mut socket_file = SocketFile(Some(config.socket.clone()));
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
        state.stats.policy = config.policy.to_string();
        let wake = listener.try_clone().map_err(|source| DaemonError::Socket {
            path: config.socket.clone(),
            source,
        })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            connections: Mutex::new(std::collections::BTreeMap::new()),
            next_connection: std::sync::atomic::AtomicU64::new(0),
            admission: Mutex::new(crate::limits::Connections::default()),
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
            Box::new(move || crate::conn::accept(&s, listener)),
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
        // From here on the daemon's own shutdown removes the socket.
        socket_file.0 = None;
        Ok(Self {
            _lock: lock,
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
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .finish_trace();
        drop(self.mps.take());
    }
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
        // A daemon without the lock (an older one) may still serve it; one that is stopped
        // does not accept, so the probe is bounded.
        match xpreempt_ipc::unix::connect_within(path, Duration::from_millis(500)) {
            Ok(_) => return Err(DaemonError::InUse(path.clone())),
            Err(e) if xpreempt_ipc::unix::is_timeout(&e) => {
                return Err(DaemonError::InUse(path.clone()));
            }
            // Left behind by a daemon that died: nobody answers on it.
            Err(_) => std::fs::remove_file(path).map_err(err)?,
        }
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(config.socket_mode))
        .map_err(err)?;
    if let Some(gid) = config.socket_group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(err)?;
    }
    Ok(listener)
}

/// Timers of the policies, and the watchdog.
fn tick(shared: &Shared) {
    let bound = shared.config.watchdog;
    let check = (bound / 4).max(Duration::from_millis(1));
    let mut st = shared.lock();
    while !shared.shutdown.load(Ordering::SeqCst) {
        st.watchdog(bound);
        st.beat();
        st.trace_gpu();
        st.sample_costs();
        let rate = shared.config.limits.changes_per_sec;
        st.change_rate.trim(rate);
        let next = st.run_timers();
        let now: Nanos = st.now();
        let busy = st.clients.values().any(|c| !c.queues.is_empty());
        let mut sleep = if busy { check } else { Duration::from_secs(1) };
        sleep = sleep.min(xpreempt_ipc::shm::DAEMON_BEAT);
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
