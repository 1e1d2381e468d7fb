//! The operator's commands against a running daemon: `list`, `stats`, `set-priority`, and
//! `daemon` (the daemon itself, as `xpreemptd` runs it).

use crate::output::Output;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use xpreempt_ipc::costs::DeviceCosts;
use xpreempt_ipc::msg::{QueueRow, Target};
use xpreempt_ipc::operator::Operator;

#[derive(clap::Args)]
pub struct Conn {
    /// The daemon's socket [default: $XPREEMPT_SOCKET, else $XDG_RUNTIME_DIR/xpreempt.sock where
    /// it exists, else /run/xpreempt/xpreempt.sock where that exists (a system daemon)].
    #[arg(long)]
    socket: Option<PathBuf>,
}

impl Conn {
    pub fn connect(&self) -> Result<Operator> {
        let path = self
            .socket
            .clone()
            .unwrap_or_else(xpreempt_ipc::default_socket);
        Ok(Operator::connect(&path)?)
    }
}

#[derive(clap::Args)]
pub struct SetPriority {
    /// A process id, or a queue as `q7`.
    target: String,
    /// The new logical priority (larger runs first).
    #[arg(allow_hyphen_values = true)]
    priority: i32,
    #[command(flatten)]
    conn: Conn,
}

/// `list --json` is `{"queues": [...], "costs": [...]}`: one object, as every subcommand's, so
/// that fields can join it without breaking a reader.
#[derive(serde::Serialize)]
struct Listing<'a> {
    queues: &'a [QueueRow],
    /// Per device, what each mechanism measured to cost.
    costs: &'a [DeviceCosts],
}

pub fn list(out: &Output, conn: &Conn) -> Result<()> {
    let mut op = conn.connect()?;
    let rows = op.list()?;
    let costs = op.costs()?;
    out.emit(
        &Listing {
            queues: &rows,
            costs: &costs,
        },
        || format!("{}\n{}", table(&rows), crate::costs::table(&costs)),
    )
}

pub fn stats(out: &Output, conn: &Conn) -> Result<()> {
    let s = conn.connect()?.stats()?;
    out.emit(&s, || {
        let mut t = format!(
            "protocol {}  policy {}  clients {}  bad frames {}  watchdog {}  fast-path wake-ups {}\n",
            s.protocol, s.policy, s.clients, s.bad_frames, s.watchdog_fires, s.fast_path_wakeups
        );
        t.push_str(&format!(
            "{:>6} {:<10} {:>6} {:>8} {:>11} {:>8} {:>10}\n",
            "device", "policy", "queues", "checks", "preemptions", "resumes", "inversions"
        ));
        for d in &s.devices {
            t.push_str(&format!(
                "{:>6} {:<10} {:>6} {:>8} {:>11} {:>8} {:>10}\n",
                d.device,
                d.policy,
                d.queues,
                d.scheduler.checks,
                d.scheduler.preemptions,
                d.scheduler.resumes,
                d.scheduler.inversions
            ));
        }
        t
    })
}

pub fn set_priority(out: &Output, args: &SetPriority) -> Result<()> {
    let target = parse_target(&args.target)?;
    let changed = args.conn.connect()?.set_priority(target, args.priority)?;
    #[derive(serde::Serialize)]
    struct Changed {
        changed: u32,
        priority: i32,
    }
    let c = Changed {
        changed,
        priority: args.priority,
    };
    out.emit(&c, || {
        format!("{changed} queue(s) now at priority {}\n", args.priority)
    })
}

fn parse_target(s: &str) -> Result<Target> {
    if let Some(q) = s.strip_prefix('q') {
        let n = q
            .parse()
            .with_context(|| format!("`{s}`: a queue is q followed by its number"))?;
        return Ok(Target::Queue(xpreempt_core::QueueId(n)));
    }
    match s.parse() {
        Ok(pid) => Ok(Target::Process(pid)),
        Err(_) => bail!("`{s}` is neither a process id nor a queue (q7)"),
    }
}

pub fn table(rows: &[QueueRow]) -> String {
    let mut t = format!(
        "{:>5} {:>7} {:<16} {:>3} {:>4} {:>5} {:>5} {:<9} {:>6} {:>7} {:>7} {:>7} {:>7} {:>11} {}\n",
        "queue",
        "pid",
        "process",
        "dev",
        "lvl",
        "prio",
        "eff",
        "state",
        "flight",
        "pending",
        "preempt",
        "drained",
        "resumes",
        "susp p99 µs",
        gpu_header()
    );
    for r in rows {
        t.push_str(&format!(
            "{:>5} {:>7} {:<16} {:>3} {:>4} {:>5} {:>5} {:<9} {:>6} {:>7} {:>7} {:>7} {:>7} {:>11.1} {}\n",
            r.queue.to_string(),
            r.process,
            // Escaped here too: a daemon of an older version passes names on as they came.
            xpreempt_ipc::names::clean(&r.process_name)
                .chars()
                .take(16)
                .collect::<String>(),
            r.device,
            r.level.to_string(),
            r.logical_priority,
            r.effective_priority,
            format!("{:?}", r.state).to_lowercase(),
            r.in_flight,
            r.pending,
            r.preemptions,
            r.drains,
            r.resumes,
            r.suspend_p99_ns as f64 / 1e3,
            gpu_cells(r)
        ));
    }
    if rows.is_empty() {
        t.push_str("(no queues registered)\n");
    }
    t
}

/// The GPU-time columns `list` and `top` share: GPU time per command, busy fraction, burst,
/// gap, and the GPU time in flight.
pub fn gpu_header() -> String {
    gpu_columns(["gpu/cmd", "busy", "burst", "gap", "gpu flight"])
}

pub fn gpu_cells(r: &QueueRow) -> String {
    use crate::units::{duration, percent};
    gpu_columns([
        &duration(r.gpu.per_command_ns),
        &percent(r.gpu.busy_fraction),
        &duration(r.gpu.burst_ns),
        &duration(r.gpu.gap_ns),
        &duration(r.in_flight_gpu_ns),
    ])
}

fn gpu_columns(c: [&str; 5]) -> String {
    format!(
        "{:>7} {:>4} {:>7} {:>7} {:>10}",
        c[0], c[1], c[2], c[3], c[4]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_core::sched::protocol::QueueState;
    use xpreempt_core::{Level, QueueId};

    /// A running level-1 queue at priority 0 with 16 commands in flight and nothing measured.
    fn quiet_row() -> QueueRow {
        QueueRow {
            queue: QueueId(0),
            process: 0,
            process_name: String::new(),
            device: 0,
            level: Level::Lv1,
            logical_priority: 0,
            effective_priority: 0,
            state: QueueState::Running,
            in_flight: 16,
            pending: 0,
            preemptions: 0,
            drains: 0,
            resumes: 0,
            suspend_p99_ns: 0,
            gpu: Default::default(),
            in_flight_gpu_ns: None,
        }
    }

    #[test]
    fn a_name_cannot_forge_rows_or_recolour_the_terminal() {
        let row = QueueRow {
            queue: QueueId(1),
            process: 42,
            process_name: "a\x1b[31m\n    9     666 fake".into(),
            level: Level::Lv2,
            logical_priority: 1,
            effective_priority: 1,
            state: QueueState::Idle,
            in_flight: 0,
            ..quiet_row()
        };
        let t = table(&[row]);
        assert_eq!(t.lines().count(), 2, "{t}");
        assert!(!t.contains('\x1b'), "{t:?}");
    }

    #[test]
    fn the_drained_suspensions_stand_under_their_header() {
        let row = QueueRow {
            preemptions: 9,
            drains: 4,
            resumes: 8,
            ..quiet_row()
        };
        let t = table(&[row]);
        let mut lines = t.lines().map(|l| l.split_whitespace().collect::<Vec<_>>());
        let (header, body) = (lines.next().unwrap(), lines.next().unwrap());
        // The process name is empty: the body has one word fewer before the counters.
        let at = |name: &str| header.iter().position(|h| *h == name).unwrap() - 1;
        assert_eq!(body[at("preempt")], "9", "{t}");
        assert_eq!(body[at("drained")], "4", "{t}");
        assert_eq!(body[at("resumes")], "8", "{t}");
    }

    #[test]
    fn the_gpu_columns_show_what_was_measured_in_readable_units() {
        let mut row = QueueRow {
            queue: QueueId(3),
            process: 7,
            process_name: "train".into(),
            ..quiet_row()
        };
        let cells = |r: &QueueRow| {
            let t = table(std::slice::from_ref(r));
            let body = t.lines().nth(1).unwrap().to_string();
            // Same width as the header: the columns line up.
            assert_eq!(
                body.chars().count(),
                t.lines().next().unwrap().chars().count(),
                "{t}"
            );
            body.split_whitespace()
                .rev()
                .take(5)
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            cells(&row),
            ["-", "-", "-", "0%", "-"],
            "nothing measured yet"
        );
        row.gpu = xpreempt_core::stats::GpuTimeSummary {
            per_command_ns: Some(4_800_000),
            busy_fraction: 0.914,
            burst_ns: Some(1_250_000_000),
            gap_ns: Some(23_000),
            measured_commands: 500,
        };
        row.in_flight_gpu_ns = QueueRow::in_flight_gpu(row.in_flight, &row.gpu);
        assert_eq!(cells(&row), ["76.8ms", "23.0µs", "1.25s", "91%", "4.80ms"]);
    }
}
