//! `xpreempt top` as an operator uses it: the real binary in a real terminal (tmux), started
//! before the daemon, watching it schedule two agents' queues, outliving it; keys sort and quit,
//! and the terminal comes back as it was.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::xqueue::threaded::SharedXQueue;
use xpreempt_core::{Command as GpuCommand, CommandProps, Hints, Level, QueueConfig};
use xpreempt_daemon::{Config, Daemon};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue, WallClock};

/// A tmux server of our own, so the test neither sees nor disturbs the user's sessions.
struct Tmux {
    server: String,
}

impl Tmux {
    fn new() -> Self {
        let v = Command::new("tmux").arg("-V").output();
        assert!(
            v.is_ok_and(|o| o.status.success()),
            "tmux is required for this test (CI installs it: apt-get install -y tmux)"
        );
        Self {
            server: format!("xpreempt-top-{}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.server, "-f", "/dev/null"])
            .args(args)
            .env_remove("TMUX")
            .output()
            .expect("run tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        assert!(self.run(&["send-keys", "-t", "top", keys]).status.success());
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "top"]).status.success()
    }

    /// Polls the screen until `f` holds; panics with the last screen if it never does.
    fn wait_for(&self, what: &str, limit: Duration, f: impl Fn(&str) -> bool) -> String {
        let t = Instant::now();
        loop {
            let s = self.screen();
            if f(&s) {
                return s;
            }
            assert!(t.elapsed() < limit, "{what}; the screen:\n{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// A reference device whose clock follows the wall clock until dropped.
struct Device {
    dev: RefDevice,
    _clock: WallClock,
}

impl Device {
    fn new() -> Self {
        let dev = RefDevice::new();
        let _clock = WallClock::start(&dev);
        Self { dev, _clock }
    }

    fn queue(&self, agent: &Agent, priority: i32) -> Arc<SharedXQueue<RefQueue>> {
        let decl = Declaration {
            device: 0,
            priority,
            hints: Hints::default(),
            interleave: None,
            level: Level::Lv2,
        };
        agent
            .queue(
                decl,
                QueueConfig::new(4, 2, Level::Lv2).unwrap(),
                self.dev.create_queue(Level::Lv2),
            )
            .expect("queue registers")
    }
}

fn agent(socket: &Path, name: &str) -> Agent {
    Agent::start(Options {
        socket: socket.to_path_buf(),
        name: name.into(),
        ..Options::default()
    })
    .expect("agent starts")
}

fn kernel(block_ns: u64) -> GpuCommand<RefKernel> {
    GpuCommand::kernel(RefKernel {
        blocks: 1,
        block_ns,
    })
    .with_props(CommandProps::new(false, true, false))
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xpreempt-top-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The cells of the row whose process is `name`: queue pid process dev prio eff state ...
fn row<'a>(screen: &'a str, name: &str) -> Option<Vec<&'a str>> {
    screen
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.len() >= 12 && c[2] == name)
}

fn line_of(screen: &str, name: &str) -> Option<usize> {
    screen
        .lines()
        .position(|l| l.split_whitespace().nth(2) == Some(name))
}

fn xpreempt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(args)
        .output()
        .expect("run xpreempt")
}

#[test]
fn top_shows_the_queues_live_sorts_on_keys_waits_for_the_daemon_and_quits_cleanly() {
    let tmux = Tmux::new();
    let dir = scratch();
    let sock = dir.join("xpreempt.sock");
    let sock_s = sock.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_xpreempt");

    assert_eq!(
        xpreempt(&["top", "--interval-ms", "0"]).status.code(),
        Some(2)
    );
    let o = xpreempt(&["--json", "top", "--socket", sock_s]);
    assert!(!o.status.success(), "a snapshot without a daemon");
    // Under --json the error is a JSON object on stdout, like every subcommand's.
    let err: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON error");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains("no xpreempt daemon")),
        "{err}"
    );

    // The shell around `top` records its exit status and the tty settings before and after.
    let (before, after, status) = (dir.join("before"), dir.join("after"), dir.join("status"));
    let script = format!(
        "stty -g > '{}'; '{bin}' top --socket '{sock_s}'; echo $? > '{}'; stty -g > '{}'; read x",
        before.display(),
        status.display(),
        after.display()
    );
    let o = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        &script,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Started before the daemon: it says so and keeps trying.
    tmux.wait_for(
        "no message about the missing daemon",
        Duration::from_secs(5),
        |s| s.contains("daemon unreachable, retrying every 250 ms") && s.contains(sock_s),
    );

    let daemon = Daemon::start(Config::new(sock.clone())).expect("daemon starts");
    let dev = Device::new();
    let (a, b) = (agent(&sock, "lowjob"), agent(&sock, "highjob"));
    let low = dev.queue(&a, 1);
    let high = dev.queue(&b, 10);
    // About 6 s of high-priority work, longer than the test looks, so the low queue stays held.
    for _ in 0..60 {
        high.submit(kernel(100_000_000)).unwrap();
    }
    for _ in 0..20 {
        low.submit(kernel(1_000_000)).unwrap();
    }

    let s = tmux.wait_for(
        "the low queue never showed as suspended",
        Duration::from_secs(5),
        |s| {
            row(s, "lowjob").is_some_and(|c| c[4] == "1" && c[6] == "suspended")
                && row(s, "highjob").is_some_and(|c| c[4] == "10" && c[5] == "10")
        },
    );
    eprintln!("{s}");
    let pid = std::process::id().to_string();
    assert_eq!(row(&s, "lowjob").unwrap()[1], pid);
    // The two agents: `top` itself, an operator, is not counted.
    assert!(
        s.contains("sort: priority") && s.contains("clients 2  queues 2"),
        "{s}"
    );
    assert!(line_of(&s, "highjob") < line_of(&s, "lowjob"), "{s}");
    // The GPU-time columns: the high queue's 100 ms kernels, measured from its completions.
    assert!(s.contains("gpu/cmd") && s.contains("gpu flight"), "{s}");
    let s = tmux.wait_for(
        "the high queue's GPU time per command never showed",
        Duration::from_secs(5),
        |s| row(s, "highjob").is_some_and(|c| c.len() == 18 && c[13].ends_with("ms")),
    );
    let per: f64 = row(&s, "highjob").unwrap()[13]
        .trim_end_matches("ms")
        .parse()
        .unwrap();
    assert!((90.0..400.0).contains(&per), "{s}");

    let o = xpreempt(&["--json", "top", "--socket", sock_s]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["queues"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["stats"]["clients"], 2,
        "two agents; neither `top` nor this snapshot counts"
    );

    tmux.keys("s");
    let s = tmux.wait_for("`s` did not sort by state", Duration::from_secs(2), |s| {
        s.contains("sort: state")
            && row(s, "lowjob").is_some_and(|c| c[6] == "suspended")
            && line_of(s, "lowjob") < line_of(s, "highjob")
    });
    eprintln!("{s}");

    // The daemon goes away under it: rows give way to the message, and `top` keeps going.
    drop((low, high, a, b));
    // Before the directory goes: the daemon wakes its accept thread through the socket path.
    daemon.stop();
    tmux.wait_for(
        "no message after the daemon left",
        Duration::from_secs(3),
        |s| s.contains("daemon unreachable") && row(s, "lowjob").is_none(),
    );

    tmux.keys("q");
    let t = Instant::now();
    // `after` is written last, so a complete one means `top` has exited.
    while !std::fs::read_to_string(&after).is_ok_and(|s| s.ends_with('\n')) {
        assert!(t.elapsed() < Duration::from_secs(3), "`q` did not end top");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read_to_string(&status).unwrap().trim(), "0");
    assert_eq!(
        std::fs::read_to_string(&before).unwrap(),
        std::fs::read_to_string(&after).unwrap(),
        "the tty was left in another mode (raw?)"
    );
    let alt = tmux.run(&["display-message", "-p", "-t", "top", "#{alternate_on}"]);
    assert_eq!(
        String::from_utf8_lossy(&alt.stdout).trim(),
        "0",
        "still on the alternate screen"
    );
    assert!(
        !tmux.screen().contains("sort:"),
        "top's screen is still showing"
    );
    tmux.keys("Enter");
    let t = Instant::now();
    while tmux.alive() {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the session did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
