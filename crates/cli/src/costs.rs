//! Each device's measured mechanism costs as `list` and `top` show them: for the Lv1 drain, the
//! Lv2 block-boundary stop and the Lv3 switch, the median and p99 of stopping (suspend until the
//! device is free of the queue's work) and restarting (resume until it runs again), merged over
//! the device's queues at that level; spatial confinement is not measured.

use crate::units::duration;
use xpreempt_ipc::costs::{CostSummary, DeviceCosts, MechanismCost};

fn mechanism_name(m: &MechanismCost) -> String {
    match m.level {
        Some(level) => format!("{level} {}", m.mechanism.describe()),
        None => m.mechanism.describe().to_string(),
    }
}

fn columns(c: [&str; 8]) -> String {
    format!(
        "{:>3} {:<23} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
    )
}

fn p50(s: Option<CostSummary>) -> String {
    duration(s.map(|s| s.p50_ns))
}

fn p99(s: Option<CostSummary>) -> String {
    duration(s.map(|s| s.p99_ns))
}

/// The section `list` prints under its queues.
pub fn table(costs: &[DeviceCosts]) -> String {
    let mut t = String::from(
        "mechanism costs: stop = suspend until the device is free of the queue's work, \
         restart = resume until it runs again (merged over the device's queues at the level)\n",
    );
    t.push_str(&columns([
        "dev",
        "mechanism",
        "samples",
        "stop p50",
        "stop p99",
        "rst p50",
        "rst p99",
        "over",
    ]));
    t.push('\n');
    for d in costs {
        for m in &d.mechanisms {
            let name = mechanism_name(m);
            let dev = d.device.to_string();
            if let Some(note) = &m.note {
                t.push_str(&format!("{dev:>3} {name:<23} {note}\n"));
                continue;
            }
            if m.stop.is_none() && m.restart.is_none() {
                t.push_str(&format!("{dev:>3} {name:<23} {:>7}\n", "-"));
                continue;
            }
            let samples = m.stop.map_or(0, |s| s.samples);
            t.push_str(&columns([
                &dev,
                &name,
                &samples.to_string(),
                &p50(m.stop),
                &p99(m.stop),
                &p50(m.restart),
                &p99(m.restart),
                &duration(m.over_ns),
            ]));
            t.push('\n');
        }
    }
    if costs.is_empty() {
        t.push_str("(no device has queues yet)\n");
    }
    t
}

/// One line per device for `top`: each measured mechanism's stop and restart, p50/p99.
pub fn lines(costs: &[DeviceCosts]) -> Vec<String> {
    costs
        .iter()
        .map(|d| {
            let parts: Vec<String> = d
                .mechanisms
                .iter()
                .map(|m| {
                    let name = mechanism_name(m);
                    match (&m.note, m.stop, m.restart) {
                        (Some(note), ..) => format!("{name} {note}"),
                        (None, None, None) => format!("{name} -"),
                        (None, stop, restart) => format!(
                            "{name} {}/{} (restart {}/{})",
                            p50(stop),
                            p99(stop),
                            p50(restart),
                            p99(restart)
                        ),
                    }
                })
                .collect();
            format!("dev {} costs (p50/p99): {}", d.device, parts.join("  "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_ipc::costs::Mechanism;
    use xpreempt_types::Level;

    fn measured(level: Level) -> MechanismCost {
        MechanismCost {
            mechanism: Mechanism::of(level),
            level: Some(level),
            stop: Some(CostSummary {
                samples: 12,
                p50_ns: 35_200,
                p99_ns: 120_000,
                mean_ns: 40_000,
            }),
            restart: Some(CostSummary {
                samples: 12,
                p50_ns: 4_100,
                p99_ns: 9_800,
                mean_ns: 5_000,
            }),
            over_ns: Some(12_000_000_000),
            note: None,
        }
    }

    fn unmeasured(level: Level) -> MechanismCost {
        MechanismCost {
            stop: None,
            restart: None,
            over_ns: None,
            ..measured(level)
        }
    }

    fn device() -> DeviceCosts {
        DeviceCosts {
            device: 0,
            mechanisms: vec![
                unmeasured(Level::Lv1),
                measured(Level::Lv2),
                unmeasured(Level::Lv3),
                MechanismCost::not_measured(Mechanism::SpatialConfinement),
            ],
        }
    }

    #[test]
    fn the_list_section_shows_each_mechanism_in_readable_units() {
        let t = table(&[device()]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 6, "{t}");
        assert_eq!(
            lines[1].chars().count(),
            lines[3].chars().count(),
            "the measured row lines up with the header:\n{t}"
        );
        let lv2: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(
            lv2,
            [
                "0",
                "lv2",
                "block-boundary",
                "stop",
                "12",
                "35.2µs",
                "120µs",
                "4.10µs",
                "9.80µs",
                "12.0s"
            ]
        );
        assert!(
            lines[2].starts_with("  0 lv1 drain") && lines[2].ends_with('-'),
            "{t}"
        );
        assert!(lines[4].starts_with("  0 lv3 switch"), "{t}");
        assert!(
            lines[5].ends_with("spatial confinement     not measured"),
            "{t}"
        );
        assert!(table(&[]).contains("no device"));
    }

    #[test]
    fn top_has_a_line_per_device() {
        let mut other = device();
        other.device = 1;
        let l = lines(&[device(), other]);
        assert_eq!(l.len(), 2);
        assert_eq!(
            l[0],
            "dev 0 costs (p50/p99): lv1 drain -  lv2 block-boundary stop 35.2µs/120µs \
             (restart 4.10µs/9.80µs)  lv3 switch -  spatial confinement not measured"
        );
        assert!(l[1].starts_with("dev 1 "));
    }

    #[test]
    fn top_shows_the_costs_under_its_totals() {
        let mut v = crate::top::View::new(250);
        v.update(Ok(crate::top::Snapshot {
            costs: vec![device()],
            ..Default::default()
        }));
        let t: Vec<String> = v.lines().iter().map(|l| l.to_string()).collect();
        assert!(t[1].starts_with("clients 0"), "{t:?}");
        assert_eq!(t[2], lines(&[device()])[0]);
        assert_eq!(t[4], crate::top::header_line());
    }
}
