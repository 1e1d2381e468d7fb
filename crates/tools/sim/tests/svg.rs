//! The SVG plots are well-formed XML with what a reader looks for: one CDF line per mode that
//! climbs to 1, a legend and a title naming the scenario and seed, and a timeline row per task.

use roxmltree::{Document, Node};
use xpreempt_sim::report::{SimOptions, simulate};
use xpreempt_sim::runner::Mode;
use xpreempt_sim::scenario::Scenario;
use xpreempt_sim::svg::{self, timeline::MAX_ROWS};

fn traced(s: &Scenario, modes: &[Mode]) -> (String, String) {
    let opts = SimOptions {
        trace: true,
        ..SimOptions::default()
    };
    let (report, runs) = simulate(s, modes, &opts).unwrap();
    (svg::cdf(s, &report, &runs), svg::timeline(s, &runs))
}

fn elements<'a>(doc: &'a Document, tag: &str) -> Vec<Node<'a, 'a>> {
    doc.descendants()
        .filter(|n| n.has_tag_name(("http://www.w3.org/2000/svg", tag)))
        .collect()
}

fn text(doc: &Document) -> String {
    doc.descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_cdf_has_one_path_per_mode_that_climbs_to_one() {
    let s = Scenario::default_scenario().unwrap();
    let (cdf, _) = traced(&s, &Mode::ALL);
    let doc = Document::parse(&cdf).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let paths = elements(&doc, "path");
    let modes: Vec<&str> = paths
        .iter()
        .filter_map(|p| p.attribute("data-mode"))
        .collect();
    assert_eq!(modes, ["none", "lv1", "scheme-a", "lv2", "lv3"]);
    assert_eq!(paths.len(), 5, "nothing else is a path");
    let words = text(&doc);
    assert!(words.contains("train-vs-infer (seed 42)"), "{words}");
    assert!(words.contains("priority 12"), "{words}");
    for m in [
        "none: 52.2 / 52.2 (1)",
        "lv3: 20.9 / 20.9 (1)",
        "alone p99: 20.9",
    ] {
        assert!(words.contains(m), "legend `{m}` missing: {words}");
    }
    // Each line ends at the top of the plot (every request done), lv3's step to the left of
    // none's: inference done sooner with preemption.
    let top = 50.0;
    let steps: Vec<f64> = paths
        .iter()
        .map(|p| {
            let d = p.attribute("d").unwrap();
            assert!(d.contains(&format!("V{top:.1}")), "{d}");
            let h = d.split('H').nth(1).unwrap();
            h.trim_end_matches(|c: char| !c.is_ascii_digit())
                .split('V')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(steps[4] < steps[0], "{steps:?}");
}

#[test]
fn a_wide_spread_gets_a_log_axis_and_a_mode_subset_its_own_lines() {
    let text_ = "name = \"spread\"\nseed = 3\n\
        [[tasks]]\nname = \"bg\"\npriority = 1\nkernels = 30\n\
        kernel = { workgroups = 2000, wg_us = 300.0 }\n\
        [[tasks]]\nname = \"hi\"\npriority = 5\nkernels = 1\n\
        kernel = { workgroups = 8, wg_us = 20.0 }\n\
        arrival = { times_us = [100, 5000, 9000, 30000], burst = 3 }\n";
    let s = Scenario::parse(text_).unwrap();
    let (cdf, _) = traced(&s, &[Mode::None, Mode::Lv3]);
    let doc = Document::parse(&cdf).unwrap();
    let modes: Vec<&str> = elements(&doc, "path")
        .iter()
        .filter_map(|p| p.attribute("data-mode"))
        .collect();
    assert_eq!(modes, ["none", "lv3"]);
    let words = text(&doc);
    assert!(
        words.contains("log scale") && words.contains("(12)"),
        "{words}"
    );
}

#[test]
fn the_timeline_has_a_row_per_task_with_its_runs_and_markers() {
    let s = Scenario::default_scenario().unwrap();
    let (_, tl) = traced(&s, &[Mode::None, Mode::Lv3]);
    let doc = Document::parse(&tl).expect("well-formed XML");
    let words = text(&doc);
    assert!(words.contains("train-vs-infer (seed 42)"), "{words}");
    let rows = |name: &str| words.lines().filter(|l| *l == name).count();
    assert_eq!(
        (rows("train"), rows("infer")),
        (2, 2),
        "a row per task and mode"
    );
    // Lv3: one preemption and one resume, drawn; none has neither.
    let class = |c: &str| {
        elements(&doc, "polygon")
            .iter()
            .filter(|p| p.attribute("class") == Some(c))
            .count()
    };
    assert_eq!(
        (class("preempt"), class("resume")),
        (1 + 1, 1 + 1),
        "legend + lv3"
    );
    let arrivals = elements(&doc, "line")
        .iter()
        .filter(|l| l.attribute("class") == Some("arrival"))
        .count();
    assert_eq!(arrivals, 4, "two requests in each of two modes");
    // Train runs in two stretches under lv3 (before and after inference), once under none.
    let bars = |colour: &str| {
        elements(&doc, "rect")
            .iter()
            .filter(|r| r.attribute("fill") == Some(colour) && r.attribute("height") == Some("10"))
            .count()
    };
    assert_eq!(bars("#1f77b4"), 1 + 1 + 2, "legend, none, lv3");
    assert_eq!(bars("#d62728"), 1 + 1 + 1, "legend, none, lv3");
}

#[test]
fn a_timeline_of_many_copies_stops_at_the_row_limit() {
    let text_ = "name = \"many\"\n[[tasks]]\nname = \"t\"\npriority = 1\ncount = 50\nkernels = 1\n\
        kernel = { workgroups = 4, wg_us = 10.0 }\n";
    let s = Scenario::parse(text_).unwrap();
    let (_, tl) = traced(&s, &[Mode::Lv1]);
    let doc = Document::parse(&tl).unwrap();
    let words = text(&doc);
    assert!(words.contains("t-39") && !words.contains("t-40"), "{words}");
    assert!(
        words.contains(&format!("and {} more tasks", 50 - MAX_ROWS)),
        "{words}"
    );
    // The count sits on a line of its own: below the axis's labels (10 px type on a baseline at
    // `y`), above the picture's bottom edge, and clear of every other text.
    let texts = elements(&doc, "text");
    let y = |n: &Node| n.attribute("y").unwrap().parse::<f64>().unwrap();
    let note = texts
        .iter()
        .find(|t| t.attribute("class") == Some("not-drawn"))
        .expect("the not-drawn note");
    let height: f64 = doc
        .root_element()
        .attribute("height")
        .unwrap()
        .parse()
        .unwrap();
    assert!(y(note) <= height - 4.0, "note at {} of {height}", y(note));
    for t in texts.iter().filter(|t| *t != note) {
        let gap = (y(note) - y(t)).abs();
        assert!(
            gap >= 11.0,
            "the note (y {}) overlaps `{}` (y {})",
            y(note),
            t.text().unwrap_or(""),
            y(t)
        );
    }
}
