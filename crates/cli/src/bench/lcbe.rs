//! `xpreempt bench lcbe`: LC/BE scenarios, in one process or two (this binary re-run as a child
//! with `bench role`), each normalized to LC alone and BE alone of the same run.

use super::{env, svg};
use crate::output::Output;
use anyhow::{Result, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command as Proc, Stdio};
use std::time::Duration;
use xpreempt_bench::Env;
use xpreempt_bench::control::SharedControl;
use xpreempt_bench::roles::{BeResult, BeSpec, LcResult, LcSpec, run_be, run_lc};
use xpreempt_core::Level;

pub(super) struct LcbeParams {
    pub(super) device: i32,
    pub(super) block_us: f64,
    pub(super) kernel_us: f64,
    pub(super) persistent: bool,
    pub(super) secs: f64,
    pub(super) label: String,
    pub(super) shim: Option<PathBuf>,
}

/// How a scenario's BE side is preempted, so that results are read for what they measure.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
enum ScenarioPath {
    /// Through xpreempt's scheduler (LocalScheduler, a policy, the XQueue protocol).
    #[serde(rename = "scheduler")]
    Scheduler,
    /// The preemption mechanism driven by the benchmark's own shared-word controller (or a
    /// timeslice set directly), bypassing the scheduler.
    #[serde(rename = "mechanism (bench-only controller)")]
    Mechanism,
    /// No xpreempt preemption: native streams, stream priorities, MPS, or a side alone.
    #[serde(rename = "baseline")]
    Baseline,
}

impl ScenarioPath {
    fn label(self) -> &'static str {
        match self {
            ScenarioPath::Scheduler => "scheduler",
            ScenarioPath::Mechanism => "mechanism (bench-only controller)",
            ScenarioPath::Baseline => "baseline",
        }
    }
}

#[derive(Serialize, Default)]
struct ScenarioResult {
    scenario: String,
    /// `None` for an unknown scenario.
    path: Option<ScenarioPath>,
    label: String,
    persistent: bool,
    block_us: f64,
    lc: Option<LcResult>,
    be: Option<BeResult>,
    lc_p50_norm: Option<f64>,
    lc_p99_norm: Option<f64>,
    lc_p99_minus_alone_us: Option<f64>,
    be_norm: Option<f64>,
    error: Option<String>,
}

pub(super) fn be_spec(p: &LcbeParams, level: Option<Level>, prio: i32, guarded: bool) -> BeSpec {
    // Lv2 keeps a shallow hardware window (2 kernels of ~1 ms): everything in flight that has
    // not started must drain through the guard on each suspension before the relaunch.
    let lv2 = level == Some(Level::Lv2);
    BeSpec {
        level,
        stream_priority: prio,
        block_us: p.block_us,
        kernel_us: p.kernel_us,
        persistent: p.persistent,
        guarded,
        window: if lv2 { 2 } else { 3 },
        threshold: if lv2 { 2 } else { 4 },
        batch: if lv2 { 1 } else { 2 },
        static_timeslice_us: None,
        max_secs: p.secs + 30.0,
        agent: None,
    }
}

fn lc_spec(p: &LcbeParams, prio: i32, signal: bool) -> LcSpec {
    LcSpec {
        stream_priority: prio,
        kernels: 2,
        blocks: 4,
        kernel_us: 10.0,
        gap_min_us: 1000,
        gap_max_us: 3000,
        secs: p.secs,
        signal,
        timeslice_us: None,
        alone: false,
        agent: None,
    }
}

enum Plan {
    OneProc(Option<BeSpec>, Option<LcSpec>),
    /// One process, both queues under the local-mode scheduler.
    Sched(BeSpec, LcSpec),
    TwoProc {
        be: BeSpec,
        lc: LcSpec,
        be_env: Vec<(String, String)>,
        preload: bool,
    },
}

fn plan(p: &LcbeParams, name: &str, greatest: i32, least: i32) -> Result<Plan> {
    let mut lc_alone = lc_spec(p, greatest, false);
    lc_alone.alone = true;
    Ok(match name {
        "lc-alone" => Plan::OneProc(None, Some(lc_alone)),
        "be-alone" => Plan::OneProc(Some(be_spec(p, None, 0, false)), None),
        "be-alone-xp" => Plan::OneProc(Some(be_spec(p, Some(Level::Lv2), least, true)), None),
        "prio-1proc" => Plan::OneProc(
            Some(be_spec(p, None, least, false)),
            Some(lc_spec(p, greatest, false)),
        ),
        "xp-lv1-1proc" => Plan::OneProc(
            Some(be_spec(p, Some(Level::Lv1), least, false)),
            Some(lc_spec(p, greatest, true)),
        ),
        "xp-lv2-1proc" => Plan::OneProc(
            Some(be_spec(p, Some(Level::Lv2), least, true)),
            Some(lc_spec(p, greatest, true)),
        ),
        "xp-sched-lv2-1proc" => Plan::Sched(
            be_spec(p, Some(Level::Lv2), least, true),
            lc_spec(p, greatest, false),
        ),
        "native-2proc" | "mps-default" => Plan::TwoProc {
            be: be_spec(p, None, 0, false),
            lc: lc_spec(p, 0, false),
            be_env: vec![],
            preload: false,
        },
        "mps-prio" => Plan::TwoProc {
            be: be_spec(p, None, least, false),
            lc: lc_spec(p, greatest, false),
            be_env: vec![],
            preload: false,
        },
        "mps-client-prio" => Plan::TwoProc {
            be: be_spec(p, None, 0, false),
            lc: lc_spec(p, 0, false),
            be_env: vec![("CUDA_MPS_CLIENT_PRIORITY".into(), "1".into())],
            preload: false,
        },
        "xp-mps-2proc" => Plan::TwoProc {
            be: be_spec(p, Some(Level::Lv2), least, true),
            lc: lc_spec(p, greatest, true),
            be_env: vec![],
            preload: false,
        },
        "xp-lv3-2proc" => {
            let mut lc = lc_spec(p, 0, true);
            lc.timeslice_us = Some(20_000);
            Plan::TwoProc {
                be: be_spec(p, Some(Level::Lv3), 0, false),
                lc,
                be_env: vec![],
                preload: true,
            }
        }
        "xp-lv3static-2proc" => {
            let mut lc = lc_spec(p, 0, false);
            lc.timeslice_us = Some(20_000);
            let mut be = be_spec(p, None, 0, false);
            be.static_timeslice_us = Some(1);
            Plan::TwoProc {
                be,
                lc,
                be_env: vec![],
                preload: true,
            }
        }
        other => bail!("unknown scenario `{other}`"),
    })
}

/// Read off what the plan does rather than kept as a second list of names: the LC side signals
/// the shared control word, or a timeslice is set directly, only in mechanism scenarios.
fn path_of(plan: &Plan) -> ScenarioPath {
    let mechanism = |be: Option<&BeSpec>, lc: Option<&LcSpec>| {
        lc.is_some_and(|l| l.signal || l.timeslice_us.is_some())
            || be.is_some_and(|b| b.static_timeslice_us.is_some())
    };
    match plan {
        Plan::Sched(..) => ScenarioPath::Scheduler,
        Plan::OneProc(be, lc) if mechanism(be.as_ref(), lc.as_ref()) => ScenarioPath::Mechanism,
        Plan::TwoProc { be, lc, .. } if mechanism(Some(be), Some(lc)) => ScenarioPath::Mechanism,
        Plan::OneProc(..) | Plan::TwoProc { .. } => ScenarioPath::Baseline,
    }
}

pub(super) fn ctl_path(tag: &str) -> PathBuf {
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("xpreempt-bench-{}-{tag}", std::process::id()))
}

fn run_scenario(
    e: &Env,
    p: &LcbeParams,
    name: &str,
) -> Result<(Option<LcResult>, Option<BeResult>)> {
    let (least, greatest) = e.device.stream_priority_range()?;
    let path = ctl_path(name);
    let ctl = SharedControl::open(&path, true)?;
    let r = match plan(p, name, greatest, least)? {
        Plan::OneProc(be, lc) => std::thread::scope(|sc| -> Result<_> {
            let ctl = &ctl;
            let be_h = be.map(|spec| sc.spawn(move || run_be(e, &spec, ctl)));
            let lc_r = match lc {
                Some(spec) => Some(run_lc(e, &spec, ctl)?),
                None => {
                    // BE alone: measured over the same window as an LC run would be.
                    ctl.window(|| std::thread::sleep(Duration::from_secs_f64(p.secs)))?;
                    None
                }
            };
            let be_r = match be_h {
                Some(h) => Some(
                    h.join()
                        .map_err(|_| anyhow::anyhow!("BE thread panicked"))??,
                ),
                None => None,
            };
            Ok((lc_r, be_r))
        })?,
        Plan::Sched(be, lc) => {
            let (l, b) = xpreempt_bench::sched::run_sched_pair(e, &be, &lc, "hpf")?;
            (Some(l), Some(b))
        }
        Plan::TwoProc {
            be,
            lc,
            be_env,
            preload,
        } => {
            let exe = std::env::current_exe()?;
            let shim = p
                .shim
                .clone()
                .unwrap_or_else(|| exe.with_file_name("libxpreempt_shim.so"));
            if preload && !shim.exists() {
                bail!("{name} needs the ioctl shim at {}", shim.display());
            }
            let spawn = |role: &str,
                         spec: String,
                         envs: &[(String, String)]|
             -> Result<std::process::Child> {
                let mut c = Proc::new(&exe);
                c.args([
                    "bench",
                    "--device",
                    &p.device.to_string(),
                    "role",
                    "--role",
                    role,
                    "--spec",
                    &spec,
                    "--ctl",
                ])
                .arg(&path)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
                for (k, v) in envs {
                    c.env(k, v);
                }
                if preload {
                    c.env("LD_PRELOAD", &shim);
                }
                Ok(c.spawn()?)
            };
            let be_child = spawn("be", serde_json::to_string(&be)?, &be_env)?;
            let lc_child = spawn("lc", serde_json::to_string(&lc)?, &[])?;
            let lc_out = lc_child.wait_with_output()?;
            let be_out = be_child.wait_with_output()?;
            let last = |o: &std::process::Output, who: &str| -> Result<String> {
                if !o.status.success() {
                    bail!("{who} process failed ({})", o.status);
                }
                Ok(String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .last()
                    .unwrap_or("")
                    .to_string())
            };
            let lc_r: LcResult = serde_json::from_str(&last(&lc_out, "LC")?)?;
            let be_r: BeResult = serde_json::from_str(&last(&be_out, "BE")?)?;
            (Some(lc_r), Some(be_r))
        }
    };
    drop(ctl);
    let _ = std::fs::remove_file(&path);
    Ok(r)
}

pub(super) fn child_role(device: i32, role: &str, spec: &str, ctl: &Path) -> Result<()> {
    let e = env(device)?;
    let c = SharedControl::open(ctl, false)?;
    let line = match role {
        "be" => serde_json::to_string(&run_be(&e, &serde_json::from_str(spec)?, &c)?)?,
        "lc" => serde_json::to_string(&run_lc(&e, &serde_json::from_str(spec)?, &c)?)?,
        other => bail!("unknown role {other}"),
    };
    println!("{line}");
    Ok(())
}

pub(super) fn lcbe(
    out: &Output,
    p: &LcbeParams,
    scenarios: &str,
    o: Option<&Path>,
    s: Option<&Path>,
) -> Result<()> {
    let e = env(p.device)?;
    let mut results: Vec<ScenarioResult> = Vec::new();
    for name in scenarios
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        eprintln!("scenario {name} ...");
        let mut r = ScenarioResult {
            scenario: name.into(),
            // The path does not depend on the device's stream priorities.
            path: plan(p, name, 0, 0).ok().as_ref().map(path_of),
            label: p.label.clone(),
            persistent: p.persistent,
            block_us: p.block_us,
            ..Default::default()
        };
        match run_scenario(&e, p, name) {
            Ok((lc, be)) => {
                r.lc = lc;
                r.be = be;
            }
            Err(err) => {
                eprintln!("scenario {name} failed: {err:#}");
                r.error = Some(format!("{err:#}"));
            }
        }
        results.push(r);
    }
    let lc_alone = results
        .iter()
        .find(|r| r.scenario == "lc-alone")
        .and_then(|r| r.lc.as_ref())
        .map(|l| l.latency_us.clone());
    let be_alone = results
        .iter()
        .find(|r| r.scenario == "be-alone")
        .and_then(|r| r.be.as_ref())
        .map(|b| b.units_per_s);
    for r in &mut results {
        if let (Some(a), Some(l)) = (&lc_alone, &r.lc) {
            r.lc_p50_norm = Some(l.latency_us.p50 / a.p50);
            r.lc_p99_norm = Some(l.latency_us.p99 / a.p99);
            r.lc_p99_minus_alone_us = Some(l.latency_us.p99 - a.p99);
        }
        if let (Some(a), Some(b)) = (be_alone, &r.be) {
            r.be_norm = Some(b.units_per_s / a);
        }
    }
    if let Some(path) = o {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)?;
    }
    if let Some(path) = s {
        let tag = format!(
            "{} block {} us{}",
            p.label,
            p.block_us,
            if p.persistent { " persistent BE" } else { "" }
        );
        let lc_rows: Vec<_> = results
            .iter()
            .filter_map(|r| {
                r.lc.as_ref().map(|l| {
                    (
                        r.scenario.clone(),
                        l.latency_us.p99,
                        format!("(p50 {:.0})", l.latency_us.p50),
                    )
                })
            })
            .collect();
        let be_rows: Vec<_> = results
            .iter()
            .filter_map(|r| r.be_norm.map(|b| (r.scenario.clone(), b, String::new())))
            .collect();
        let mut svg_text = svg::bar_chart(&format!("LC p99 latency, {tag}"), "us", &lc_rows, true);
        svg_text = svg_text.replace("</svg>\n", "");
        let be_svg = svg::bar_chart(
            &format!("BE throughput / BE alone, {tag}"),
            "",
            &be_rows,
            false,
        );
        // Two charts stacked: the second as a nested svg below the first.
        let h1 = 40.0 + lc_rows.len() as f64 * 22.0 + 30.0;
        let h2 = 40.0 + be_rows.len() as f64 * 22.0 + 30.0;
        svg_text = svg_text.replacen(
            &format!("height='{h1}'"),
            &format!("height='{}'", h1 + h2),
            1,
        );
        svg_text += &be_svg.replacen("<svg ", &format!("<svg y='{h1}' "), 1);
        svg_text += "</svg>\n";
        std::fs::write(path, svg_text)?;
    }
    out.emit(&results, || {
        let mut t = String::from(
            "scenario              LC p50    LC p99  p99/alone  BE/alone  suspends  path                               error\n",
        );
        for r in &results {
            t += &format!(
                "{:<20} {:>8} {:>9} {:>10} {:>9} {:>9}  {:<33}  {}\n",
                r.scenario,
                r.lc.as_ref()
                    .map_or("-".into(), |l| format!("{:.1}", l.latency_us.p50)),
                r.lc.as_ref()
                    .map_or("-".into(), |l| format!("{:.1}", l.latency_us.p99)),
                r.lc_p99_norm.map_or("-".into(), |v| format!("{v:.2}")),
                r.be_norm.map_or("-".into(), |v| format!("{v:.3}")),
                r.be.as_ref().map_or("-".into(), |b| b.suspends.to_string()),
                r.path.map_or("-", ScenarioPath::label),
                r.error.as_deref().unwrap_or("")
            );
        }
        t
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> LcbeParams {
        LcbeParams {
            device: 0,
            block_us: 20.0,
            kernel_us: 1000.0,
            persistent: false,
            secs: 1.0,
            label: String::new(),
            shim: None,
        }
    }

    #[test]
    fn every_scenario_says_which_path_it_measures() {
        use ScenarioPath::*;
        let expected = [
            ("lc-alone", Baseline),
            ("be-alone", Baseline),
            ("be-alone-xp", Baseline),
            ("native-2proc", Baseline),
            ("prio-1proc", Baseline),
            ("mps-default", Baseline),
            ("mps-prio", Baseline),
            ("mps-client-prio", Baseline),
            ("xp-lv1-1proc", Mechanism),
            ("xp-lv2-1proc", Mechanism),
            ("xp-mps-2proc", Mechanism),
            ("xp-lv3-2proc", Mechanism),
            ("xp-lv3static-2proc", Mechanism),
            ("xp-sched-lv2-1proc", Scheduler),
        ];
        for (name, path) in expected {
            let plan = plan(&params(), name, -5, 0).expect("known scenario");
            assert_eq!(path_of(&plan), path, "{name}");
        }
        assert!(plan(&params(), "nope", -5, 0).is_err());
        assert_eq!(
            serde_json::to_string(&Mechanism).expect("json"),
            "\"mechanism (bench-only controller)\""
        );
    }
}
