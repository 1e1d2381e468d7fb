//! `xpreempt top`: the daemon's queues, live, in the terminal, with what each measured of its
//! GPU time (the columns `list` shows too).
//!
//! A thread asks the daemon for its queues and statistics every interval; the terminal thread
//! only sorts and draws. The split keeps `q` working when the daemon hangs mid-answer, since the
//! operator connection has no read timeout. Everything that turns a snapshot into text is a pure
//! function, so the layout is tested without a terminal.

use crate::ops::Conn;
use crate::output::Output;
use anyhow::{Context, Result};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};
use std::cmp::Reverse;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_ipc::msg::{DaemonStats, QueueRow};
use xpreempt_ipc::operator::Operator;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    conn: Conn,
    /// How often to ask the daemon, in milliseconds.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    interval_ms: u64,
}

/// What one round trip to the daemon returns; also the `--json` output.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Snapshot {
    pub queues: Vec<QueueRow>,
    pub stats: DaemonStats,
    /// Per device, what each mechanism measured to cost (a line per device under the totals).
    pub costs: Vec<xpreempt_ipc::costs::DeviceCosts>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Priority,
    State,
    Process,
    Preemptions,
    Busy,
}

impl SortKey {
    fn name(self) -> &'static str {
        match self {
            SortKey::Priority => "priority",
            SortKey::State => "state",
            SortKey::Process => "process",
            SortKey::Preemptions => "preemptions",
            SortKey::Busy => "busy",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Quit,
    Sort(SortKey),
    Nothing,
}

pub fn action(key: &KeyEvent) -> Action {
    // Some terminals report releases too; acting on them would apply every key twice.
    if key.kind != KeyEventKind::Press {
        return Action::Nothing;
    }
    // Raw mode turns Ctrl-C into a key, so it has to be handled here, before `c` sorts.
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return match key.code {
            KeyCode::Char('c') => Action::Quit,
            _ => Action::Nothing,
        };
    }
    match key.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('p') => Action::Sort(SortKey::Priority),
        KeyCode::Char('s') => Action::Sort(SortKey::State),
        KeyCode::Char('c') => Action::Sort(SortKey::Process),
        KeyCode::Char('r') => Action::Sort(SortKey::Preemptions),
        KeyCode::Char('u') => Action::Sort(SortKey::Busy),
        _ => Action::Nothing,
    }
}

/// Suspended first: a queue held back is what an operator opens `top` to find.
fn state_rank(s: QueueState) -> u8 {
    match s {
        QueueState::Suspended => 0,
        QueueState::Running => 1,
        QueueState::Ready => 2,
        QueueState::Idle => 3,
    }
}

/// Every key ends on (device, queue) so that rows that tie do not swap between refreshes.
pub fn sort_rows(rows: &mut [QueueRow], key: SortKey) {
    let id = |r: &QueueRow| (r.device, r.queue);
    match key {
        SortKey::Priority => rows.sort_by_key(|r| {
            (
                Reverse(r.effective_priority),
                Reverse(r.logical_priority),
                id(r),
            )
        }),
        SortKey::State => {
            rows.sort_by_key(|r| (state_rank(r.state), Reverse(r.effective_priority), id(r)))
        }
        SortKey::Process => rows.sort_by(|a, b| {
            (&a.process_name, a.process, id(a)).cmp(&(&b.process_name, b.process, id(b)))
        }),
        SortKey::Preemptions => rows.sort_by_key(|r| (Reverse(r.preemptions), id(r))),
        // The busiest first: which queue holds the device.
        SortKey::Busy => rows.sort_by(|a, b| {
            b.gpu
                .busy_fraction
                .total_cmp(&a.gpu.busy_fraction)
                .then(id(a).cmp(&id(b)))
        }),
    }
}

pub fn title_line(sort: SortKey, interval_ms: u64) -> String {
    format!(
        "xpreempt top   sort: {}   every {interval_ms} ms   keys: p priority  s state  c process  r preemptions  u busy  q quit",
        sort.name()
    )
}

pub fn totals_line(stats: &DaemonStats) -> String {
    let sum = |f: fn(&xpreempt_ipc::msg::DeviceStats) -> u64| -> u64 {
        stats.devices.iter().map(f).sum()
    };
    format!(
        "clients {}  queues {}  preemptions {}  resumes {}  inversions {}  bad frames {}  watchdog fires {}",
        stats.clients,
        sum(|d| u64::from(d.queues)),
        sum(|d| d.scheduler.preemptions),
        sum(|d| d.scheduler.resumes),
        sum(|d| d.scheduler.inversions),
        stats.bad_frames,
        stats.watchdog_fires
    )
}

const HEADER: [&str; 13] = [
    "queue",
    "pid",
    "process",
    "dev",
    "prio",
    "eff",
    "state",
    "flight",
    "pending",
    "preempt",
    "drained",
    "resumes",
    "susp p99 µs",
];

fn columns(c: [&str; 13]) -> String {
    format!(
        "{:>5} {:>7} {:<16} {:>3} {:>5} {:>5} {:<9} {:>6} {:>7} {:>7} {:>7} {:>7} {:>11}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12]
    )
}

pub fn header_line() -> String {
    format!("{} {}", columns(HEADER), crate::ops::gpu_header())
}

pub fn row_line(r: &QueueRow) -> String {
    let name: String = xpreempt_ipc::names::clean(&r.process_name)
        .chars()
        .take(16)
        .collect();
    // A queue never suspended has no latency to show; 0.0 would read as "instant".
    let p99 = if r.suspend_p99_ns == 0 {
        "-".to_string()
    } else {
        format!("{:.1}", r.suspend_p99_ns as f64 / 1e3)
    };
    let counters = columns([
        &r.queue.to_string(),
        &r.process.to_string(),
        &name,
        &r.device.to_string(),
        &r.logical_priority.to_string(),
        &r.effective_priority.to_string(),
        r.state.name(),
        &r.in_flight.to_string(),
        &r.pending.to_string(),
        &r.preemptions.to_string(),
        &r.drains.to_string(),
        &r.resumes.to_string(),
        &p99,
    ]);
    format!("{counters} {}", crate::ops::gpu_cells(r))
}

/// What the screen shows: the last snapshot, or why there is none.
pub struct View {
    pub sort: SortKey,
    pub interval_ms: u64,
    pub snapshot: Option<Snapshot>,
    /// Set while the daemon cannot be reached; the snapshot is dropped then, so that stale rows
    /// are never mistaken for live ones.
    pub down: Option<String>,
}

impl View {
    pub fn new(interval_ms: u64) -> Self {
        Self {
            sort: SortKey::Priority,
            interval_ms,
            snapshot: None,
            down: None,
        }
    }

    pub fn update(&mut self, update: Result<Snapshot, String>) {
        match update {
            Ok(mut s) => {
                sort_rows(&mut s.queues, self.sort);
                self.snapshot = Some(s);
                self.down = None;
            }
            Err(e) => {
                self.snapshot = None;
                self.down = Some(e);
            }
        }
    }

    pub fn set_sort(&mut self, key: SortKey) {
        self.sort = key;
        if let Some(s) = &mut self.snapshot {
            sort_rows(&mut s.queues, key);
        }
    }

    pub fn lines(&self) -> Vec<Line<'static>> {
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let mut out = vec![Line::styled(title_line(self.sort, self.interval_ms), bold)];
        if let Some(e) = &self.down {
            let red = Style::default().fg(Color::Red).add_modifier(Modifier::BOLD);
            out.push(Line::styled(
                format!("daemon unreachable, retrying every {} ms", self.interval_ms),
                red,
            ));
            out.push(Line::raw(e.clone()));
            return out;
        }
        let Some(s) = &self.snapshot else {
            out.push(Line::raw("connecting to the daemon..."));
            return out;
        };
        out.push(Line::raw(totals_line(&s.stats)));
        out.extend(crate::costs::lines(&s.costs).into_iter().map(Line::raw));
        out.push(Line::raw(""));
        out.push(Line::styled(
            header_line(),
            Style::default().add_modifier(Modifier::REVERSED),
        ));
        for r in &s.queues {
            let style = match r.state {
                QueueState::Suspended => Style::default().fg(Color::Yellow),
                QueueState::Running => Style::default().fg(Color::Green),
                QueueState::Ready | QueueState::Idle => Style::default(),
            };
            out.push(Line::styled(row_line(r), style));
        }
        if s.queues.is_empty() {
            out.push(Line::raw("(no queues registered)"));
        }
        out
    }

    /// Table rows are clipped rather than wrapped, so that columns stay aligned in a narrow
    /// terminal; the error, the one long line worth reading in full, wraps.
    pub fn paragraph(&self) -> Paragraph<'static> {
        let p = Paragraph::new(self.lines());
        if self.down.is_some() {
            p.wrap(Wrap { trim: false })
        } else {
            p
        }
    }
}

fn fetch(conn: &Conn, op: &mut Option<Operator>) -> Result<Snapshot> {
    let o = match op {
        Some(o) => o,
        None => op.insert(conn.connect()?),
    };
    let snap = (|| -> Result<Snapshot> {
        Ok(Snapshot {
            queues: o.list()?,
            stats: o.stats()?,
            costs: o.costs()?,
        })
    })();
    if snap.is_err() {
        // The stream may be half-read or closed: start the next round on a fresh connection.
        *op = None;
    }
    snap
}

pub fn run(out: &Output, args: Args) -> Result<()> {
    if out.json {
        let snap = fetch(&args.conn, &mut None)?;
        return crate::output::print(&format!("{}\n", serde_json::to_string(&snap)?));
    }
    let interval = Duration::from_millis(args.interval_ms);
    let (tx, rx) = mpsc::channel();
    let conn = args.conn;
    // Detached on purpose: a fetch blocked on a hung daemon must not keep `q` from exiting.
    std::thread::spawn(move || {
        let mut op = None;
        loop {
            let started = Instant::now();
            let update = fetch(&conn, &mut op).map_err(|e| format!("{e:#}"));
            if tx.send(update).is_err() {
                return;
            }
            std::thread::sleep(interval.saturating_sub(started.elapsed()));
        }
    });
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            // Raw mode may already be on when entering the alternate screen is what failed.
            let _ = ratatui::try_restore();
            return Err(e).context("`xpreempt top` needs a terminal (`--json` prints a snapshot)");
        }
    };
    let result = ui(&mut terminal, &rx, args.interval_ms);
    drop(terminal);
    ratatui::try_restore().context("restoring the terminal")?;
    result
}

fn ui(
    terminal: &mut ratatui::DefaultTerminal,
    rx: &mpsc::Receiver<Result<Snapshot, String>>,
    interval_ms: u64,
) -> Result<()> {
    let mut view = View::new(interval_ms);
    let mut dirty = true;
    loop {
        if dirty {
            terminal.draw(|f| f.render_widget(view.paragraph(), f.area()))?;
            dirty = false;
        }
        // Short enough that a snapshot shows within 50 ms of its arrival.
        if event::poll(Duration::from_millis(50))? {
            match event::read()? {
                Event::Key(k) => match action(&k) {
                    Action::Quit => return Ok(()),
                    Action::Sort(key) => {
                        view.set_sort(key);
                        dirty = true;
                    }
                    Action::Nothing => {}
                },
                Event::Resize(..) => dirty = true,
                _ => {}
            }
        }
        while let Ok(update) = rx.try_recv() {
            view.update(update);
            dirty = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use xpreempt_core::{Level, QueueId};
    use xpreempt_ipc::msg::DeviceStats;

    fn row(queue: u32, pid: u32, name: &str, prio: i32, state: QueueState, pre: u64) -> QueueRow {
        QueueRow {
            queue: QueueId(queue),
            process: pid,
            process_name: name.into(),
            device: 0,
            level: Level::Lv2,
            logical_priority: prio,
            effective_priority: prio,
            state,
            in_flight: 2,
            pending: 3,
            preemptions: pre,
            drains: pre / 2,
            resumes: pre,
            suspend_p99_ns: pre * 12_345,
            gpu: Default::default(),
            in_flight_gpu_ns: None,
        }
    }

    fn rows() -> Vec<QueueRow> {
        vec![
            row(1, 300, "train", 1, QueueState::Suspended, 7),
            row(2, 100, "serve", 10, QueueState::Running, 0),
            row(3, 200, "batch", 5, QueueState::Idle, 2),
            row(4, 100, "serve", 10, QueueState::Ready, 0),
        ]
    }

    fn order(rows: &[QueueRow]) -> Vec<u32> {
        rows.iter().map(|r| r.queue.0).collect()
    }

    #[test]
    fn each_key_sorts_its_column_and_ties_keep_queue_order() {
        let mut r = rows();
        sort_rows(&mut r, SortKey::Priority);
        assert_eq!(order(&r), [2, 4, 3, 1]);
        sort_rows(&mut r, SortKey::State);
        assert_eq!(order(&r), [1, 2, 4, 3]);
        sort_rows(&mut r, SortKey::Process);
        assert_eq!(order(&r), [3, 2, 4, 1]);
        sort_rows(&mut r, SortKey::Preemptions);
        assert_eq!(order(&r), [1, 3, 2, 4]);
        for (q, u) in [(1, 0.9), (2, 0.1), (3, 0.5), (4, 0.5)] {
            r.iter_mut()
                .find(|x| x.queue.0 == q)
                .unwrap()
                .gpu
                .busy_fraction = u;
        }
        sort_rows(&mut r, SortKey::Busy);
        assert_eq!(order(&r), [1, 3, 4, 2]);
    }

    #[test]
    fn a_row_shows_pid_name_both_priorities_state_counters_and_p99_in_microseconds() {
        let mut r = row(
            7,
            4242,
            "a-very-long-process-name",
            3,
            QueueState::Suspended,
            4,
        );
        r.effective_priority = 9;
        r.gpu.per_command_ns = Some(113_000);
        r.gpu.busy_fraction = 0.42;
        r.gpu.burst_ns = Some(30_500_000);
        r.in_flight_gpu_ns = Some(226_000);
        let line = row_line(&r);
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "q7",
                "4242",
                "a-very-long-proc",
                "0",
                "3",
                "9",
                "suspended",
                "2",
                "3",
                "4",
                "2",
                "4",
                "49.4",
                "113µs",
                "42%",
                "30.5ms",
                "-",
                "226µs"
            ]
        );
        // Columns line up with the header whatever the values.
        assert_eq!(line.chars().count(), header_line().chars().count());
        let idle = row_line(&row(1, 1, "x", 0, QueueState::Idle, 0));
        assert_eq!(idle.split_whitespace().nth(12), Some("-"), "{idle}");
    }

    #[test]
    fn totals_add_up_every_device() {
        let dev = |device, queues, p, r, i| {
            let mut d = DeviceStats {
                device,
                queues,
                ..Default::default()
            };
            d.scheduler.preemptions = p;
            d.scheduler.resumes = r;
            d.scheduler.inversions = i;
            d
        };
        let s = DaemonStats {
            clients: 3,
            devices: vec![dev(0, 2, 5, 4, 1), dev(1, 1, 1, 1, 0)],
            bad_frames: 6,
            watchdog_fires: 7,
            ..Default::default()
        };
        assert_eq!(
            totals_line(&s),
            "clients 3  queues 3  preemptions 6  resumes 5  inversions 1  bad frames 6  watchdog fires 7"
        );
    }

    #[test]
    fn keys_map_to_actions_and_ctrl_c_quits_rather_than_sorting() {
        let k = |c, m| action(&KeyEvent::new(KeyCode::Char(c), m));
        assert_eq!(k('q', KeyModifiers::NONE), Action::Quit);
        assert_eq!(k('c', KeyModifiers::CONTROL), Action::Quit);
        assert_eq!(k('c', KeyModifiers::NONE), Action::Sort(SortKey::Process));
        assert_eq!(k('p', KeyModifiers::NONE), Action::Sort(SortKey::Priority));
        assert_eq!(k('s', KeyModifiers::NONE), Action::Sort(SortKey::State));
        assert_eq!(
            k('r', KeyModifiers::NONE),
            Action::Sort(SortKey::Preemptions)
        );
        assert_eq!(k('u', KeyModifiers::NONE), Action::Sort(SortKey::Busy));
        assert_eq!(k('x', KeyModifiers::NONE), Action::Nothing);
        let mut release = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
        release.kind = KeyEventKind::Release;
        assert_eq!(action(&release), Action::Nothing);
    }

    fn text(view: &View) -> Vec<String> {
        view.lines().iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn the_view_says_the_sort_resorts_at_once_and_drops_rows_while_the_daemon_is_away() {
        let mut v = View::new(250);
        assert!(text(&v)[1].contains("connecting"));
        v.update(Ok(Snapshot {
            queues: rows(),
            ..Snapshot::default()
        }));
        let t = text(&v);
        assert!(t[0].contains("sort: priority"), "{t:?}");
        assert!(t[1].starts_with("clients 0"));
        assert_eq!(t[3], header_line());
        assert!(t[4].contains("serve") && t[7].contains("train"), "{t:?}");
        v.set_sort(SortKey::State);
        let t = text(&v);
        assert!(t[0].contains("sort: state"));
        assert!(t[4].contains("suspended"), "{t:?}");
        v.update(Err("no xpreempt daemon at /x.sock".into()));
        let t = text(&v);
        assert_eq!(t.len(), 3);
        assert!(t[1].contains("daemon unreachable, retrying every 250 ms"));
        assert_eq!(t[2], "no xpreempt daemon at /x.sock");
        v.update(Ok(Snapshot::default()));
        assert_eq!(text(&v).last().unwrap(), "(no queues registered)");
    }

    fn draw(v: &View, width: u16, height: u16) -> Vec<String> {
        let mut t = ratatui::Terminal::new(TestBackend::new(width, height)).unwrap();
        t.draw(|f| f.render_widget(v.paragraph(), f.area()))
            .unwrap();
        let buf = t.backend().buffer();
        (0..height)
            .map(|y| (0..width).map(|x| buf[(x, y)].symbol()).collect())
            .collect()
    }

    #[test]
    fn a_small_terminal_clips_the_table_but_wraps_the_error() {
        let mut v = View::new(250);
        v.update(Ok(Snapshot {
            queues: rows(),
            ..Snapshot::default()
        }));
        let screen = draw(&v, 40, 5);
        assert_eq!(screen[0], "xpreempt top   sort: priority   every 25");
        assert!(screen[4].starts_with("   q2     100 serve "), "{screen:?}");
        v.update(Err(format!(
            "no xpreempt daemon at /{}.sock",
            "x".repeat(30)
        )));
        let screen = draw(&v, 40, 10);
        let tail = format!("/{}.sock", "x".repeat(30));
        assert!(screen.iter().any(|l| l.trim_end() == tail), "{screen:?}");
    }
}
