//! Prometheus text exposition (format 0.0.4) on a TCP listener: per device and per queue,
//! queues, preemptions, resumes, inversions, and suspend latency.

use crate::server::Shared;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;
use xpreempt_ipc::msg::{DeviceStats, QueueRow};

/// A metric family: name, help, and how to read it from a row.
type Metric<T, V> = (&'static str, &'static str, fn(&T) -> V);

pub(crate) fn serve(shared: &Shared, listener: TcpListener) {
    for conn in listener.incoming() {
        if shared.is_stopping() {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        // A scraper that does not read its answer cannot hold the metrics thread either.
        let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
        // The request itself does not matter: every path answers with the metrics.
        let mut buf = [0u8; 1024];
        let _ = conn.read(&mut buf);
        let body = render(shared);
        let _ = write!(
            conn,
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    }
}

pub(crate) fn render(shared: &Shared) -> String {
    let (stats, rows) = {
        let mut st = shared.lock();
        (st.stats(), st.list())
    };
    let mut out = String::new();
    let daemon_metrics = [
        (
            "xpreempt_clients",
            "gauge",
            "Connected processes.",
            u64::from(stats.clients),
        ),
        (
            "xpreempt_bad_frames_total",
            "counter",
            "Frames refused (malformed, truncated, oversized, other version).",
            stats.bad_frames,
        ),
        (
            "xpreempt_watchdog_fires_total",
            "counter",
            "Silent clients taken out of contention.",
            stats.watchdog_fires,
        ),
    ];
    for (name, kind, help, value) in daemon_metrics {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP xpreempt_refusals_total Requests and connections refused by the daemon's limits.\n# TYPE xpreempt_refusals_total counter"
    );
    for (reason, n) in &stats.refusals {
        let _ = writeln!(out, "xpreempt_refusals_total{{reason=\"{reason}\"}} {n}");
    }
    let device_metrics: [Metric<DeviceStats, u64>; 5] = [
        ("xpreempt_queues", "Queues registered.", |d| {
            u64::from(d.queues)
        }),
        (
            "xpreempt_preemptions_total",
            "Suspensions the scheduler ordered.",
            |d| d.scheduler.preemptions,
        ),
        (
            "xpreempt_resumes_total",
            "Resumptions the scheduler ordered.",
            |d| d.scheduler.resumes,
        ),
        (
            "xpreempt_inversions_total",
            "Decisions that found a lower priority running while a higher one waited.",
            |d| d.scheduler.inversions,
        ),
        ("xpreempt_checks_total", "Decisions taken.", |d| {
            d.scheduler.checks
        }),
    ];
    for (name, help, get) in device_metrics {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for d in &stats.devices {
            let _ = writeln!(
                out,
                "{name}{{device=\"{}\",policy=\"{}\"}} {}",
                d.device,
                d.policy,
                get(d)
            );
        }
    }
    let queue_metrics: [Metric<QueueRow, f64>; 5] = [
        (
            "xpreempt_queue_priority",
            "Effective priority (logical plus aging).",
            |r| f64::from(r.effective_priority),
        ),
        (
            "xpreempt_queue_preemptions_total",
            "Times the queue was suspended.",
            |r| r.preemptions as f64,
        ),
        (
            "xpreempt_queue_resumes_total",
            "Times the queue was resumed.",
            |r| r.resumes as f64,
        ),
        (
            "xpreempt_queue_pending",
            "Commands waiting in the queue's buffer.",
            |r| f64::from(r.pending),
        ),
        (
            "xpreempt_queue_suspend_latency_p99_seconds",
            "p99 time from suspend to the hardware being free of the queue.",
            |r| r.suspend_p99_ns as f64 / 1e9,
        ),
    ];
    for (name, help, get) in queue_metrics {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for r in &rows {
            let _ = writeln!(
                out,
                "{name}{{device=\"{}\",queue=\"{}\",pid=\"{}\",process=\"{}\"}} {}",
                r.device,
                r.queue.0,
                r.process,
                r.process_name.replace(['"', '\\', '\n'], "_"),
                get(r)
            );
        }
    }
    out
}
