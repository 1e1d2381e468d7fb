//! An MPS control daemon owned by xpreemptd (`--mps`): started with the daemon in private pipe
//! and log directories, so that it touches no system-wide MPS instance, and stopped with it.
//! `xpreempt run` points its children at the pipe directory the daemon reports.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use thiserror::Error;

/// The control program (`XPREEMPT_MPS_CONTROL` overrides it, for tests and odd installs).
fn control_program() -> OsString {
    std::env::var_os("XPREEMPT_MPS_CONTROL").unwrap_or_else(|| "nvidia-cuda-mps-control".into())
}

const START_TIMEOUT: Duration = Duration::from_secs(5);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

#[derive(Debug, Error)]
pub enum MpsError {
    #[error("could not prepare {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not run {program:?} (is CUDA's MPS control program installed?)")]
    Spawn {
        program: OsString,
        #[source]
        source: std::io::Error,
    },
    #[error("{program:?} -d exited with {status}{log}")]
    Failed {
        program: OsString,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("the MPS control daemon did not come up within {timeout:?} (no {pid_file}){log}")]
    Timeout {
        timeout: Duration,
        pid_file: PathBuf,
        log: String,
    },
}

/// A running MPS control daemon; dropping it stops it and removes its directories.
#[derive(Debug)]
pub struct Mps {
    dir: PathBuf,
    pipe: PathBuf,
    log: PathBuf,
    pid: Option<i32>,
}

impl Mps {
    /// Starts `nvidia-cuda-mps-control -d` with its pipe and log directories under `dir`
    /// (created with mode 0700; a previous instance's leftovers there are stopped and removed).
    pub fn start(dir: &Path) -> Result<Self, MpsError> {
        let pipe = dir.join("pipe");
        let log = dir.join("log");
        let stale = Self {
            dir: dir.to_path_buf(),
            pipe: pipe.clone(),
            log: log.clone(),
            pid: read_pid(&pipe),
        };
        if stale.pid.is_some() {
            tracing::warn!(dir = %dir.display(), "stopping an MPS control daemon left behind by an earlier xpreemptd");
        }
        drop(stale);
        for d in [dir, &pipe, &log] {
            std::fs::create_dir_all(d)
                .and_then(|()| std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)))
                .map_err(|source| MpsError::Dir {
                    path: d.to_path_buf(),
                    source,
                })?;
        }
        let mut mps = Self {
            dir: dir.to_path_buf(),
            pipe,
            log,
            pid: None,
        };
        let program = control_program();
        let status = mps
            .command(&program)
            .arg("-d")
            .stdin(Stdio::null())
            .status()
            .map_err(|source| MpsError::Spawn {
                program: program.clone(),
                source,
            })?;
        if !status.success() {
            return Err(MpsError::Failed {
                program,
                status,
                log: mps.log_tail(),
            });
        }
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(pid) = read_pid(&mps.pipe) {
                mps.pid = Some(pid);
                tracing::info!(pid, pipe = %mps.pipe.display(), "MPS control daemon started");
                return Ok(mps);
            }
            if Instant::now() >= deadline {
                return Err(MpsError::Timeout {
                    timeout: START_TIMEOUT,
                    pid_file: mps.pipe.join(PID_FILE),
                    log: mps.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What a client needs in its environment to use this instance.
    pub fn pipe_dir(&self) -> &Path {
        &self.pipe
    }

    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    fn command(&self, program: &OsString) -> Command {
        let mut c = Command::new(program);
        c.env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    /// The end of the control daemon's log, for an error message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log.join("control.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        if tail.is_empty() {
            return String::new();
        }
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("; its log ends: {}", tail.join(" | "))
    }

    /// Asks the control daemon to quit and waits for it; kills it if it does not go.
    fn stop(&mut self) {
        let Some(pid) = self.pid.take().or_else(|| read_pid(&self.pipe)) else {
            return;
        };
        let asked = self
            .command(&control_program())
            .stdin(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(b"quit\n")?;
                }
                child.wait()
            });
        if let Err(e) = asked {
            tracing::warn!(%e, "could not ask the MPS control daemon to quit");
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(pid) && is_mps_control(pid) {
            tracing::warn!(pid, "the MPS control daemon did not quit; killing it");
            // SAFETY: kill(2) on the control daemon of our private pipe directory, checked by its
            // command line so that a reused pid is never hit.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        } else if alive(pid) {
            tracing::warn!(
                pid,
                "pid of the MPS pid file did not quit and is not an MPS control daemon; left alone"
            );
        } else {
            tracing::info!(pid, "MPS control daemon stopped");
        }
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_pid(pipe: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pipe.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (pid > 0 && alive(pid)).then_some(pid)
}

fn is_mps_control(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.windows(11).any(|w| w == b"mps-control"))
        .unwrap_or(false)
}

fn alive(pid: i32) -> bool {
    // Reap it first if it is our child (a fake control program in tests runs in the foreground
    // of a child we spawned); otherwise waitpid fails harmlessly.
    // SAFETY: waitpid with WNOHANG and a null status pointer; kill with signal 0 only probes.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
        libc::kill(pid, 0) == 0
    }
}
