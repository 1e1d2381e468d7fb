//! `xpreempt-bench lcbe`: LC/BE scenarios, in one process or two (this binary re-run as a child
//! with `role`), each normalized to LC alone and BE alone of the same run. The global-mode
//! scenarios also run a private daemon (`xpreemptd`'s code) that both sides' agents register with.

use super::procs::{Daemon, Kid};
use super::scenarios::{LcbeParams, Plan, ScenarioPath, parse_scenarios, path_of, plan};
use super::{env, env_with, svg};
use crate::output::{ChecksFailed, Output};
use anyhow::{Result, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use xpreempt_bench::control::SharedControl;
use xpreempt_bench::queue::AgentSpec;
use xpreempt_bench::roles::{BeResult, BeSpec, LcResult, LcSpec, run_be, run_lc};
use xpreempt_bench::sched::{BE_PRIORITY, LC_PRIORITY};
use xpreempt_bench::{Calibration, Env};

#[derive(Serialize, Default)]
struct ScenarioResult {
    scenario: String,
    /// `None` for an unknown scenario.
    path: Option<ScenarioPath>,
    label: String,
    persistent: bool,
    block_us: f64,
    /// `CUDA_DEVICE_MAX_CONNECTIONS` as this run had it (unset: the driver's default).
    max_connections: Option<String>,
    lc: Option<LcResult>,
    be: Option<BeResult>,
    lc_p50_norm: Option<f64>,
    lc_p99_norm: Option<f64>,
    lc_p99_minus_alone_us: Option<f64>,
    be_norm: Option<f64>,
    error: Option<String>,
}

/// The control file the two sides share, removed when the scenario ends however it ends.
pub(super) struct CtlFile {
    path: PathBuf,
    ctl: SharedControl,
}

impl CtlFile {
    pub(super) fn create(tag: &str) -> Result<Self> {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!("xpreempt-bench-{}-{tag}", std::process::id()));
        let ctl = SharedControl::open(&path, true)?;
        Ok(Self { path, ctl })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for CtlFile {
    type Target = SharedControl;
    fn deref(&self) -> &SharedControl {
        &self.ctl
    }
}

impl Drop for CtlFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

type Pair = (Option<LcResult>, Option<BeResult>);

fn run_scenario(e: &Env, p: &LcbeParams, name: &str) -> Result<Pair> {
    let (least, greatest) = e.device.stream_priority_range()?;
    let ctl = CtlFile::create(name)?;
    match plan(p, name, greatest, least)? {
        Plan::OneProc(be, lc) => std::thread::scope(|sc| -> Result<_> {
            let ctl = &*ctl;
            let be_h = be.map(|spec| sc.spawn(move || run_be(e, &spec, ctl)));
            let lc_r = match lc {
                Some(spec) => run_lc(e, &spec, ctl).map(Some),
                // BE alone: measured over the same window as an LC run would be.
                None => ctl.window(|| std::thread::sleep(p.window())).map(|()| None),
            };
            let be_r = match be_h {
                Some(h) => Some(
                    h.join()
                        .map_err(|_| anyhow::anyhow!("BE thread panicked"))??,
                ),
                None => None,
            };
            Ok((lc_r?, be_r))
        }),
        Plan::Sched(be, lc) => {
            let (l, b) = xpreempt_bench::sched::run_sched_pair(e, &be, &lc, "hpf")?;
            Ok((Some(l), Some(b)))
        }
        Plan::TwoProc {
            be,
            lc,
            mut be_env,
            preload,
        } => {
            let mut lc_env = vec![];
            if preload {
                let shim = match &p.shim {
                    Some(s) => s.clone(),
                    None => std::env::current_exe()?.with_file_name("libxpreempt_shim.so"),
                };
                if !shim.exists() {
                    bail!("{name} needs the ioctl shim at {}", shim.display());
                }
                let preload = ("LD_PRELOAD".to_string(), shim.display().to_string());
                be_env.push(preload.clone());
                lc_env.push(preload);
            }
            run_pair(e, p, &ctl, Some((&be, &be_env)), &lc, &lc_env)
        }
        Plan::Daemon { be, lc, sharing } => {
            let here = xpreempt_cuda::mps::detect(&e.device);
            if let Some(want) = sharing
                && want != here
            {
                bail!("{name} must run with sharing {want:?}, but this GPU context is {here:?}");
            }
            let daemon = Daemon::start(name)?;
            let through = |priority: i32| {
                Some(AgentSpec {
                    socket: daemon.socket().to_path_buf(),
                    priority,
                })
            };
            let be = be.map(|b| BeSpec {
                agent: through(BE_PRIORITY),
                ..b
            });
            let lc = LcSpec {
                agent: through(LC_PRIORITY),
                ..lc
            };
            let r = run_pair(e, p, &ctl, be.as_ref().map(|b| (b, &[][..])), &lc, &[]);
            // Stopped (and checked) whether or not the sides succeeded; their error comes first.
            let stopped = daemon.stop();
            let (lc_r, be_r) = r?;
            stopped?;
            if let Some(b) = &be_r
                && b.suspends == 0
            {
                bail!(
                    "xpreemptd never suspended the BE queue while the LC side ran: the two \
                     processes were not scheduled together"
                );
            }
            Ok((lc_r, be_r))
        }
    }
}

/// The two sides as processes (or the LC side alone); each one's result is its last stdout line.
fn run_pair(
    e: &Env,
    p: &LcbeParams,
    ctl: &CtlFile,
    be: Option<(&BeSpec, &[(String, String)])>,
    lc: &LcSpec,
    lc_env: &[(String, String)],
) -> Result<Pair> {
    let be = match be {
        Some((spec, envs)) => Some(Kid::role(
            "BE",
            p.device,
            e.calibration(),
            serde_json::to_string(spec)?,
            ctl.path(),
            envs,
        )?),
        None => None,
    };
    let lc = Kid::role(
        "LC",
        p.device,
        e.calibration(),
        serde_json::to_string(lc)?,
        ctl.path(),
        lc_env,
    )?;
    let lc_r = lc.result::<LcResult>();
    // However the LC side ended, the BE side's run is over (it would otherwise wait out its
    // max_secs).
    ctl.phase.store(2, Ordering::Release);
    let be_r = be.map(Kid::result::<BeResult>).transpose();
    match (lc_r, be_r) {
        (Ok(l), Ok(b)) => Ok((Some(l), b)),
        (Err(err), Ok(_)) | (Ok(_), Err(err)) => Err(err),
        // The LC side usually failed because the BE side did: both causes are kept.
        (Err(l), Err(b)) => Err(anyhow::anyhow!("{b:#}; {l:#}")),
    }
}

pub(super) fn child_role(
    device: i32,
    role: &str,
    spec: &str,
    ctl: &Path,
    calibration: Option<Calibration>,
) -> Result<()> {
    let c = SharedControl::open(ctl, false)?;
    let line = (|| -> Result<String> {
        let e = env_with(device, calibration)?;
        Ok(match role {
            "be" => serde_json::to_string(&run_be(&e, &serde_json::from_str(spec)?, &c)?)?,
            "lc" => serde_json::to_string(&run_lc(&e, &serde_json::from_str(spec)?, &c)?)?,
            other => bail!("unknown role {other}"),
        })
    })();
    if line.is_err() {
        // The other side stops waiting for this one.
        c.phase.store(2, Ordering::Release);
    }
    crate::output::print(&format!("{}\n", line?))
}

pub(super) fn lcbe(
    out: &Output,
    p: &LcbeParams,
    scenarios: &str,
    o: Option<&Path>,
    s: Option<&Path>,
) -> Result<()> {
    let names = parse_scenarios(p, scenarios)?;
    let e = env(p.device)?;
    let max_connections = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok();
    if xpreempt_cuda::mps::detect(&e.device) == xpreempt_cuda::mps::Sharing::MpsClient
        && max_connections.is_none()
    {
        // `xpreempt run` sets it for its children; a bare benchmark run does not.
        eprintln!(
            "warning: under MPS without CUDA_DEVICE_MAX_CONNECTIONS: a process's streams may share a \
             hardware queue, so a Lv2 flag can wait behind the BE's kernels (set it to 32, as \
             `xpreempt run` does)"
        );
    }
    let mut results: Vec<ScenarioResult> = Vec::new();
    for name in &names {
        eprintln!("scenario {name} ...");
        let mut r = ScenarioResult {
            scenario: name.clone(),
            // The path does not depend on the device's stream priorities.
            path: plan(p, name, 0, 0).ok().as_ref().map(path_of),
            label: p.label.clone(),
            persistent: p.persistent,
            block_us: p.block_us,
            max_connections: max_connections.clone(),
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
    // `--out` keeps the bare list; stdout is one object, as every `--json` output.
    out.emit(&serde_json::json!({ "results": results }), || {
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
    })?;
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| r.scenario.as_str())
        .collect();
    if !failed.is_empty() {
        // The results are printed and written: the failure says which ones to distrust.
        return Err(ChecksFailed {
            summary: format!(
                "{} of {} scenarios failed: {}",
                failed.len(),
                results.len(),
                failed.join(", ")
            ),
        }
        .into());
    }
    Ok(())
}
