//! Builds the simulated driver (`tests/sim/driver`, as `libcuda.so.1`) and the test application
//! (`tests/sim/app`) with gcc, runs a scenario of the application under the shim, and reads what
//! the simulated device did from its log.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// The longest a scenario may run; the application's own watchdog fires first (60 s).
const RUN_LIMIT: Duration = Duration::from_secs(90);

pub struct Build {
    pub dir: PathBuf,
    pub app: PathBuf,
}

fn gcc(args: &[&str]) {
    let out = Command::new("gcc").args(args).output().expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn sources(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .map(|p| p.to_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// Removes the build directories (and logs) of earlier runs whose process is gone; a failed
/// run's logs stay until the next run.
fn remove_stale(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("sim-")) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The driver and the application, built once per test binary.
pub fn build() -> &'static Build {
    static B: OnceLock<Build> = OnceLock::new();
    B.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sim");
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        remove_stale(tmp);
        let dir = tmp.join(format!("sim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libcuda.so.1");
        let app = dir.join("app");
        let driver = sources(&src.join("driver"));
        let mut args = vec![
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-fno-ipa-icf",
        ];
        // The driver's own references stay inside it, as libcuda's do: the shim (preloaded)
        // must not see the driver's internal calls.
        args.extend(["-Wl,-Bsymbolic", "-o", lib.to_str().unwrap()]);
        args.extend(driver.iter().map(String::as_str));
        args.push("-lpthread");
        gcc(&args);
        let apps = sources(&src.join("app"));
        let mut args = vec!["-O1", "-Wall", "-Werror", "-o", app.to_str().unwrap()];
        args.extend(apps.iter().map(String::as_str));
        args.extend(["-ldl", "-lpthread"]);
        gcc(&args);
        Build { dir, app }
    })
}

/// The shim's cdylib, built beside the test binary.
pub fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let so = exe.parent().unwrap().join("libxpreempt_shim.so");
    assert!(so.is_file(), "{} (built with the crate)", so.display());
    so
}

/// How a scenario runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: String,
    /// Under the shim with interception on (else: the simulated driver alone).
    pub shim: bool,
    /// Launches go through the shim's queues (not pass-through): the application's checks of
    /// the shim's counters apply.
    pub queued: bool,
    pub env: Vec<(String, String)>,
}

/// The simulated driver alone: the application's checks must hold for CUDA's semantics as
/// the simulation implements them, or the test itself is wrong.
pub fn native() -> Config {
    Config {
        name: "native".into(),
        shim: false,
        queued: false,
        env: Vec::new(),
    }
}

fn intercepting(name: String, env: &[(&str, String)]) -> Config {
    let mut v = vec![("XPREEMPT_INTERCEPT".to_string(), "1".to_string())];
    v.extend(env.iter().map(|(k, val)| (k.to_string(), val.clone())));
    Config {
        name,
        shim: true,
        queued: true,
        env: v,
    }
}

/// Pass-through mode: every call goes to the driver as made while the queues only observe.
pub fn pass_through() -> Config {
    let mut c = intercepting("pass".into(), &[("XPREEMPT_PASS_THROUGH", "1".into())]);
    c.queued = false;
    c
}

/// The shim's defaults (a window of 16 with a sync point every 4 launches).
pub fn defaults() -> Config {
    intercepting("defaults".into(), &[])
}

/// A window of one command: behind a gated kernel, everything on its stream is buffered.
pub fn window1() -> Config {
    intercepting("window1".into(), &[("XPREEMPT_WINDOW", "1".into())])
}

/// Random suspensions (every ~200 µs) with a small window.
pub fn chaos(seed: u64) -> Config {
    intercepting(
        format!("chaos{seed}"),
        &[
            ("XPREEMPT_WINDOW", "2".into()),
            ("XPREEMPT_CHAOS", format!("{seed}:200")),
        ],
    )
}

/// The same at Lv2 (`XPREEMPT_LEVEL=2`): guard-built kernels are stopped and relaunched.
pub fn lv2(mut c: Config) -> Config {
    c.name = format!("{}-lv2", c.name);
    c.env.push(("XPREEMPT_LEVEL".into(), "2".into()));
    c
}

/// The same at Lv3 (`XPREEMPT_LEVEL=3`) with the test machinery's stand-in for the process's
/// timeslice (`XPREEMPT_TEST_LV3=1`), so that Lv3 is available without a GPU.
pub fn lv3(mut c: Config) -> Config {
    c.name = format!("{}-lv3", c.name);
    c.env.push(("XPREEMPT_LEVEL".into(), "3".into()));
    c.env.push(("XPREEMPT_TEST_LV3".into(), "1".into()));
    c
}

/// The same at logical priority `p` (`XPREEMPT_PRIORITY`).
pub fn at_priority(mut c: Config, p: i32) -> Config {
    c.name = format!("{}-p{p}", c.name);
    c.env.push(("XPREEMPT_PRIORITY".into(), p.to_string()));
    c
}

/// Names every run's files uniquely within the test binary.
fn tag(scenario: &str, config: &Config) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{scenario}-{}-{}",
        config.name,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A scenario's process, with stdin and stdout piped (for the scenarios that talk to the test).
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
    pub label: String,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: PathBuf,
    pub stdout: Vec<String>,
}

impl Proc {
    pub fn spawn(scenario: &str, config: &Config, extra_env: &[(&str, &str)]) -> Proc {
        let b = build();
        let label = tag(scenario, config);
        let log = b.dir.join(format!("{label}.log"));
        let stderr = b.dir.join(format!("{label}.err"));
        let mut c = Command::new(&b.app);
        c.arg(scenario)
            .env("LD_LIBRARY_PATH", &b.dir)
            .env("SIM_LOG", &log)
            // Never a daemon of this machine: local mode unless a test gives its own socket.
            .env("XPREEMPT_SOCKET", b.dir.join("no-daemon.sock"))
            .env("APP_UNDER_SHIM", if config.queued { "1" } else { "0" })
            .env_remove("XPREEMPT_INTERCEPT")
            .env_remove("XPREEMPT_CHAOS")
            .env_remove("XPREEMPT_WINDOW")
            .env_remove("XPREEMPT_PRIORITY")
            .env_remove("XPREEMPT_PASS_THROUGH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        if config.shim {
            c.env("LD_PRELOAD", shim());
        }
        for (k, v) in &config.env {
            c.env(k, v);
        }
        for (k, v) in extra_env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("the application starts");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            log,
            label,
            stdin,
            lines,
            stderr,
            stdout: Vec::new(),
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for the next line the application prints, which must be `want`.
    pub fn expect(&mut self, want: &str) {
        self.expect_within(want, RUN_LIMIT);
    }

    /// [`Self::expect`], for at most `limit`.
    pub fn expect_within(&mut self, want: &str, limit: Duration) {
        match self.lines.recv_timeout(limit) {
            Ok(line) => {
                assert_eq!(line, want, "{}: {}", self.label, self.stderr());
                self.stdout.push(line);
            }
            Err(_) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{}: no '{want}' line within {limit:?}; stderr: {}",
                    self.label,
                    self.stderr()
                );
            }
        }
    }

    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for the application to exit, which it must do successfully.
    pub fn finish(mut self) -> Outcome {
        drop(self.stdin.take());
        let deadline = Instant::now() + RUN_LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{}: still running after {RUN_LIMIT:?}: {}",
                    self.label,
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.stdout.push(line);
        }
        assert!(
            status.success(),
            "{}: {status}: {}\n(driver log: {})",
            self.label,
            self.stderr(),
            self.log.display()
        );
        let result = self
            .stdout
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("result "));
        let field = |name: &str| -> u64 {
            result
                .and_then(|r| r.split(' ').find_map(|f| f.strip_prefix(name)))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{}: no {name} in {:?}", self.label, self.stdout))
        };
        let (launches, buffered) = (field("launches="), field("buffered="));
        let log = Log::read(&self.log);
        log.assert_sound(&self.label);
        Outcome {
            stderr: self.stderr(),
            label: self.label,
            stdout: self.stdout,
            launches,
            buffered,
            log,
        }
    }
}

pub struct Outcome {
    pub label: String,
    pub stdout: Vec<String>,
    /// The shim's counters at the end (0 without it).
    pub launches: u64,
    pub buffered: u64,
    pub log: Log,
    pub stderr: String,
}

/// Runs a scenario that needs no conversation with the test.
pub fn run(scenario: &str, config: &Config) -> Outcome {
    Proc::spawn(scenario, config, &[]).finish()
}

/// Runs a scenario natively, in pass-through mode, with the shim's defaults, with a window of
/// one and under random suspensions, applying `check` to each; under the window of one, launches must have been buffered.
pub fn everywhere(scenario: &str, check: impl Fn(&Outcome)) {
    let configs = [
        native(),
        pass_through(),
        defaults(),
        window1(),
        chaos(1),
        chaos(2),
        chaos(3),
        chaos(4),
    ];
    for config in &configs {
        let o = run(scenario, config);
        if config.queued {
            assert!(
                o.launches > 0,
                "{}: nothing went through the shim's queues",
                o.label
            );
        }
        if config.name == "window1" {
            assert!(
                o.buffered > 0,
                "{}: no launch was buffered, so the buffer was not tested",
                o.label
            );
        }
        check(&o);
    }
}

/// A command the simulated device ran.
#[derive(Clone, Debug)]
pub struct Done {
    pub kind: char,
    pub id: i64,
    /// The priority of the stream it ran on.
    pub prio: i64,
    pub start: u64,
    pub end: u64,
    pub graph: u64,
}

/// The runs of one guard-built kernel (each launch and relaunch of its id).
#[derive(Clone, Debug, Default)]
pub struct GuardRuns {
    pub runs: usize,
    /// Runs that a set flag ended between blocks.
    pub stopped: usize,
    /// Runs stopped after some of their blocks ran and before the last one.
    pub stopped_midway: usize,
    /// Blocks run, over all runs.
    pub ran: u64,
    /// Runs that got guard values (the flag and a completion slot).
    pub with_guard: usize,
    /// The distinct epochs its runs had.
    pub epochs: Vec<u64>,
    /// The first start and the last end of the runs that ran blocks.
    span: Option<(u64, u64)>,
}

pub struct Log {
    pub path: PathBuf,
    pub lines: Vec<String>,
    pub done: Vec<Done>,
    /// Kernel id → its runs, in the order they ended (a guard-built kernel's runs as one).
    kernels: HashMap<i64, Vec<Done>>,
    /// Guard-built kernel id → its runs.
    pub guarded: HashMap<i64, GuardRuns>,
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
}

impl Log {
    pub fn read(path: &Path) -> Log {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(String::from).collect();
        let mut done = Vec::new();
        let mut kernels: HashMap<i64, Vec<Done>> = HashMap::new();
        let mut guarded: HashMap<i64, GuardRuns> = HashMap::new();
        for l in lines.iter().filter(|l| l.starts_with("done ")) {
            let num = |n| field(l, n).unwrap().parse::<u64>().unwrap();
            let d = Done {
                kind: field(l, "kind").unwrap().chars().next().unwrap(),
                id: field(l, "id").unwrap().parse().unwrap(),
                prio: field(l, "prio").unwrap().parse().unwrap(),
                start: num("start"),
                end: num("end"),
                graph: num("graph"),
            };
            if let Some(g) = field(l, "guard") {
                // A guard-built kernel: its runs together are its one execution.
                let r = guarded.entry(d.id).or_default();
                let (stopped, ran) = (num("stopped") == 1, num("ran"));
                r.runs += 1;
                r.stopped += usize::from(stopped);
                r.stopped_midway += usize::from(stopped && ran > 0);
                r.ran += ran;
                r.with_guard += usize::from(g == "1");
                let epoch = num("epoch");
                if !r.epochs.contains(&epoch) {
                    r.epochs.push(epoch);
                }
                if ran > 0 {
                    let (s, e) = r.span.unwrap_or((d.start, d.end));
                    r.span = Some((s.min(d.start), e.max(d.end)));
                }
            } else if d.kind == 'K' {
                kernels.entry(d.id).or_default().push(d.clone());
            }
            done.push(d);
        }
        for (id, r) in &guarded {
            if let Some((start, end)) = r.span {
                kernels.entry(*id).or_default().push(Done {
                    kind: 'K',
                    id: *id,
                    prio: 0,
                    start,
                    end,
                    graph: 0,
                });
            }
        }
        Log {
            path: path.to_path_buf(),
            lines,
            done,
            kernels,
            guarded,
        }
    }

    /// Lines starting with `prefix`.
    pub fn lines_with(&self, prefix: &str) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|l| l.starts_with(prefix))
            .map(String::as_str)
            .collect()
    }

    /// The index of the first line starting with `prefix` and having the field `part` (any
    /// such line when `part` is empty).
    pub fn position(&self, prefix: &str, part: &str) -> Option<usize> {
        self.lines.iter().position(|l| {
            l.starts_with(prefix) && (part.is_empty() || l.split(' ').any(|f| f == part))
        })
    }

    /// No violation; every command submitted to the device ran; no kernel ran twice (outside
    /// graph launches, whose kernels repeat).
    pub fn assert_sound(&self, label: &str) {
        let v = self.lines_with("violation");
        assert!(v.is_empty(), "{label}: {v:?} (log {})", self.path.display());
        let submitted = self.lines_with("submit ").len();
        assert_eq!(
            submitted,
            self.done.len(),
            "{label}: {submitted} commands reached the device, {} ran (log {})",
            self.done.len(),
            self.path.display()
        );
        for (id, runs) in &self.kernels {
            let plain = runs.iter().filter(|d| d.graph == 0).count();
            assert!(
                plain <= 1,
                "{label}: kernel {id} ran {plain} times (log {})",
                self.path.display()
            );
        }
    }

    pub fn runs(&self, id: i64) -> &[Done] {
        self.kernels.get(&id).map_or(&[], Vec::as_slice)
    }

    /// The single run of kernel `id`.
    pub fn kernel(&self, id: i64) -> &Done {
        match self.runs(id) {
            [d] => d,
            r => panic!(
                "kernel {id} ran {} times (log {})",
                r.len(),
                self.path.display()
            ),
        }
    }

    pub fn assert_ran(&self, ids: impl IntoIterator<Item = i64>) {
        for id in ids {
            self.kernel(id);
        }
    }

    /// Kernel `a` ended before kernel `b` started (each ran once).
    pub fn assert_before(&self, a: i64, b: i64) {
        let (x, y) = (self.kernel(a), self.kernel(b));
        assert!(
            x.end < y.start,
            "kernel {b} (ticks {}-{}) started before kernel {a} (ticks {}-{}) ended (log {})",
            y.start,
            y.end,
            x.start,
            x.end,
            self.path.display()
        );
    }

    /// The kernels ran one after the other, in this order.
    pub fn assert_in_order(&self, ids: &[i64]) {
        for w in ids.windows(2) {
            self.assert_before(w[0], w[1]);
        }
    }
}
