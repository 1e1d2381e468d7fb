//! The operator's commands against a running daemon as a user runs them: `list` and `stats`
//! print one JSON object each and count clients as the metrics do, `policy --daemon show` says
//! which policy runs, and the daemon's log file holds plain text.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::xqueue::threaded::SharedXQueue;
use xpreempt_core::{Hints, Level, QueueConfig};
use xpreempt_daemon::{Config, Daemon};
use xpreempt_hal::reference::{RefDevice, RefQueue};

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xpreempt-ops-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn xpreempt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run xpreempt")
}

/// `--json` output: exactly one JSON object on stdout.
fn object(args: &[&str]) -> serde_json::Value {
    let o = xpreempt(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert!(v.is_object(), "{args:?} printed {v}");
    v
}

fn agent(socket: &Path, name: &str) -> Agent {
    Agent::start(Options {
        socket: socket.to_path_buf(),
        name: name.into(),
        ..Options::default()
    })
    .expect("agent starts")
}

fn queue(dev: &RefDevice, agent: &Agent, priority: i32) -> Arc<SharedXQueue<RefQueue>> {
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
            dev.create_queue(Level::Lv2),
        )
        .expect("queue registers")
}

fn scrape(addr: SocketAddr) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    body
}

fn metric(body: &str, name: &str) -> Option<u64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn list_and_stats_print_one_object_and_count_clients_as_the_metric_does() {
    let dir = scratch("count");
    let sock = dir.join("xpreempt.sock");
    let s = sock.to_str().unwrap();
    let mut config = Config::new(sock.clone());
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let daemon = Daemon::start(config).expect("daemon starts");
    let addr = daemon.metrics_addr().unwrap();

    // No agent yet: the asking operator is not a client, and the metric agrees.
    let stats = object(&["--json", "stats", "--socket", s]);
    assert_eq!(stats["clients"], 0, "{stats}");
    assert_eq!(metric(&scrape(addr), "xpreempt_clients"), Some(0));
    let list = object(&["--json", "list", "--socket", s]);
    assert_eq!(list["queues"].as_array().map(Vec::len), Some(0), "{list}");
    let table = String::from_utf8_lossy(&xpreempt(&["stats", "--socket", s]).stdout).into_owned();
    assert!(table.contains("policy hpf  clients 0"), "{table}");

    let dev = RefDevice::new();
    let a = agent(&sock, "counted");
    let _q = queue(&dev, &a, 3);
    let stats = object(&["--json", "stats", "--socket", s]);
    assert_eq!(stats["clients"], 1, "{stats}");
    assert_eq!(metric(&scrape(addr), "xpreempt_clients"), Some(1));
    let list = object(&["--json", "list", "--socket", s]);
    let rows = list["queues"].as_array().expect("queues");
    assert_eq!(rows.len(), 1, "{list}");
    assert_eq!(rows[0]["process_name"], "counted");
    assert_eq!(rows[0]["logical_priority"], 3);
    daemon.stop();
}

#[test]
fn policy_daemon_show_says_which_policy_runs() {
    let dir = scratch("policy");
    let sock = dir.join("xpreempt.sock");
    let s = sock.to_str().unwrap();
    let mut config = Config::new(sock.clone());
    config.policy = xpreempt_daemon::PolicySpec::Rust("fifo".into());
    let daemon = Daemon::start(config).expect("daemon starts");

    let o = xpreempt(&["policy", "--daemon", "--socket", s, "show"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("policy: fifo"), "{text}");
    assert!(text.contains("no eBPF program maps"), "{text}");
    let v = object(&["--json", "policy", "--daemon", "--socket", s, "show"]);
    assert_eq!(v["policy"], "fifo", "{v}");
    assert_eq!(v["devices"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(v["maps"].as_array().map(Vec::len), Some(0), "{v}");

    // A device opens with its first queue, under the same policy.
    let dev = RefDevice::new();
    let a = agent(&sock, "fifo-user");
    let _q = queue(&dev, &a, 0);
    let v = object(&["--json", "policy", "--daemon", "--socket", s, "show"]);
    assert_eq!(v["devices"][0]["device"], 0, "{v}");
    assert_eq!(v["devices"][0]["policy"], "fifo", "{v}");
    daemon.stop();
}

#[test]
fn the_daemons_log_file_holds_no_colour_codes() {
    let dir = scratch("log");
    let sock = dir.join("xpreempt.sock");
    let log = dir.join("daemon.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(["--log", "info", "daemon", "--socket"])
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        // Colour must stay off because stderr is a file, whatever NO_COLOR says.
        .env_remove("NO_COLOR")
        .spawn()
        .unwrap();
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A client connecting and leaving is logged at info.
    let _ = xpreempt(&["stats", "--socket", sock.to_str().unwrap()]);
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("xpreemptd serving"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "ANSI codes in the log file:\n{text:?}"
    );
}
