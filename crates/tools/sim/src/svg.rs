//! Hand-written SVG plots of a run: the latency CDF of the highest-priority tier, one line per
//! mode ([`cdf`]), and a timeline of which queue ran when ([`timeline`]). Written by hand: two
//! plots of lines and rectangles do not need a plotting crate and its dependencies, and the
//! output stays byte-for-byte deterministic.

use crate::report::SimReport;
use crate::runner::{Mode, ModeRun};
use crate::scenario::Scenario;
use std::fmt::Write;

mod axis;
pub mod timeline;
pub use timeline::timeline;

use axis::{Axis, fmt_num};

/// Each mode's colour and dash pattern, so that lines stay apart in grey print too.
pub(crate) fn style(mode: Mode) -> (&'static str, &'static str) {
    match mode {
        Mode::None => ("#7f7f7f", "2 3"),
        Mode::Lv1 => ("#1f77b4", ""),
        Mode::SchemeA => ("#ff7f0e", "7 3"),
        Mode::Lv2 => ("#2ca02c", "4 2 1 2"),
        Mode::Lv3 => ("#d62728", ""),
    }
}

/// Text for XML character data and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn header(s: &mut String, width: f64, height: f64, title: &str) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, "<title>{}</title>", esc(title));
    let _ = writeln!(
        s,
        r##"<rect width="{width}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        width / 2.0,
        esc(title)
    );
}

const W: f64 = 800.0;
const H: f64 = 460.0;
/// Plot area: left, top, right, bottom.
const AREA: (f64, f64, f64, f64) = (70.0, 50.0, 540.0, 400.0);

/// The latency CDF of the highest-priority tier (the requests of every task at that priority),
/// one step line per mode, x in ms (logarithmic when the latencies span ten times or more), and
/// the tier's standalone p99 as a dashed reference.
pub fn cdf(scenario: &Scenario, report: &SimReport, runs: &[ModeRun]) -> String {
    let top = runs
        .iter()
        .flat_map(|r| r.tasks.iter().map(|t| t.priority))
        .max()
        .unwrap_or(0);
    let curves: Vec<(Mode, Vec<f64>)> = runs
        .iter()
        .map(|r| {
            let mut v: Vec<f64> = r
                .tasks
                .iter()
                .filter(|t| t.priority == top)
                .flat_map(|t| t.latencies.iter().map(|&ns| ns as f64 / 1e6))
                .collect();
            v.sort_by(f64::total_cmp);
            (r.mode, v)
        })
        .collect();
    let alone_ms = report
        .modes
        .first()
        .and_then(|m| m.tiers.first())
        .and_then(|t| t.standalone_p99_us)
        .map(|us| us / 1e3);
    let all = curves.iter().flat_map(|c| c.1.iter().copied());
    let (lo, hi) = all
        .chain(alone_ms)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    let (l, t, r, b) = AREA;
    let x = Axis::fit(lo, hi, l, r);
    let y = |f: f64| b - f * (b - t);
    let title = format!(
        "{} (seed {}): latency CDF of priority {top}",
        scenario.name, scenario.seed
    );
    let mut s = String::new();
    header(&mut s, W, H, &title);
    // Grid and axes.
    for f in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = writeln!(
            s,
            r##"<line x1="{l}" y1="{0:.1}" x2="{r}" y2="{0:.1}" stroke="#e5e5e5"/><text x="{1}" y="{2:.1}" text-anchor="end">{f}</text>"##,
            y(f),
            l - 6.0,
            y(f) + 4.0
        );
    }
    for (v, major) in x.ticks() {
        let px = x.px(v);
        let colour = if major { "#d0d0d0" } else { "#eeeeee" };
        let _ = writeln!(
            s,
            r#"<line x1="{px:.1}" y1="{t}" x2="{px:.1}" y2="{b}" stroke="{colour}"/>"#
        );
        if major {
            let _ = writeln!(
                s,
                r#"<text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"#,
                b + 16.0,
                fmt_num(v)
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<rect x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="#333333"/>"##,
        r - l,
        b - t
    );
    let scale = if x.log { ", log scale" } else { "" };
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">request latency, arrival to last kernel done (ms{scale})</text>"#,
        (l + r) / 2.0,
        b + 36.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">fraction of requests done within</text>"#,
        (t + b) / 2.0,
        (t + b) / 2.0
    );
    if let Some(a) = alone_ms {
        let px = x.px(a);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{t}" x2="{px:.1}" y2="{b}" stroke="#000000" stroke-dasharray="1 3"/>"##
        );
    }
    // One step line per mode.
    for (mode, v) in &curves {
        if v.is_empty() {
            continue;
        }
        let (colour, dash) = style(*mode);
        let _ = writeln!(
            s,
            r#"<path class="cdf" data-mode="{}" d="{}" fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
            mode.name(),
            steps(v, &x, &y)
        );
    }
    legend(&mut s, &curves, alone_ms);
    s.push_str("</svg>\n");
    s
}

/// The CDF as a step path: flat at each fraction until the next latency, then up. Steps closer
/// than a quarter pixel are merged, so a million requests make a path of a few thousand points.
fn steps(v: &[f64], x: &Axis, y: &dyn Fn(f64) -> f64) -> String {
    let n = v.len() as f64;
    let mut d = format!("M{:.1},{:.1}", x.left, y(0.0));
    let mut last = f64::NEG_INFINITY;
    for (i, &val) in v.iter().enumerate() {
        let px = x.px(val);
        if px - last >= 0.25 {
            let _ = write!(d, "H{px:.1}");
            last = px;
        }
        // Up only once the next latency is somewhere else: equal ones make one taller step.
        if v.get(i + 1).is_none_or(|&next| x.px(next) - last >= 0.25) {
            let _ = write!(d, "V{:.1}", y((i + 1) as f64 / n));
        }
    }
    let _ = write!(d, "H{:.1}", x.right);
    d
}

fn legend(s: &mut String, curves: &[(Mode, Vec<f64>)], alone_ms: Option<f64>) {
    let (_, t, r, _) = AREA;
    let x0 = r + 18.0;
    let _ = writeln!(
        s,
        r#"<text x="{x0}" y="{}" font-weight="bold">mode: p50 / p99 ms (n)</text>"#,
        t + 10.0
    );
    let pct = |v: &[f64], q: f64| {
        let rank = (q * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    };
    for (i, (mode, v)) in curves.iter().enumerate() {
        let yy = t + 32.0 + i as f64 * 22.0;
        let (colour, dash) = style(*mode);
        let text = if v.is_empty() {
            format!("{mode}: none completed")
        } else {
            format!(
                "{mode}: {} / {} ({})",
                fmt_num(pct(v, 0.5)),
                fmt_num(pct(v, 0.99)),
                v.len()
            )
        };
        let _ = writeln!(
            s,
            r#"<line x1="{x0}" y1="{yy}" x2="{}" y2="{yy}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"#,
            x0 + 28.0,
            x0 + 34.0,
            yy + 4.0,
            esc(&text)
        );
    }
    if let Some(a) = alone_ms {
        let yy = t + 32.0 + curves.len() as f64 * 22.0;
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{yy}" x2="{}" y2="{yy}" stroke="#000000" stroke-dasharray="1 3"/><text x="{}" y="{}">alone p99: {}</text>"##,
            x0 + 28.0,
            x0 + 34.0,
            yy + 4.0,
            fmt_num(a)
        );
    }
}
