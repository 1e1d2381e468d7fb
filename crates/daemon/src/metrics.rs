//! Prometheus text exposition (format 0.0.4) on a TCP listener: per device and per queue,
//! queues and their states, preemptions, resumes, inversions, and suspend and resume latency as
//! histograms (cumulative `_bucket`s with `le` in seconds, `_sum`, `_count`), which a dashboard
//! can aggregate across queues and time (`histogram_quantile`), each queue's GPU time per
//! command, busy fraction, bursts, gaps and GPU time in flight as its agent measured them, and
//! per device and level the measured cost of stopping and restarting ([`crate::costs`]).

use crate::shared::Shared;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_ipc::costs::{CostSummary, DeviceCosts, MechanismCost};
use xpreempt_ipc::msg::{DeviceStats, QueueRow};
use xpreempt_ipc::shm::{LATENCY_BOUNDS_NS, LatencyCounts};

/// A metric family: name, help, and how to read it from a row.
type Metric<T, V> = (&'static str, &'static str, fn(&T) -> V);
/// Which of a queue's (suspend, resume) latencies a histogram family shows.
type Pick = fn(&(LatencyCounts, LatencyCounts)) -> &LatencyCounts;

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
    let (stats, rows, latencies, costs) = {
        let mut st = shared.lock();
        (st.stats(), st.list(), st.latencies(), st.mechanism_costs())
    };
    let mut out = String::new();
    let daemon_metrics = [
        (
            "xpreempt_clients",
            "gauge",
            "Connected agents: processes whose queues the daemon schedules (operators not counted).",
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
    let states = [
        QueueState::Idle,
        QueueState::Ready,
        QueueState::Running,
        QueueState::Suspended,
    ];
    let _ = writeln!(
        out,
        "# HELP xpreempt_queue_states Queues in each state (idle, ready, running, suspended).\n\
         # TYPE xpreempt_queue_states gauge"
    );
    for d in &stats.devices {
        for state in states {
            let n = rows
                .iter()
                .filter(|r| r.device == d.device && r.state == state)
                .count();
            let _ = writeln!(
                out,
                "xpreempt_queue_states{{device=\"{}\",state=\"{}\"}} {n}",
                d.device,
                format!("{state:?}").to_lowercase()
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
            "xpreempt_queue_drains_total",
            "Suspensions that drained as at level 1 although the queue's level could stop the hardware.",
            |r| r.drains as f64,
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
    ];
    for (name, help, get) in queue_metrics {
        family(&mut out, name, help, &rows, |r| Some(get(r)));
    }
    // Measured by each queue from its own completions; a queue that has measured nothing yet
    // has no sample rather than a zero.
    let gpu_metrics: [Metric<QueueRow, Option<f64>>; 6] = [
        (
            "xpreempt_queue_gpu_command_seconds",
            "GPU time of one command, from the queue's completions (running average).",
            |r| seconds(r.gpu.per_command_ns),
        ),
        (
            "xpreempt_queue_gpu_busy_ratio",
            "Fraction of about the last second with the queue's work on the device (u).",
            |r| Some(r.gpu.busy_fraction),
        ),
        (
            "xpreempt_queue_gpu_burst_seconds",
            "How long the queue's bursts last, Ready until Idle (running average).",
            |r| seconds(r.gpu.burst_ns),
        ),
        (
            "xpreempt_queue_gpu_gap_seconds",
            "The CPU gap between the queue's bursts, Idle until its next submission (running average).",
            |r| seconds(r.gpu.gap_ns),
        ),
        (
            "xpreempt_queue_gpu_in_flight_seconds",
            "GPU time launched and not finished: commands in flight times GPU time per command.",
            |r| seconds(r.in_flight_gpu_ns),
        ),
        (
            "xpreempt_queue_gpu_measured_commands_total",
            "Commands whose GPU time the queue measured.",
            |r| Some(r.gpu.measured_commands as f64),
        ),
    ];
    for (name, help, get) in gpu_metrics {
        family(&mut out, name, help, &rows, get);
    }
    let histograms: [(&str, &str, Pick); 2] = [
        (
            "xpreempt_queue_suspend_latency_seconds",
            "Time from suspend to the hardware being free of the queue.",
            |l| &l.0,
        ),
        (
            "xpreempt_queue_resume_latency_seconds",
            "Time from resume to the hardware running the queue again.",
            |l| &l.1,
        ),
    ];
    for (name, help, get) in histograms {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for r in &rows {
            let Some(h) = latencies.get(&r.queue).map(get) else {
                continue;
            };
            let labels = labels(r);
            // The powers of two are enough for a dashboard and keep the series few.
            for (&bound, &below) in LATENCY_BOUNDS_NS.iter().zip(&h.below) {
                if !bound.is_power_of_two() {
                    continue;
                }
                let le = bound as f64 / 1e9;
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {below}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_ns as f64 / 1e9);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
        }
    }
    mechanism_costs(&mut out, &costs);
    out
}

/// Per device and level, the measured cost of stopping and restarting (what `list` shows):
/// gauges, since they describe the recent past and fall as well as rise. A mechanism with no
/// measurement has no sample.
fn mechanism_costs(out: &mut String, costs: &[DeviceCosts]) {
    type Side = fn(&MechanismCost) -> Option<CostSummary>;
    let sides: [(&str, &str, Side); 2] = [
        (
            "stop",
            "From suspend until the device is free of the queue's work (Lv1 drain, Lv2 block-boundary stop, Lv3 switch)",
            |m| m.stop,
        ),
        (
            "restart",
            "From resume until the device runs the queue again",
            |m| m.restart,
        ),
    ];
    for (side, help, get) in sides {
        let name = format!("xpreempt_mechanism_{side}_seconds");
        let _ = writeln!(
            out,
            "# HELP {name} {help}: quantiles over the device's queues at the level, recent past.\n# TYPE {name} gauge"
        );
        let samples = format!("xpreempt_mechanism_{side}_samples");
        let mut counts =
            format!("# HELP {samples} Measurements behind {name}.\n# TYPE {samples} gauge\n");
        for d in costs {
            for m in &d.mechanisms {
                let (Some(level), Some(s)) = (m.level, get(m)) else {
                    continue;
                };
                let labels = format!(
                    "device=\"{}\",level=\"{level}\",mechanism=\"{}\"",
                    d.device,
                    m.mechanism.label()
                );
                for (q, ns) in [("0.5", s.p50_ns), ("0.99", s.p99_ns)] {
                    let _ = writeln!(
                        out,
                        "{name}{{{labels},quantile=\"{q}\"}} {}",
                        ns as f64 / 1e9
                    );
                }
                let _ = writeln!(counts, "{samples}{{{labels}}} {}", s.samples);
            }
        }
        out.push_str(&counts);
    }
}

fn seconds(ns: Option<u64>) -> Option<f64> {
    ns.map(|ns| ns as f64 / 1e9)
}

/// A family of per-queue gauges (or counters, by a `_total` name); rows without a value have
/// no sample.
fn family(
    out: &mut String,
    name: &str,
    help: &str,
    rows: &[QueueRow],
    get: impl Fn(&QueueRow) -> Option<f64>,
) {
    let kind = if name.ends_with("_total") {
        "counter"
    } else {
        "gauge"
    };
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for r in rows {
        if let Some(v) = get(r) {
            let _ = writeln!(out, "{name}{{{}}} {v}", labels(r));
        }
    }
}

/// A queue's labels, shared by its gauges, counters and histograms.
fn labels(r: &QueueRow) -> String {
    format!(
        "device=\"{}\",queue=\"{}\",pid=\"{}\",process=\"{}\"",
        r.device,
        r.queue.0,
        r.process,
        r.process_name.replace(['"', '\\', '\n'], "_"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_ipc::costs::Mechanism;
    use xpreempt_types::Level;

    #[test]
    fn mechanism_costs_are_gauges_by_device_and_level_and_the_unmeasured_have_no_sample() {
        let stop = CostSummary {
            samples: 7,
            p50_ns: 35_000,
            p99_ns: 2_500_000,
            mean_ns: 100_000,
        };
        let costs = [DeviceCosts {
            device: 1,
            mechanisms: vec![
                MechanismCost {
                    mechanism: Mechanism::Switch,
                    level: Some(Level::Lv3),
                    stop: Some(stop),
                    restart: None,
                    over_ns: Some(1),
                    note: None,
                },
                MechanismCost::not_measured(Mechanism::SpatialConfinement),
            ],
        }];
        let mut out = String::new();
        mechanism_costs(&mut out, &costs);
        let labels = "device=\"1\",level=\"lv3\",mechanism=\"switch\"";
        for line in [
            "# TYPE xpreempt_mechanism_stop_seconds gauge".to_string(),
            format!("xpreempt_mechanism_stop_seconds{{{labels},quantile=\"0.5\"}} 0.000035"),
            format!("xpreempt_mechanism_stop_seconds{{{labels},quantile=\"0.99\"}} 0.0025"),
            format!("xpreempt_mechanism_stop_samples{{{labels}}} 7"),
            "# TYPE xpreempt_mechanism_restart_seconds gauge".to_string(),
        ] {
            assert!(out.lines().any(|l| l == line), "no `{line}` in:\n{out}");
        }
        assert!(
            !out.contains("xpreempt_mechanism_restart_seconds{"),
            "{out}"
        );
        assert!(!out.contains("spatial"), "{out}");
    }
}
