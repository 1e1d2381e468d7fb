//! The timeline overview: one panel per mode on a shared time axis, a row per task with the
//! stretches its kernels ran (a preempted kernel leaves a gap), and markers for request
//! arrivals and the preempt/resume decisions. Built from the runs' traces.

use super::axis::{Axis, fmt_num};
use super::{esc, header};
use crate::runner::ModeRun;
use crate::scenario::Scenario;
use std::collections::BTreeSet;
use std::fmt::Write;
use xpreempt_core::{Nanos, Priority};

/// Rows drawn per mode; a scenario of a thousand queues would otherwise be a metre tall.
pub const MAX_ROWS: usize = 40;
const W: f64 = 1000.0;
const LEFT: f64 = 120.0;
const RIGHT: f64 = 980.0;
const ROW: f64 = 16.0;
const BAR: f64 = 10.0;
/// Height of the line under a panel's axis that counts the tasks not drawn.
const NOTE: f64 = 14.0;
/// Lower tiers' colours, after the top tier's red.
const TIER_COLOURS: [&str; 6] = [
    "#d62728", "#1f77b4", "#9467bd", "#8c564b", "#17becf", "#bcbd22",
];

/// The timeline of every run that kept a trace, as one SVG document.
pub fn timeline(scenario: &Scenario, runs: &[ModeRun]) -> String {
    let end = runs.iter().map(|r| r.end).max().unwrap_or(0);
    let x = Axis::fit(0.0, end as f64 / 1e6, LEFT, RIGHT);
    let rows = scenario.tasks.len().min(MAX_ROWS);
    // A panel that leaves tasks out says so on a line of its own, under the axis's labels.
    let note = if scenario.tasks.len() > rows {
        NOTE
    } else {
        0.0
    };
    let panel = 30.0 + rows as f64 * ROW + 24.0 + note;
    let height = 70.0 + panel * runs.len() as f64 + 20.0;
    let title = format!(
        "{} (seed {}): which queue ran when",
        scenario.name, scenario.seed
    );
    let mut s = String::new();
    header(&mut s, W, height, &title);
    let mut tiers: Vec<Priority> = scenario.tasks.iter().map(|t| t.priority).collect();
    tiers.sort_unstable_by(|a, b| b.cmp(a));
    tiers.dedup();
    let colour = |p: Priority| {
        let rank = tiers.iter().position(|&t| t == p).unwrap_or(0);
        TIER_COLOURS[rank % TIER_COLOURS.len()]
    };
    legend(&mut s, &tiers, &colour);
    for (i, run) in runs.iter().enumerate() {
        let top = 70.0 + i as f64 * panel;
        panel_of(&mut s, scenario, run, &x, top, rows, &colour);
    }
    s.push_str("</svg>\n");
    s
}

fn legend(s: &mut String, tiers: &[Priority], colour: &dyn Fn(Priority) -> &'static str) {
    let mut at = LEFT;
    let y = 44.0;
    for &p in tiers.iter().take(TIER_COLOURS.len()) {
        let _ = write!(
            s,
            r#"<rect x="{at}" y="{}" width="14" height="{BAR}" fill="{}"/><text x="{}" y="{}">priority {p} running</text>"#,
            y - BAR + 1.0,
            colour(p),
            at + 18.0,
            y
        );
        at += 150.0;
    }
    let _ = writeln!(
        s,
        r##"{}<text x="{}" y="{y}">preempt</text>{}<text x="{}" y="{y}">resume</text><line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#444444"/><text x="{}" y="{y}">request arrives</text>"##,
        down(at + 4.0, y - BAR),
        at + 12.0,
        up(at + 74.0, y + 1.0),
        at + 82.0,
        at + 140.0,
        y - BAR,
        at + 140.0,
        y + 1.0,
        at + 146.0
    );
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A preempt marker: a triangle pointing down onto the row from `y`.
fn down(x: f64, y: f64) -> String {
    format!(
        r##"<polygon class="preempt" points="{:.1},{:.1} {:.1},{:.1} {x:.1},{:.1}" fill="#000000"/>"##,
        x - 4.0,
        y - 3.0,
        x + 4.0,
        y - 3.0,
        y + 4.0
    )
}

/// A resume marker: a triangle pointing up into the row from `y`.
fn up(x: f64, y: f64) -> String {
    format!(
        r##"<polygon class="resume" points="{:.1},{:.1} {:.1},{:.1} {x:.1},{:.1}" fill="#2ca02c"/>"##,
        x - 4.0,
        y + 3.0,
        x + 4.0,
        y + 3.0,
        y - 4.0
    )
}

fn panel_of(
    s: &mut String,
    scenario: &Scenario,
    run: &ModeRun,
    x: &Axis,
    top: f64,
    rows: usize,
    colour: &dyn Fn(Priority) -> &'static str,
) {
    let _ = writeln!(
        s,
        r##"<text x="10" y="{}" font-weight="bold" font-size="13">{}</text><text x="{LEFT}" y="{}" fill="#555555">{} preemption{}, {} resume{}, makespan {} ms</text>"##,
        top + 14.0,
        run.mode,
        top + 14.0,
        run.preemptions,
        plural(run.preemptions),
        run.resumes,
        plural(run.resumes),
        fmt_num(run.end.saturating_sub(run.first_arrival) as f64 / 1e6)
    );
    let row_top = |r: usize| top + 24.0 + r as f64 * ROW;
    let bottom = row_top(rows);
    let ticks = x.ticks();
    for (i, &(v, _)) in ticks.iter().enumerate() {
        let px = x.px(v);
        // The last label carries the unit and ends at the axis, inside the picture.
        let (unit, anchor) = if i + 1 == ticks.len() {
            (" ms", "end")
        } else {
            ("", "middle")
        };
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{}" x2="{px:.1}" y2="{bottom}" stroke="#e5e5e5"/><text x="{px:.1}" y="{}" text-anchor="{anchor}" font-size="10">{}{unit}</text>"##,
            row_top(0),
            bottom + 12.0,
            fmt_num(v)
        );
    }
    for (r, t) in scenario.tasks.iter().take(rows).enumerate() {
        let name: String = t.name.chars().take(16).collect();
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"#,
            LEFT - 6.0,
            row_top(r) + BAR,
            esc(&name)
        );
    }
    if scenario.tasks.len() > rows {
        let _ = writeln!(
            s,
            r##"<text class="not-drawn" x="{LEFT}" y="{:.1}" font-size="10" fill="#555555">… and {} more tasks not drawn</text>"##,
            bottom + 12.0 + NOTE,
            scenario.tasks.len() - rows
        );
    }
    let Some(trace) = &run.trace else {
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="{}">no trace kept for this run</text>"#,
            row_top(0) + BAR
        );
        return;
    };
    let ms = |ns: Nanos| ns as f64 / 1e6;
    let mut spans: Vec<Vec<(Nanos, Nanos)>> = vec![Vec::new(); rows];
    for k in trace.kernel_spans() {
        if let Some(row) = spans.get_mut(k.queue as usize) {
            row.push((k.start, k.end));
        }
    }
    for (r, mut row) in spans.into_iter().enumerate() {
        row.sort_unstable();
        let fill = colour(scenario.tasks[r].priority);
        // Stretches closer than half a pixel are one rectangle: a kernel per pixel would make
        // files of megabytes and draw the same thing.
        let mut merged: Vec<(f64, f64)> = Vec::new();
        for (a, b) in row {
            let (a, b) = (x.px(ms(a)), x.px(ms(b)));
            match merged.last_mut() {
                Some(last) if a - last.1 < 0.5 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        for (a, b) in merged {
            let _ = write!(
                s,
                r#"<rect x="{a:.1}" y="{:.1}" width="{:.1}" height="{BAR}" fill="{fill}"/>"#,
                row_top(r),
                (b - a).max(0.5)
            );
        }
        s.push('\n');
    }
    // One marker of a kind per row and pixel: a burst of a hundred arrivals is one tick.
    let mut drawn: BTreeSet<(usize, &str, i64)> = BTreeSet::new();
    for (queue, name, at) in trace.markers() {
        let r = queue as usize;
        if r >= rows || !matches!(name, "arrival" | "preempt" | "resume") {
            continue;
        }
        let px = x.px(ms(at));
        if !drawn.insert((r, name, px.round() as i64)) {
            continue;
        }
        let y = row_top(r);
        let mark = match name {
            "arrival" => format!(
                r##"<line class="arrival" x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#444444"/>"##,
                y - 2.0,
                y + BAR + 2.0
            ),
            "preempt" => down(px, y),
            _ => up(px, y + BAR),
        };
        s.push_str(&mark);
    }
    s.push('\n');
}
