//! Benchmarks of xpreempt's own CPU paths, on any machine (no GPU): global mode's decision
//! latency (`daemon`) and what the stack adds to a latency-critical request
//! (`request`). Both run the product's code (agents, `xpreemptd` as a separate process)
//! over stand-in hardware queues.

pub mod daemon;
pub mod request;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Proc, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::{Command, CommandProps, HalError, Hints, HwQueue, Level, Seq};
use xpreempt_hal::Launched;

/// A hardware queue whose commands complete only when the benchmark lets them (a busy low queue
/// that never finishes, a high queue that stays busy until its sample is taken), and which
/// stamps the moment the scheduler stops it.
#[derive(Default)]
pub struct Held {
    launched: AtomicU64,
    /// Commands completed (`u64::MAX`: every one, now and later).
    done: Mutex<u64>,
    wake: Condvar,
    /// ns since the benchmark's epoch of the last stop; 0: none since the last reset.
    pub stopped_at: AtomicU64,
}

impl Held {
    /// Completes what was launched so far.
    pub fn finish(&self) {
        self.complete(self.launched.load(Ordering::SeqCst));
    }

    fn complete(&self, upto: u64) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = upto;
        self.wake.notify_all();
    }
}

/// `held`'s queue at `level`; stops are stamped against `epoch`.
pub struct HeldHal {
    pub held: Arc<Held>,
    pub epoch: Instant,
    pub level: Level,
}

impl HwQueue for HeldHal {
    type Payload = ();
    fn max_level(&self) -> Level {
        self.level
    }
    fn launch(&self, _: Seq, _: &mut Command<()>, _: bool) -> Result<(), HalError> {
        self.held.launched.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn record_sync(&self) -> Result<(), HalError> {
        Ok(())
    }
    fn completed(&self) -> Seq {
        let done = *self.held.done.lock().unwrap_or_else(|p| p.into_inner());
        done.min(self.held.launched.load(Ordering::SeqCst))
    }
    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        // Blocks the completion watcher (no polling) until the work is let go.
        let mut done = self.held.done.lock().unwrap_or_else(|p| p.into_inner());
        while *done < upto {
            done = self.held.wake.wait(done).unwrap_or_else(|p| p.into_inner());
        }
        Ok(())
    }
    fn deactivate(&self) -> Result<(), HalError> {
        self.held
            .stopped_at
            .store(self.epoch.elapsed().as_nanos() as u64, Ordering::SeqCst);
        Ok(())
    }
    fn reactivate(&self, _: &mut [Launched<()>]) -> Result<(), HalError> {
        Ok(())
    }
}

/// Completes every command of the queue, now and later, when dropped: its watcher can stop.
pub struct Release(pub Arc<Held>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.complete(u64::MAX);
    }
}

pub fn decl(device: u32, priority: i32, level: Level) -> Declaration {
    Declaration {
        device,
        priority,
        hints: Hints::default(),
        interleave: None,
        level,
    }
}

/// An agent connected to the daemon at `socket` (an error if it ran locally instead).
pub fn agent(socket: &Path, name: &str, spin_us: u64, hot_us: u64) -> Result<Agent> {
    let a = Agent::start(Options {
        socket: socket.to_path_buf(),
        name: name.into(),
        spin: Duration::from_micros(spin_us),
        hot: Duration::from_micros(hot_us),
        ..Options::default()
    })?;
    if !a.is_remote() {
        bail!(
            "the agent could not reach the daemon at {}",
            socket.display()
        );
    }
    Ok(a)
}

pub fn command() -> Command<()> {
    Command::kernel(()).with_props(CommandProps::new(false, true, false))
}

/// A private daemon (this binary's `xpreemptd`) on a socket in a directory of its own; killed and
/// cleaned up when dropped.
pub struct Daemon {
    pub child: Guard,
    pub socket: PathBuf,
    dir: PathBuf,
}

impl Daemon {
    pub fn start(tag: &str, extra: &[&str]) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("xpreempt-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("xpreempt.sock");
        let child = Guard(
            Proc::new(std::env::current_exe()?)
                .arg("xpreemptd")
                .args(extra)
                .arg("--socket")
                .arg(&socket)
                .env("XPREEMPT_LOG", "warn")
                .stderr(Stdio::null())
                .spawn()
                .context("starting the daemon")?,
        );
        let daemon = Self { child, socket, dir };
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::os::unix::net::UnixStream::connect(&daemon.socket).is_err() {
            if Instant::now() > deadline {
                bail!("the daemon did not start");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(daemon)
    }

    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.0.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Kills the child when dropped, so an error leaves no process behind.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn wait_for(f: impl FnMut() -> bool, what: &str) -> Result<()> {
    if !wait_for_within(f, Duration::from_secs(5)) {
        bail!("timed out waiting for {what}");
    }
    Ok(())
}

/// Whether `f` came true within `bound`.
pub fn wait_for_within(mut f: impl FnMut() -> bool, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while !f() {
        if Instant::now() > deadline {
            return false;
        }
        // The sample is stamped by the agent's thread, not here: sleeping keeps this thread
        // from taking a core the measured path needs.
        std::thread::sleep(Duration::from_micros(20));
    }
    true
}

#[derive(Serialize, Clone, Copy)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    /// Of `samples` (sorted here); `None` when there are none.
    pub fn of(samples: &mut [f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let pick = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Some(Self {
            p50: pick(0.5),
            p99: pick(0.99),
            p999: pick(0.999),
            max: pick(1.0),
        })
    }
}

/// A xorshift step: the benchmarks' random gaps, the same on every run.
pub fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
