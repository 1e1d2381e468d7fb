//! The processes of a two-process scenario: this binary re-run as the BE and LC sides
//! (`role`), and for the global-mode scenarios a private daemon (this binary's `xpreemptd`: the
//! daemon's own code, in a process of its own).

use anyhow::{Context, Result, bail};
use serde::de::DeserializeOwned;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Proc, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long the daemon may take to listen, and to stop once asked.
const DAEMON_START: Duration = Duration::from_secs(10);
const DAEMON_STOP: Duration = Duration::from_secs(5);

/// A child process that is killed if the scenario ends (an error, say) before it was waited for,
/// so that no BE loop outlives its benchmark.
pub(super) struct Kid {
    who: &'static str,
    child: Option<Child>,
}

impl Kid {
    /// A side of the scenario: `role` with the JSON `spec`, meeting the other side through
    /// the control file `ctl`, its kernels built to this process's `calibration`. Its last stdout
    /// line is its result; stderr goes to ours.
    pub(super) fn role(
        who: &'static str,
        device: i32,
        calibration: xpreempt_bench::Calibration,
        spec: String,
        ctl: &Path,
        envs: &[(String, String)],
    ) -> Result<Self> {
        let exe = std::env::current_exe()?;
        let mut c = Proc::new(&exe);
        c.args(["--device", &device.to_string(), "role", "--role"])
            .arg(who.to_lowercase())
            .arg("--spec")
            .arg(spec)
            .arg("--ctl")
            .arg(ctl)
            .arg("--calibration")
            .arg(calibration.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // The ioctl shim only where a scenario asks for it (in `envs`).
            .env_remove("LD_PRELOAD");
        for (k, v) in envs {
            c.env(k, v);
        }
        die_with_parent(&mut c, libc::SIGKILL);
        let child = c
            .spawn()
            .with_context(|| format!("starting the {who} process"))?;
        Ok(Self {
            who,
            child: Some(child),
        })
    }

    /// Waits for the side to finish and reads its result.
    pub(super) fn result<T: DeserializeOwned>(mut self) -> Result<T> {
        let Some(child) = self.child.take() else {
            bail!("the {} process was already waited for", self.who);
        };
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("the {} process failed ({})", self.who, out.status);
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().unwrap_or("");
        serde_json::from_str(last)
            .with_context(|| format!("the {} process's result: `{last}`", self.who))
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The child gets `signal` when this process dies, however it dies (killed by a timeout, say):
/// a BE loop or a daemon must not outlive its benchmark and skew the next one. (Linux sends it
/// when the spawning thread ends: every spawn here is on the main thread.)
fn die_with_parent(c: &mut Proc, signal: libc::c_int) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // calls (prctl, getppid, _exit) on plain integers; it allocates nothing and takes no lock.
    unsafe {
        c.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died between fork and prctl: the signal will never come.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// The daemon on a private socket, for one scenario.
pub(super) struct Daemon {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    /// Starts the daemon (HPF, whatever XPREEMPT_POLICY says) and waits until it listens.
    pub(super) fn start(tag: &str) -> Result<Self> {
        Self::start_with(&std::env::current_exe()?, tag)
    }

    /// The same with the `xpreempt-bench` binary at `exe`.
    fn start_with(exe: &Path, tag: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "xpreempt-bench-daemon-{}-{tag}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join("xpreempt.sock");
        // A socket left by an earlier run of the same pid would answer nothing.
        let _ = std::fs::remove_file(&socket);
        let mut c = Proc::new(exe);
        c.args(["xpreemptd", "--policy", "hpf", "--socket"])
            .arg(&socket)
            // The daemon schedules; it must not load the ioctl shim some scenarios preload.
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            // Our stdout is the result (one JSON object under --json); its messages go to stderr.
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SIGTERM: the daemon's clean stop, which removes its socket.
        die_with_parent(&mut c, libc::SIGTERM);
        let child = match c.spawn() {
            Ok(c) => c,
            Err(err) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(err).context("starting the daemon");
            }
        };
        let mut d = Self { child, dir, socket };
        let t = Instant::now();
        while UnixStream::connect(&d.socket).is_err() {
            if let Some(status) = d.child.try_wait()? {
                bail!(
                    "the daemon exited ({status}) before listening on {}",
                    d.socket.display()
                );
            }
            if t.elapsed() > DAEMON_START {
                bail!(
                    "the daemon did not listen on {} within {} s",
                    d.socket.display(),
                    DAEMON_START.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    pub(super) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops the daemon with SIGTERM (its clean stop). A daemon that died during the scenario,
    /// or does not stop, is an error: the scenario's results did not come from it throughout.
    pub(super) fn stop(mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("the daemon died during the scenario ({status})");
        }
        let pid = libc::pid_t::try_from(self.child.id()).context("daemon pid")?;
        // SAFETY: kill(2) on the pid of our own child, which has not been waited for (checked
        // just above), so the pid cannot have been reused by another process.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!("signalling the daemon: {}", std::io::Error::last_os_error());
        }
        let status = self.wait_exit(DAEMON_STOP)?;
        if !status.success() {
            bail!("the daemon stopped with {status}");
        }
        Ok(())
    }

    fn wait_exit(&mut self, patience: Duration) -> Result<ExitStatus> {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if t.elapsed() > patience {
                bail!(
                    "the daemon did not stop within {} s of SIGTERM",
                    patience.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Stopped already, or left on an error path: either way nothing may outlive the run.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_that_exits_at_once_is_an_error_and_leaves_nothing_behind() {
        // `false` takes any arguments and exits 1: a daemon binary that cannot start.
        let Some(exe) = ["/bin/false", "/usr/bin/false"]
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
        else {
            return;
        };
        let err = Daemon::start_with(exe, "t-exits")
            .map(|_| ())
            .expect_err("no daemon");
        assert!(format!("{err}").contains("before listening"), "{err}");
        let dir = std::env::temp_dir().join(format!(
            "xpreempt-bench-daemon-{}-t-exits",
            std::process::id()
        ));
        assert!(!dir.exists(), "{} left behind", dir.display());
    }

    /// The `xpreempt-bench` binary cargo builds beside this test, one directory up
    /// (target/debug/deps/..).
    fn xpreempt_bin() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        let bin = exe.parent()?.parent()?.join("xpreempt-bench");
        bin.exists().then_some(bin)
    }

    #[test]
    fn the_private_daemon_serves_agents_and_stops_cleanly() {
        let Some(exe) = xpreempt_bin() else {
            eprintln!("skipped: no xpreempt-bench binary next to the test (cargo test builds it)");
            return;
        };
        let d = Daemon::start_with(&exe, "t-serves").expect("daemon starts");
        let spec = xpreempt_bench::queue::AgentSpec {
            socket: d.socket().to_path_buf(),
            priority: 10,
        };
        let agent = spec.connect("test").expect("the agent reaches the daemon");
        assert!(agent.is_remote());
        drop(agent);
        let dir = d.dir.clone();
        d.stop().expect("a clean stop");
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
