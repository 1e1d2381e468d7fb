//! `xpreempt bench`: measurements on a real GPU (CUDA backend). Two-process scenarios re-run
//! this binary as a child with `bench role`.

use crate::output::Output;
use anyhow::{Context, Result, bail};
use clap::{Args as ClapArgs, Subcommand};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command as Proc, Stdio};
use std::time::Duration;
use xpreempt_core::Level;
use xpreempt_cuda::bench::control::SharedControl;
use xpreempt_cuda::bench::roles::{BeResult, BeSpec, LcResult, LcSpec, run_be, run_lc};
use xpreempt_cuda::bench::{Env, latency, svg};

#[derive(ClapArgs)]
pub struct Args {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, global = true)]
    device: i32,
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Device, driver, sharing mode and calibration.
    Info,
    /// Preemption latency per level vs kernel and block duration.
    Latency {
        #[arg(long, default_value_t = 20)]
        trials: usize,
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Block durations (µs), comma-separated.
        #[arg(long, default_value = "10,50,200")]
        blocks: String,
        /// Kernel durations (µs), comma-separated.
        #[arg(long, default_value = "10,100,1000,10000")]
        kernels: String,
    },
    /// LC/BE scenarios side by side.
    Lcbe {
        /// Comma-separated scenario names (see `--help`): lc-alone, be-alone, be-alone-xp,
        /// native-2proc, prio-1proc, xp-lv1-1proc, xp-lv2-1proc, xp-sched-lv2-1proc, xp-lv3-2proc,
        /// xp-lv3static-2proc,
        /// mps-default, mps-prio, mps-client-prio, xp-mps-2proc.
        #[arg(long)]
        scenarios: String,
        #[arg(long, default_value_t = 20.0)]
        block_us: f64,
        #[arg(long, default_value_t = 1000.0)]
        kernel_us: f64,
        #[arg(long)]
        persistent: bool,
        #[arg(long, default_value_t = 2.0)]
        secs: f64,
        /// Label for the sharing mode (e.g. "mps" when an MPS daemon runs).
        #[arg(long, default_value = "")]
        label: String,
        /// libxpreempt_shim.so for Lv3 (default: next to this binary).
        #[arg(long)]
        shim: Option<PathBuf>,
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// Lv3 check: progress of this process against a busy BE process, with its own timeslice at
    /// default, minimum, default (needs LD_PRELOAD=libxpreempt_shim.so).
    Lv3Probe {
        #[arg(long, default_value_t = 200)]
        window_ms: u64,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// (internal) one side of a two-process scenario.
    #[command(hide = true)]
    Role {
        #[arg(long)]
        role: String,
        #[arg(long)]
        spec: String,
        #[arg(long)]
        ctl: PathBuf,
    },
}

pub fn run(out: &Output, args: &Args) -> Result<()> {
    match &args.what {
        What::Info => info(out, args.device),
        What::Latency {
            trials,
            out: o,
            svg: s,
            blocks,
            kernels,
        } => latency_sweep(
            out,
            args.device,
            *trials,
            o.as_deref(),
            s.as_deref(),
            blocks,
            kernels,
        ),
        What::Lcbe {
            scenarios,
            block_us,
            kernel_us,
            persistent,
            secs,
            label,
            shim,
            out: o,
            svg: s,
        } => {
            let p = LcbeParams {
                device: args.device,
                block_us: *block_us,
                kernel_us: *kernel_us,
                persistent: *persistent,
                secs: *secs,
                label: label.clone(),
                shim: shim.clone(),
            };
            lcbe(out, &p, scenarios, o.as_deref(), s.as_deref())
        }
        What::Role { role, spec, ctl } => child_role(args.device, role, spec, ctl),
        What::Lv3Probe { window_ms, out: o } => {
            lv3_probe(out, args.device, *window_ms, o.as_deref())
        }
    }
}

fn env(device: i32) -> Result<Env> {
    if !xpreempt_cuda::driver_present() {
        bail!("no CUDA driver on this machine (libcuda not found): `xpreempt bench` needs a GPU");
    }
    Env::new(device).context("opening the CUDA device and building the benchmark kernels")
}

#[derive(Serialize)]
struct Info {
    device: String,
    sm_count: i32,
    driver_version: i32,
    kernel_module: Option<String>,
    sharing: xpreempt_cuda::mps::Sharing,
    stream_priorities: (i32, i32),
    iters_per_us_full: f64,
    iters_per_us_light: f64,
    lv3: String,
}

fn info(out: &Output, device: i32) -> Result<()> {
    let e = env(device)?;
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok();
    let i = Info {
        device: e.device.name.clone(),
        sm_count: e.device.sm_count,
        driver_version: xpreempt_cuda::driver::driver_version()?,
        kernel_module: text
            .as_deref()
            .and_then(xpreempt_cuda::timeslice::parse_driver_version),
        sharing: xpreempt_cuda::mps::detect(&e.device),
        stream_priorities: e.device.stream_priority_range()?,
        iters_per_us_full: e.iters_per_us_full,
        iters_per_us_light: e.iters_per_us_light,
        lv3: match xpreempt_cuda::timeslice::Timeslice::probe() {
            Ok(t) => format!("available ({} channel groups)", t.channel_groups()),
            Err(err) => format!("unavailable: {err}"),
        },
    };
    out.emit(&i, || {
        format!("{}\n", serde_json::to_string_pretty(&i).unwrap_or_default())
    })
}

fn parse_list(s: &str) -> Result<Vec<f64>> {
    s.split(',')
        .map(|x| x.trim().parse::<f64>().context("bad number in list"))
        .collect()
}

fn latency_sweep(
    out: &Output,
    device: i32,
    trials: usize,
    o: Option<&Path>,
    s: Option<&Path>,
    blocks: &str,
    kernels: &str,
) -> Result<()> {
    let e = env(device)?;
    let mut points = Vec::new();
    for &b in &parse_list(blocks)? {
        for &k in parse_list(kernels)?.iter().filter(|&&k| k >= b) {
            let variants = [
                (None, false),
                (Some(Level::Lv1), false),
                (Some(Level::Lv2), false),
                (None, true),
                (Some(Level::Lv2), true),
            ];
            for (level, prio) in variants {
                match latency::measure(&e, level, prio, b, k, trials) {
                    Ok(p) => {
                        eprintln!(
                            "latency {:>6} block {b:>5} us kernel {k:>6} us: probe p50 {:.1} p99 {:.1} us",
                            p.level, p.probe_us.p50, p.probe_us.p99
                        );
                        points.push(p)
                    }
                    Err(err) => {
                        eprintln!("latency {level:?} prio {prio} block {b} kernel {k}: {err}")
                    }
                }
            }
        }
    }
    if let Some(path) = o {
        std::fs::write(path, serde_json::to_string_pretty(&points)?)?;
    }
    if let Some(path) = s {
        let rows: Vec<(String, f64, String)> = points
            .iter()
            .map(|p| {
                (
                    format!("{} blk {}us krn {}us", p.level, p.block_us, p.kernel_us),
                    p.probe_us.p99,
                    format!("(p50 {:.0})", p.probe_us.p50),
                )
            })
            .collect();
        std::fs::write(
            path,
            svg::bar_chart(
                "Preemption latency: suspend -> probe done, p99",
                "us",
                &rows,
                true,
            ),
        )?;
    }
    out.emit(&points, || {
        let mut t = String::from("level   block_us kernel_us  probe_p50  probe_p99  settle_p50\n");
        for p in &points {
            t += &format!(
                "{:<7} {:>8} {:>9} {:>10.1} {:>10.1} {:>10}\n",
                p.level,
                p.block_us,
                p.kernel_us,
                p.probe_us.p50,
                p.probe_us.p99,
                p.settle_us
                    .as_ref()
                    .map_or("-".into(), |s| format!("{:.1}", s.p50))
            );
        }
        t
    })
}

struct LcbeParams {
    device: i32,
    block_us: f64,
    kernel_us: f64,
    persistent: bool,
    secs: f64,
    label: String,
    shim: Option<PathBuf>,
}

#[derive(Serialize, Default)]
struct ScenarioResult {
    scenario: String,
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

fn be_spec(p: &LcbeParams, level: Option<Level>, prio: i32, guarded: bool) -> BeSpec {
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

fn ctl_path(tag: &str) -> PathBuf {
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
                    // BE alone: measure over the same window as an LC run would.
                    let t = std::time::Instant::now();
                    while ctl.be_ready.load(std::sync::atomic::Ordering::Acquire) == 0
                        && t.elapsed() < Duration::from_secs(30)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    ctl.phase.store(1, std::sync::atomic::Ordering::Release);
                    std::thread::sleep(Duration::from_secs_f64(p.secs));
                    ctl.phase.store(2, std::sync::atomic::Ordering::Release);
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
            let (l, b) = xpreempt_cuda::bench::sched::run_sched_pair(e, &be, &lc, "hpf")?;
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

fn lv3_probe(out: &Output, device: i32, window_ms: u64, o: Option<&Path>) -> Result<()> {
    let e = env(device)?;
    let path = ctl_path("lv3probe");
    let ctl = SharedControl::open(&path, true)?;
    let p = LcbeParams {
        device,
        block_us: 20.0,
        kernel_us: 1000.0,
        persistent: false,
        secs: 30.0,
        label: String::new(),
        shim: None,
    };
    let be = be_spec(&p, None, 0, false);
    let exe = std::env::current_exe()?;
    let child = Proc::new(&exe)
        .args([
            "bench",
            "--device",
            &device.to_string(),
            "role",
            "--role",
            "be",
            "--spec",
            &serde_json::to_string(&be)?,
            "--ctl",
        ])
        .arg(&path)
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .spawn()?;
    let t = std::time::Instant::now();
    while ctl.be_ready.load(std::sync::atomic::Ordering::Acquire) == 0
        && t.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(200));
    ctl.phase.store(1, std::sync::atomic::Ordering::Release);
    let r = xpreempt_cuda::bench::lv3probe::probe(&e, window_ms);
    ctl.phase.store(2, std::sync::atomic::Ordering::Release);
    let _ = child.wait_with_output();
    let _ = std::fs::remove_file(&path);
    let r = r?;
    if let Some(path) = o {
        std::fs::write(path, serde_json::to_string_pretty(&r)?)?;
    }
    out.emit(&r, || {
        let mut t = format!(
            "driver {} channel groups {}\ntimeslice_us  set_call_us  rate/ms  longest_stall_ms\n",
            r.driver, r.channel_groups
        );
        for w in &r.windows {
            t += &format!(
                "{:>12} {:>12.0} {:>8.1} {:>17.2}\n",
                w.timeslice_us, w.set_call_us, w.rate_per_ms, w.longest_stall_ms
            );
        }
        t
    })
}

fn child_role(device: i32, role: &str, spec: &str, ctl: &Path) -> Result<()> {
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

fn lcbe(
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
            "scenario              LC p50    LC p99  p99/alone  BE/alone  suspends  error\n",
        );
        for r in &results {
            t += &format!(
                "{:<20} {:>8} {:>9} {:>10} {:>9} {:>9}  {}\n",
                r.scenario,
                r.lc.as_ref()
                    .map_or("-".into(), |l| format!("{:.1}", l.latency_us.p50)),
                r.lc.as_ref()
                    .map_or("-".into(), |l| format!("{:.1}", l.latency_us.p99)),
                r.lc_p99_norm.map_or("-".into(), |v| format!("{v:.2}")),
                r.be_norm.map_or("-".into(), |v| format!("{v:.3}")),
                r.be.as_ref().map_or("-".into(), |b| b.suspends.to_string()),
                r.error.as_deref().unwrap_or("")
            );
        }
        t
    })
}
