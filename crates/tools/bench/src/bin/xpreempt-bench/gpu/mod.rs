//! The GPU benchmarks of `xpreempt-bench`: measurements on a real GPU (CUDA backend).
//! Two-process scenarios re-run this binary as a child with `role`.

mod lcbe;
mod procs;
mod scenarios;

use crate::output::Output;
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use lcbe::{CtlFile, child_role};
use procs::Kid;
use scenarios::{LcbeParams, be_spec};
use serde::Serialize;
use std::path::{Path, PathBuf};
use xpreempt_bench::{Env, latency, svg};
use xpreempt_core::Level;

#[derive(Subcommand)]
pub enum What {
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
        /// Comma-separated scenario names: lc-alone, lc-alone-xq, lc-alone-daemon, be-alone,
        /// be-alone-xp, native-2proc, prio-1proc, xp-lv1-1proc, xp-lv2-1proc, xp-lv2-1proc-xq
        /// (`-xq`: the LC through an XQueue nobody schedules), xp-sched-lv2-1proc,
        /// xp-daemon-2proc, xp-lv3-2proc, xp-lv3static-2proc, mps-default, mps-prio,
        /// mps-client-prio, xp-mps-2proc, xp-daemon-mps-2proc (the last under an MPS daemon).
        /// Each result's `path` says what it measures: "scheduler" (xpreempt's scheduler in this
        /// process), "scheduler (xpreemptd)" (two processes whose agents register with a private
        /// daemon this command starts: `xpreemptd`'s code), "mechanism (bench-only controller)" (the
        /// preemption mechanism driven by the benchmark's shared control word, bypassing the
        /// scheduler) or "baseline". Exits 3 after printing when any scenario failed.
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
        /// Directory for each side's timestamps on one clock (LC request start and end, the BE
        /// queue's stops, restarts and settles), for `bench/lcbe-marks.py`.
        #[arg(long)]
        marks: Option<PathBuf>,
        /// Keep each LC request's latency (µs, in the order made) in the JSON (`lc.samples_us`),
        /// to pool runs or draw distributions; unlike `--marks`, it adds nothing to a request.
        #[arg(long)]
        samples: bool,
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
        /// The parent's kernel calibration (FULL,LIGHT); measured here if absent.
        #[arg(long)]
        calibration: Option<xpreempt_bench::Calibration>,
    },
}

pub fn run(out: &Output, device: i32, what: &What) -> Result<()> {
    match what {
        What::Info => info(out, device),
        What::Latency {
            trials,
            out: o,
            svg: s,
            blocks,
            kernels,
        } => latency_sweep(
            out,
            device,
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
            marks,
            samples,
        } => {
            if let Some(dir) = marks {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating --marks {}", dir.display()))?;
            }
            let p = LcbeParams {
                device,
                block_us: *block_us,
                kernel_us: *kernel_us,
                persistent: *persistent,
                secs: *secs,
                label: label.clone(),
                shim: shim.clone(),
                marks: marks.clone(),
                samples: *samples,
            };
            lcbe::lcbe(out, &p, scenarios, o.as_deref(), s.as_deref())
        }
        What::Role {
            role,
            spec,
            ctl,
            calibration,
        } => child_role(device, role, spec, ctl, *calibration),
        What::Lv3Probe { window_ms, out: o } => lv3_probe(out, device, *window_ms, o.as_deref()),
    }
}

fn env(device: i32) -> Result<Env> {
    env_with(device, None)
}

/// The device with the benchmark kernels, calibrated as given or now.
fn env_with(device: i32, calibration: Option<xpreempt_bench::Calibration>) -> Result<Env> {
    if !xpreempt_cuda::driver_present() {
        bail!(
            "no CUDA driver on this machine (libcuda not found): `xpreempt-bench` needs a GPU for it"
        );
    }
    Env::open(device, calibration)
        .context("opening the CUDA device and building the benchmark kernels")
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
    let i = Info {
        device: e.device.name.clone(),
        sm_count: e.device.sm_count,
        driver_version: xpreempt_cuda::driver::driver_version()?,
        kernel_module: xpreempt_cuda::nvidia::loaded_kernel_module_version(),
        sharing: xpreempt_cuda::mps::detect(&e.device),
        stream_priorities: e.device.stream_priority_range()?,
        iters_per_us_full: e.iters_per_us_full,
        iters_per_us_light: e.iters_per_us_light,
        lv3: match xpreempt_bench::timeslice::Timeslice::probe() {
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
    // `--out` keeps the bare list; stdout is one object, as every `--json` output.
    out.emit(&serde_json::json!({ "points": points }), || {
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

fn lv3_probe(out: &Output, device: i32, window_ms: u64, o: Option<&Path>) -> Result<()> {
    let e = env(device)?;
    let ctl = CtlFile::create("lv3probe")?;
    let p = LcbeParams {
        device,
        block_us: 20.0,
        kernel_us: 1000.0,
        persistent: false,
        secs: 30.0,
        label: String::new(),
        shim: None,
        marks: None,
        samples: false,
    };
    let be = be_spec(&p, None, 0, false);
    // The BE process runs without the shim (Kid::role drops LD_PRELOAD): only this one changes
    // its timeslice.
    let be = Kid::role(
        "BE",
        device,
        e.calibration(),
        serde_json::to_string(&be)?,
        ctl.path(),
        &[],
    )?;
    let r = ctl.window(|| xpreempt_bench::lv3probe::probe(&e, window_ms));
    let be_r = be.result::<xpreempt_bench::roles::BeResult>();
    let r = r??;
    be_r?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        what: What,
    }

    fn role(extra: &[&str]) -> Result<Option<xpreempt_bench::Calibration>, clap::Error> {
        let base = [
            "xpreempt-bench",
            "role",
            "--role",
            "be",
            "--spec",
            "{}",
            "--ctl",
            "/c",
        ];
        let cli = Cli::try_parse_from(base.iter().chain(extra))?;
        match cli.what {
            What::Role { calibration, .. } => Ok(calibration),
            _ => panic!("not a role"),
        }
    }

    #[test]
    fn a_side_takes_the_parents_calibration_or_measures_its_own() {
        let c = xpreempt_bench::Calibration {
            full: 41.5,
            light: 97.25,
        };
        let given = c.to_string();
        assert_eq!(role(&["--calibration", &given]).ok(), Some(Some(c)));
        assert_eq!(role(&[]).ok(), Some(None));
        assert!(role(&["--calibration", "0,1"]).is_err());
    }
}
