//! Helpers for the global-mode tests: a daemon on a private socket, agents with reference-device
//! queues whose virtual clock follows the wall clock, and an operator connection.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::xqueue::threaded::SharedXQueue;
use xpreempt_core::{Command, CommandProps, Hints, Level, QueueConfig};
use xpreempt_daemon::{Config, Daemon};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue, WallClock};
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, QueueRow};

pub fn socket(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xpreempt-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("xpreempt.sock")
}

pub fn daemon(socket: &Path) -> Daemon {
    let mut c = Config::new(socket.to_path_buf());
    c.watchdog = Duration::from_millis(300);
    Daemon::start(c).expect("daemon starts")
}

pub fn agent(socket: &Path, name: &str) -> Agent {
    Agent::start(Options {
        socket: socket.to_path_buf(),
        name: name.into(),
        ..Options::default()
    })
    .expect("agent starts")
}

/// A reference device whose clock follows the wall clock while this lives.
pub struct Device {
    pub dev: RefDevice,
    _clock: WallClock,
}

impl Device {
    pub fn new() -> Self {
        let dev = RefDevice::new();
        let _clock = WallClock::start(&dev);
        Self { dev, _clock }
    }
}

pub fn decl(priority: i32) -> Declaration {
    Declaration {
        device: 0,
        priority,
        hints: Hints::default(),
        interleave: None,
        level: Level::Lv2,
    }
}

pub fn queue(agent: &Agent, dev: &Device, priority: i32) -> Arc<SharedXQueue<RefQueue>> {
    agent
        .queue(
            decl(priority),
            QueueConfig::new(4, 2, Level::Lv2).unwrap(),
            dev.dev.create_queue(Level::Lv2),
        )
        .expect("queue registers")
}

pub fn kernel(blocks: u32, block_ns: u64) -> Command<RefKernel> {
    Command::kernel(RefKernel { blocks, block_ns })
        .with_props(CommandProps::new(false, true, false))
}

/// An operator's connection, as the CLI makes it.
pub struct Operator(xpreempt_ipc::operator::Operator);

impl Operator {
    pub fn connect(socket: &Path) -> Self {
        Self(xpreempt_ipc::operator::Operator::connect(socket).expect("operator connects"))
    }

    /// The daemon's answer; a refusal comes back as `DaemonMsg::Refused`.
    pub fn ask(&mut self, msg: &ClientMsg) -> DaemonMsg {
        match self.0.ask(msg) {
            Ok(reply) => reply,
            Err(xpreempt_ipc::operator::OperatorError::Refused(reason)) => {
                DaemonMsg::Refused { reason }
            }
            Err(e) => panic!("{e}"),
        }
    }

    pub fn list(&mut self) -> Vec<QueueRow> {
        self.0.list().expect("list")
    }
}

/// Polls `f` every 200 µs until it holds or `limit` passes; returns how long it took.
pub fn within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

/// `xpreemptd` as a separate process on `sock` with `args`, killed when dropped.
pub struct DaemonProcess(pub std::process::Child);

impl DaemonProcess {
    pub fn start(sock: &Path, args: &[&str]) -> Self {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_xpreemptd"))
            .arg("--socket")
            .arg(sock)
            .args(args)
            .env("XPREEMPT_LOG", "warn")
            .spawn()
            .expect("xpreemptd starts");
        let d = Self(child);
        assert!(
            within(Duration::from_secs(10), || {
                std::os::unix::net::UnixStream::connect(sock).is_ok()
            })
            .is_some(),
            "xpreemptd never listened"
        );
        d
    }

    /// Stops (SIGSTOP: returns once every thread is stopped) or continues (SIGCONT) the
    /// daemon.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        let r = unsafe { libc::kill(self.0.id() as libc::pid_t, signal) };
        assert_eq!(r, 0, "kill({signal})");
        if signal == libc::SIGSTOP {
            let stopped = within(Duration::from_secs(5), || {
                let tasks = std::fs::read_dir(format!("/proc/{}/task", self.0.id()));
                tasks.into_iter().flatten().flatten().all(|t| {
                    std::fs::read_to_string(t.path().join("stat"))
                        .ok()
                        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
                        .unwrap_or(true)
                })
            });
            assert!(stopped.is_some(), "the daemon did not stop");
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
