//! Where the RM hooks' program runs: in the daemon (one round trip per event that needs an
//! answer), or in this process against the state directory's installed program and pinned maps
//! (shared with other processes under its lock), or against a private object file. Every failure
//! becomes the driver's default with a note that says why; nothing here can fail the caller.

use std::path::PathBuf;
use std::time::Duration;
use xpreempt_bpf::pin::StateDir;
use xpreempt_bpf::rm::{RmGroup, RmRuntime, rm_queue_id};
use xpreempt_bpf::{BpfHooks, BpfProgram, LoadOptions};
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, RmGroupDecl, Role};
use xpreempt_ipc::operator::Operator;

/// `XPREEMPT_RM_HOOKS` / `XPREEMPT_RM_POLICY`: where the program is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Off,
    /// The daemon at this socket.
    Daemon(PathBuf),
    /// The installed program of the state directory (`xpreempt policy load`).
    Pinned(PathBuf),
    /// A private object: its maps live and die with this process.
    File(PathBuf),
    /// The daemon if it answers, else the state directory's program if one is installed.
    Auto {
        socket: PathBuf,
        state: PathBuf,
    },
}

impl Mode {
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Self {
        let socket = || {
            get("XPREEMPT_SOCKET")
                .filter(|s| !s.is_empty())
                .map_or_else(xpreempt_ipc::default_socket, PathBuf::from)
        };
        let state = || {
            get("XPREEMPT_STATE_DIR")
                .filter(|s| !s.is_empty())
                .map_or_else(|| StateDir::from_env().root().to_path_buf(), PathBuf::from)
        };
        let policy = get("XPREEMPT_RM_POLICY").filter(|p| !p.is_empty());
        match get("XPREEMPT_RM_HOOKS").as_deref().map(str::trim) {
            Some("daemon") => Mode::Daemon(socket()),
            Some("pinned") => Mode::Pinned(state()),
            Some("auto") => Mode::Auto {
                socket: socket(),
                state: state(),
            },
            Some("file") | None | Some("") if policy.is_some() => {
                Mode::File(PathBuf::from(policy.unwrap_or_default()))
            }
            _ => Mode::Off,
        }
    }
}

/// `task_init`'s answer, in the driver's units.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    pub timeslice_us: Option<u64>,
    pub interleave: Option<u32>,
    pub class: u32,
    /// A program decided.
    pub ran: bool,
    /// Why the driver's defaults stand (no program, it failed, the daemon went away…).
    pub note: Option<String>,
}

/// A bounded daemon round trip: a stuck daemon cannot hold libcuda longer than this.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(2);

pub enum Backend {
    Daemon {
        socket: PathBuf,
        link: Option<Operator>,
        /// The process that opened `link` (a forked child opens its own).
        pid: u32,
    },
    Pinned {
        state: StateDir,
        runtime: RmRuntime,
    },
    Private {
        hooks: Box<BpfHooks>,
        runtime: RmRuntime,
    },
}

fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "cuda-process".into())
}

fn connect(socket: &std::path::Path) -> Result<Operator, String> {
    let op = Operator::connect_as(socket, Role::Rm, &process_name()).map_err(|e| {
        let mut m = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            m += &format!(": {s}");
            src = s.source();
        }
        m
    })?;
    op.set_timeout(Some(DAEMON_TIMEOUT))
        .map_err(|e| format!("socket timeout: {e}"))?;
    Ok(op)
}

/// CLOCK_MONOTONIC in ns: one clock for every process sharing pinned maps.
pub fn monotonic_ns() -> u64 {
    // SAFETY: clock_gettime into a zeroed timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

fn pid() -> u32 {
    std::process::id()
}

impl Backend {
    /// Opens the backend `mode` names, or says why the hooks stay off.
    pub fn open(mode: &Mode) -> Result<(Self, String), String> {
        match mode {
            Mode::Off => Err("off".into()),
            Mode::Daemon(socket) => {
                let link = connect(socket)?;
                Ok((
                    Backend::Daemon {
                        socket: socket.clone(),
                        link: Some(link),
                        pid: pid(),
                    },
                    format!("the daemon at {}", socket.display()),
                ))
            }
            Mode::Pinned(dir) => {
                let state = StateDir::new(dir);
                let installed = state.installed().map_err(|e| e.to_string())?;
                // Verify it now, so that a rejected program is reported once, at the start.
                state
                    .load_installed(LoadOptions::default())
                    .map_err(|e| format!("{e}: {}", chain(&e)))?;
                Ok((
                    Backend::Pinned {
                        state,
                        runtime: RmRuntime::new(),
                    },
                    format!(
                        "the installed program `{}` of {}",
                        installed.name,
                        dir.display()
                    ),
                ))
            }
            Mode::File(path) => {
                let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
                let name = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("policy");
                let program = BpfProgram::load(name, &bytes, LoadOptions::default())
                    .map_err(|e| format!("{} was rejected: {e}", path.display()))?;
                Ok((
                    Backend::Private {
                        hooks: Box::new(BpfHooks::new(program)),
                        runtime: RmRuntime::new(),
                    },
                    format!("{} (private maps)", path.display()),
                ))
            }
            Mode::Auto { socket, state } => {
                Self::open(&Mode::Daemon(socket.clone())).or_else(|daemon| {
                    Self::open(&Mode::Pinned(state.clone()))
                        .map_err(|pinned| format!("no daemon ({daemon}); no program ({pinned})"))
                })
            }
        }
    }

    pub fn is_daemon(&self) -> bool {
        matches!(self, Backend::Daemon { .. })
    }

    /// The daemon link, reopened in a forked child or after a failure.
    fn link(&mut self) -> Result<&mut Operator, String> {
        let Backend::Daemon { socket, link, pid } = self else {
            return Err("not a daemon backend".into());
        };
        if *pid != self::pid() {
            // The parent's connection: this child's copy of it closes; the parent's stays.
            *link = None;
            *pid = self::pid();
        }
        if link.is_none() {
            *link = Some(connect(socket)?);
        }
        link.as_mut().ok_or_else(|| "no link".into())
    }

    fn ask(&mut self, msg: &ClientMsg) -> Result<DaemonMsg, String> {
        let r = self.link()?.ask(msg).map_err(|e| e.to_string());
        if r.is_err()
            && let Backend::Daemon { link, .. } = self
        {
            *link = None;
        }
        r
    }

    fn tell(&mut self, msg: &ClientMsg) {
        let r = self
            .link()
            .and_then(|l| l.tell(msg).map_err(|e| e.to_string()));
        if r.is_err()
            && let Backend::Daemon { link, .. } = self
        {
            *link = None;
        }
    }

    pub fn task_init(&mut self, g: &RmGroup) -> Decision {
        let now = monotonic_ns();
        let from_runtime = |d: xpreempt_bpf::rm::RmDecision| Decision {
            timeslice_us: d.timeslice_us,
            interleave: d.interleave,
            class: d.class,
            ran: d.ran,
            note: d
                .failure
                .or_else(|| (!d.ran).then(|| "the program has no task_init".into())),
        };
        match self {
            Backend::Daemon { .. } => {
                let msg = ClientMsg::RmTaskInit {
                    group: RmGroupDecl {
                        device: g.device,
                        tsg: g.tsg,
                        default_timeslice_us: g.default_timeslice_us,
                        default_priority: g.default_priority,
                        hint_class: g.hint_class,
                    },
                };
                match self.ask(&msg) {
                    Ok(DaemonMsg::RmDecision(d)) => Decision {
                        timeslice_us: d.timeslice_us,
                        interleave: d.interleave,
                        class: d.class,
                        ran: d.ran,
                        note: d.note,
                    },
                    Ok(other) => default_because(format!("the daemon answered {other:?}")),
                    Err(e) => default_because(format!("the daemon: {e}")),
                }
            }
            Backend::Pinned { state, runtime } => state
                .with_installed(LoadOptions::default(), |h| runtime.task_init(h, g, now))
                .map_or_else(|e| default_because(pin_error(&e)), from_runtime),
            Backend::Private { hooks, runtime } => from_runtime(runtime.task_init(hooks, g, now)),
        }
    }

    /// Whether group `tsg` may be enabled now; with a note when the driver's default (admit)
    /// applies for want of an answer.
    pub fn schedule(&mut self, device: u32, tsg: u32, channels: u32) -> (bool, Option<String>) {
        let now = monotonic_ns();
        let id = rm_queue_id(pid(), device, tsg);
        match self {
            Backend::Daemon { .. } => {
                let msg = ClientMsg::RmSchedule {
                    device,
                    tsg,
                    channels,
                };
                match self.ask(&msg) {
                    Ok(DaemonMsg::RmAdmission { allow, note, .. }) => (allow, note),
                    Ok(other) => (true, Some(format!("the daemon answered {other:?}"))),
                    Err(e) => (true, Some(format!("the daemon: {e}"))),
                }
            }
            Backend::Pinned { state, runtime } => match state
                .with_installed(LoadOptions::default(), |h| {
                    runtime.schedule(h, id, channels, now)
                }) {
                Ok(a) => (a.allow, a.failure),
                Err(e) => (true, Some(pin_error(&e))),
            },
            Backend::Private { hooks, runtime } => {
                let a = runtime.schedule(hooks, id, channels, now);
                (a.allow, a.failure)
            }
        }
    }

    pub fn enabled(&mut self, device: u32, tsg: u32) {
        match self {
            Backend::Daemon { .. } => self.tell(&ClientMsg::RmEnabled { device, tsg }),
            Backend::Pinned { runtime, .. } | Backend::Private { runtime, .. } => {
                runtime.enabled(rm_queue_id(pid(), device, tsg))
            }
        }
    }

    /// `count` events of one kind for group `tsg`, spread evenly over `since..now` (launches
    /// are reported in batches); returns a failure note.
    pub fn work(
        &mut self,
        device: u32,
        tsg: u32,
        (event, kind, token): (u32, u32, u64),
        count: u64,
        since: u64,
    ) -> Option<String> {
        let now = monotonic_ns();
        let id = rm_queue_id(pid(), device, tsg);
        let run = |h: &mut BpfHooks, rt: &mut RmRuntime| {
            let mut failure = None;
            for i in 0..count {
                let at = since + (now.saturating_sub(since)) * (i + 1) / count.max(1);
                failure = failure.or(rt.work_submit(h, id, event, kind, token + i, at));
            }
            failure
        };
        match self {
            Backend::Daemon { .. } => {
                for i in 0..count {
                    self.tell(&ClientMsg::RmWork {
                        device,
                        tsg,
                        event,
                        kind,
                        token: token + i,
                    });
                }
                None
            }
            Backend::Pinned { state, runtime } => state
                .with_installed(LoadOptions::default(), |h| run(h, runtime))
                .unwrap_or_else(|e| Some(pin_error(&e))),
            Backend::Private { hooks, runtime } => run(hooks, runtime),
        }
    }

    pub fn destroy(&mut self, device: u32, tsg: u32) -> Option<String> {
        let now = monotonic_ns();
        let id = rm_queue_id(pid(), device, tsg);
        match self {
            Backend::Daemon { .. } => {
                self.tell(&ClientMsg::RmTaskDestroy { device, tsg });
                None
            }
            Backend::Pinned { state, runtime } => state
                .with_installed(LoadOptions::default(), |h| runtime.task_destroy(h, id, now))
                .unwrap_or_else(|e| Some(pin_error(&e))),
            Backend::Private { hooks, runtime } => runtime.task_destroy(hooks, id, now),
        }
    }
}

fn default_because(note: String) -> Decision {
    Decision {
        note: Some(note),
        ..Decision::default()
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = Vec::new();
    let mut src = e.source();
    while let Some(s) = src {
        out.push(s.to_string());
        src = s.source();
    }
    out.join(": ")
}

fn pin_error(e: &xpreempt_bpf::pin::PinError) -> String {
    let c = chain(e);
    if c.is_empty() {
        format!("the state directory: {e}")
    } else {
        format!("the state directory: {e}: {c}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_mode_comes_from_the_environment() {
        assert_eq!(Mode::from_env(env(&[])), Mode::Off);
        assert_eq!(
            Mode::from_env(env(&[
                ("XPREEMPT_RM_HOOKS", "daemon"),
                ("XPREEMPT_SOCKET", "/s")
            ])),
            Mode::Daemon("/s".into())
        );
        assert_eq!(
            Mode::from_env(env(&[
                ("XPREEMPT_RM_HOOKS", "pinned"),
                ("XPREEMPT_STATE_DIR", "/st")
            ])),
            Mode::Pinned("/st".into())
        );
        assert_eq!(
            Mode::from_env(env(&[("XPREEMPT_RM_POLICY", "/p.o")])),
            Mode::File("/p.o".into())
        );
        assert_eq!(
            Mode::from_env(env(&[
                ("XPREEMPT_RM_POLICY", "/p.o"),
                ("XPREEMPT_RM_HOOKS", "off")
            ])),
            Mode::Off
        );
    }

    #[test]
    fn a_missing_daemon_or_program_keeps_the_hooks_off_with_a_reason() {
        let dir = std::env::temp_dir().join(format!("xpreempt-rm-backend-{}", pid()));
        let why = Backend::open(&Mode::Auto {
            socket: dir.join("no.sock"),
            state: dir.join("state"),
        })
        .err()
        .unwrap();
        assert!(
            why.contains("no daemon") && why.contains("no program"),
            "{why}"
        );
        let why = Backend::open(&Mode::File(dir.join("missing.o")))
            .err()
            .unwrap();
        assert!(why.contains("missing.o"), "{why}");
    }

    #[test]
    fn a_rejected_program_is_reported_and_never_runs() {
        let bad = xpreempt_bpf::built_object("bad_loop").expect("clang built the test programs");
        let why = Backend::open(&Mode::File(bad)).err().unwrap();
        assert!(why.contains("rejected"), "{why}");
    }

    #[test]
    fn a_private_program_decides_and_a_dead_daemon_leaves_the_defaults() {
        let obj = xpreempt_bpf::built_object("lcbe").expect("clang built the policies");
        let (mut b, _) = Backend::open(&Mode::File(obj)).unwrap();
        let g = RmGroup {
            pid: pid(),
            tsg: 9,
            default_timeslice_us: 1024,
            ..RmGroup::default()
        };
        let d = b.task_init(&g);
        assert_eq!((d.timeslice_us, d.ran, d.note), (Some(200), true, None));
        assert_eq!(b.schedule(0, 9, 8), (true, None));
        assert_eq!(b.destroy(0, 9), None);

        let mut gone = Backend::Daemon {
            socket: std::env::temp_dir().join("xpreempt-no-daemon.sock"),
            link: None,
            pid: pid(),
        };
        let d = gone.task_init(&g);
        assert_eq!(d.timeslice_us, None);
        assert!(d.note.unwrap().contains("the daemon"));
        let (allow, note) = gone.schedule(0, 9, 8);
        assert!(allow && note.is_some(), "admission fails open");
    }
}
