//! The daemon's Prometheus metrics as a scraper reads them: suspend and resume latency are
//! histograms (cumulative `_bucket`s ending at `+Inf`, `_sum`, `_count`), and every metric the
//! shipped Grafana dashboard queries is one the daemon exports.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::xqueue::threaded::SharedXQueue;
use xpreempt_core::{Command as GpuCommand, CommandProps, Hints, Level, QueueConfig};
use xpreempt_daemon::{Config, Daemon};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue, WallClock};

fn socket(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xpreempt-metrics-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("xpreempt.sock")
}

fn scrape(addr: SocketAddr) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.0 200 OK"), "{head}");
    body.to_string()
}

/// One sample line: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The text exposition format, strictly: `# HELP`/`# TYPE` comments, then `name{k="v",…} value`.
fn parse(body: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value in `{line}`")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let inner = rest.strip_suffix('}').expect("labels close");
                let labels = inner
                    .split("\",")
                    .map(|kv| {
                        let (k, v) = kv.split_once("=\"").expect("k=\"v\"");
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (series.to_string(), BTreeMap::new()),
        };
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "metric name `{name}`"
        );
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    (types, samples)
}

/// Every series name the daemon exports: each family, and a histogram's three series.
fn exported(types: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (name, kind) in types {
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        } else {
            names.insert(name.clone());
        }
    }
    names
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

fn kernel(block_ns: u64) -> GpuCommand<RefKernel> {
    GpuCommand::kernel(RefKernel {
        blocks: 1,
        block_ns,
    })
    .with_props(CommandProps::new(false, true, false))
}

/// A daemon whose low queue a high one has preempted and let run again, and its metrics.
fn metrics_after_a_preemption(test: &str) -> String {
    let sock = socket(test);
    let mut config = Config::new(sock.clone());
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let daemon = Daemon::start(config).expect("daemon starts");
    let addr = daemon.metrics_addr().unwrap();
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let (a, b) = (agent(&sock, "low"), agent(&sock, "high"));
    let low = queue(&dev, &a, 1);
    let high = queue(&dev, &b, 10);
    for _ in 0..20 {
        low.submit(kernel(2_000_000)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    for _ in 0..3 {
        high.submit(kernel(5_000_000)).unwrap();
    }
    high.wait_all().unwrap();
    low.wait_all().unwrap();
    // The agents publish what their queues counted on their next heartbeat.
    let t = Instant::now();
    loop {
        let body = scrape(addr);
        let (_, samples) = parse(&body);
        let counted = |name: &str| {
            samples
                .iter()
                .any(|s| s.name == name && s.labels["process"] == "low" && s.value >= 1.0)
        };
        if counted("xpreempt_queue_suspend_latency_seconds_count")
            && counted("xpreempt_queue_resume_latency_seconds_count")
        {
            daemon.stop();
            return body;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no suspension and resumption of the low queue published:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn suspend_and_resume_latencies_are_prometheus_histograms() {
    let body = metrics_after_a_preemption("histograms");
    let (types, samples) = parse(&body);
    for family in [
        "xpreempt_queue_suspend_latency_seconds",
        "xpreempt_queue_resume_latency_seconds",
    ] {
        assert_eq!(types.get(family).map(String::as_str), Some("histogram"));
        // Per queue: buckets in order of `le`, cumulative, ending at +Inf = _count.
        let mut per_queue: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let bucket = format!("{family}_bucket");
        for s in samples.iter().filter(|s| s.name == bucket) {
            let le = match s.labels["le"].as_str() {
                "+Inf" => f64::INFINITY,
                v => v.parse().expect("le is a number"),
            };
            per_queue
                .entry(s.labels["queue"].clone())
                .or_default()
                .push((le, s.value));
        }
        assert_eq!(per_queue.len(), 2, "{family}: one histogram per queue");
        for (queue, buckets) in &per_queue {
            assert!(buckets.len() >= 2, "{family} q{queue}: {buckets:?}");
            assert!(
                buckets
                    .windows(2)
                    .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
                "{family} q{queue}: not cumulative in le order: {buckets:?}"
            );
            let (last_le, total) = *buckets.last().unwrap();
            assert!(last_le.is_infinite(), "{family} q{queue}: no +Inf bucket");
            let of = |name: &str| {
                samples
                    .iter()
                    .find(|s| s.name == name && s.labels["queue"] == *queue)
                    .unwrap_or_else(|| panic!("{name} q{queue} missing"))
                    .value
            };
            assert_eq!(of(&format!("{family}_count")), total, "{family} q{queue}");
            // A resumption that finds nothing to restart takes no time: a sum may be 0.
            let sum = of(&format!("{family}_sum"));
            assert!(
                sum >= 0.0 && sum.is_finite(),
                "{family} q{queue}: sum {sum}"
            );
        }
    }
    // The p99 gauge is gone: a quantile is the dashboard's to compute.
    assert!(!body.contains("p99"), "{body}");
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_the_daemon_exports() {
    let body = metrics_after_a_preemption("grafana");
    let (types, _) = parse(&body);
    let exported = exported(&types);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/grafana/xpreempt.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("valid JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut used = BTreeSet::new();
    for e in &exprs {
        for name in metric_names(e) {
            assert!(
                exported.contains(&name),
                "the dashboard queries `{name}` (in `{e}`), which the daemon does not export; \
                 it exports {exported:?}"
            );
            used.insert(name);
        }
    }
    // What the dashboard is for: each of these is on it.
    for needed in [
        "xpreempt_clients",
        "xpreempt_bad_frames_total",
        "xpreempt_queue_states",
        "xpreempt_preemptions_total",
        "xpreempt_queue_suspend_latency_seconds_bucket",
        "xpreempt_queue_resume_latency_seconds_bucket",
        "xpreempt_queue_gpu_busy_ratio",
        "xpreempt_queue_gpu_command_seconds",
        "xpreempt_queue_gpu_in_flight_seconds",
        "xpreempt_mechanism_stop_seconds",
        "xpreempt_mechanism_restart_seconds",
    ] {
        assert!(
            used.contains(needed),
            "the dashboard does not show {needed}"
        );
    }
    for h in ["suspend", "resume"] {
        let bucket = format!("xpreempt_queue_{h}_latency_seconds_bucket");
        assert!(
            exprs
                .iter()
                .any(|e| e.contains("histogram_quantile(") && e.contains(&bucket)),
            "no quantile of {bucket}"
        );
    }
}

/// Every `expr` (a PromQL query) anywhere in the dashboard, and the template queries.
fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The `xpreempt_…` identifiers of a query.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("xpreempt_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}
