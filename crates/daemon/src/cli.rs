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
    /// Start and own an MPS control daemon (private pipe and log directories beside the socket,
    /// `SOCKET.mps/`); `xpreempt run` points its children at it. If MPS cannot start, the daemon
    /// says why and clients run time-sliced with Lv3.
    #[arg(long)]
    pub mps: bool,
}

impl Args {
    pub fn config(&self) -> Result<Config> {
        let mut c = Config::new(
            self.socket
                .clone()
                .unwrap_or_else(xpreempt_ipc::default_socket),
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
