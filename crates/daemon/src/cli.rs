//! The daemon's command line, shared by `xpreemptd` and `xpreempt daemon`.

use crate::{Config, Daemon, PolicySpec};
use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Socket path [default: $XPREEMPT_SOCKET, else $XDG_RUNTIME_DIR/xpreempt.sock, else
    /// /run/xpreempt/xpreempt.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Built-in policy (hpf, fifo, rr, bandwidth, edf, lcbe) or an eBPF object (FILE.o).
    #[arg(long, env = "XPREEMPT_POLICY", default_value = "hpf")]
    pub policy: String,
    /// The built-in policy under an eBPF program (only with --policy FILE.o).
    #[arg(long)]
    pub base_policy: Option<String>,
    /// Socket file mode, octal (0660 with --socket-group admits only that group).
    #[arg(long, default_value = "666")]
    pub socket_mode: String,
    /// Numeric group id to own the socket.
    #[arg(long)]
    pub socket_group: Option<u32>,
    /// How long a client may stay silent while it has work before the watchdog lets the others run.
    #[arg(long, default_value_t = 500)]
    pub watchdog_ms: u64,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9464).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Write a timeline of every queue's states and of every suspension, with the queue it was
    /// for, to FILE (Chrome/Perfetto JSON: open it at ui.perfetto.dev).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Start and own an MPS control daemon (private pipe and log directories beside the socket,
    /// `SOCKET.mps/`); `xpreempt run` points its children at it. If MPS cannot start, the daemon
    /// says why and clients run time-sliced with Lv3.
    #[arg(long)]
    pub mps: bool,
    /// Limits: what clients can make the daemon hold. Past a limit the daemon refuses, says
    /// why to the client, counts the refusal by reason (`xpreempt stats`, /metrics) and keeps
    /// serving everyone else.
    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Connections of all users together (lowered to what the descriptor limit allows, which
    /// the daemon raises to its hard limit). Operators (`list`, `stats`, `top`) get 32 more,
    /// so that they still work while agents fill the rest.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Connections of one user.
    #[arg(long, default_value_t = 256)]
    pub max_connections_per_uid: usize,
    /// Queues of all users together.
    #[arg(long, default_value_t = 4096)]
    pub max_queues: usize,
    /// Queues (and channel groups of one process) of one user.
    #[arg(long, default_value_t = 1024)]
    pub max_queues_per_uid: usize,
    /// Device ids accepted are 0 to N-1 (each device in use has a scheduler; set N to the
    /// number of GPUs).
    #[arg(long, default_value_t = 16)]
    pub max_devices: u32,
    /// Priority and hint changes per second of one user (bursts of as many); an application
    /// that raises and lowers its priority around each request makes two per request.
    #[arg(long, default_value_t = 10_000)]
    pub max_changes_per_sec: u32,
    /// A connection that holds no queue or channel group is closed after this long without a
    /// request.
    #[arg(long, default_value_t = 30_000)]
    pub idle_timeout_ms: u64,
    /// A frame, once begun, must arrive within this long (and a reply be taken).
    #[arg(long, default_value_t = 5_000)]
    pub frame_timeout_ms: u64,
}

impl LimitArgs {
    pub fn limits(&self) -> Result<crate::limits::Limits> {
        if self.max_devices == 0 || self.max_connections == 0 || self.max_connections_per_uid == 0 {
            bail!(
                "--max-devices, --max-connections and --max-connections-per-uid must be at least 1"
            );
        }
        if self.idle_timeout_ms == 0 || self.frame_timeout_ms == 0 {
            bail!("--idle-timeout-ms and --frame-timeout-ms must be at least 1");
        }
        Ok(crate::limits::Limits {
            connections: self.max_connections,
            connections_per_uid: self.max_connections_per_uid,
            queues: self.max_queues,
            queues_per_uid: self.max_queues_per_uid,
            devices: self.max_devices,
            changes_per_sec: self.max_changes_per_sec,
            idle: Duration::from_millis(self.idle_timeout_ms),
            frame: Duration::from_millis(self.frame_timeout_ms),
            ..crate::limits::Limits::default()
        })
    }
}

impl Args {
    pub fn config(&self) -> Result<Config> {
        let mut c = Config::new(
            self.socket
                .clone()
                .unwrap_or_else(xpreempt_ipc::daemon_socket),
        );
        c.socket_mode = u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .with_context(|| {
                format!(
                    "--socket-mode {}: give an octal mode like 660",
                    self.socket_mode
                )
            })?;
        c.socket_group = self.socket_group;
        c.policy = if self.policy.ends_with(".o") {
            PolicySpec::Bpf {
                object: PathBuf::from(&self.policy),
                base: self.base_policy.clone().unwrap_or_else(|| "hpf".into()),
            }
        } else {
            if self.base_policy.is_some() {
                bail!("--base-policy needs an eBPF program as --policy (FILE.o)");
            }
            PolicySpec::Rust(self.policy.clone())
        };
        if self.watchdog_ms == 0 {
            bail!("--watchdog-ms must be at least 1");
        }
        c.watchdog = Duration::from_millis(self.watchdog_ms);
        if let Some(addr) = self.metrics
            && !addr.ip().is_loopback()
        {
            bail!("--metrics {addr}: serve metrics on a loopback address (127.0.0.1 or ::1)");
        }
        c.metrics = self.metrics;
        c.trace = self.trace.clone();
        c.limits = self.limits.limits()?;
        if self.mps {
            let mut dir = c.socket.clone().into_os_string();
            dir.push(".mps");
            c.mps = Some(PathBuf::from(dir));
        }
        Ok(c)
    }
}

/// Runs the daemon until SIGINT or SIGTERM.
pub fn run(args: &Args) -> Result<()> {
    let config = args.config()?;
    let signals = block_signals()?;
    let daemon = Daemon::start(config).context("starting xpreemptd")?;
    eprintln!("xpreemptd: listening on {}", daemon.socket().display());
    let mut sig: libc::c_int = 0;
    // SAFETY: sigwait on a set built by block_signals; `sig` is a valid out-pointer.
    unsafe { libc::sigwait(&signals, &mut sig) };
    tracing::info!(signal = sig, "stopping");
    daemon.stop();
    Ok(())
}

/// Blocks SIGINT and SIGTERM in this thread (and the threads it starts) so that `sigwait`
/// takes them: a clean stop that removes the socket.
fn block_signals() -> Result<libc::sigset_t> {
    // SAFETY: sigset operations on a local set; pthread_sigmask on the calling thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            bail!("could not block SIGINT/SIGTERM");
        }
        Ok(set)
    }
}
