//! `xpreempt sim [SCENARIO]`: the AMD queue-hardware model under five modes side by side.
//! A mode that fails its checks (not exactly-once, gave up, a task left without a result)
//! is listed with its problems and makes the exit status 3.

use crate::output::{ChecksFailed, Output};
use anyhow::{Context, Result};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use xpreempt_sim::report::{self, SimOptions};
use xpreempt_sim::runner::{self, Mode, RunOptions};
use xpreempt_sim::scenario::Scenario;
use xpreempt_sim::sweep;

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 when every mode ran every kernel exactly once and every \
task completed all its requests; 3 when the simulation ran but a mode failed those checks (its \
problems are listed under the table and in the JSON); 1 for any other error."
)]
pub struct Args {
    /// Scenario file (TOML); the built-in train-vs-infer scenario when omitted.
    scenario: Option<PathBuf>,
    /// Write Chrome/Perfetto trace events of every mode to this file (created before the
    /// simulation starts, so that a path that cannot be written fails at once).
    #[arg(long, conflicts_with = "bench")]
    trace: Option<PathBuf>,
    /// Write an SVG plot of the highest-priority tier's latency CDF, one line per mode
    /// (created before the simulation starts, like --trace).
    #[arg(long, value_name = "FILE", conflicts_with = "bench")]
    svg: Option<PathBuf>,
    /// Write an SVG timeline of every mode: a row per task showing when its kernels ran, with
    /// request arrivals and preempt/resume decisions (created before the simulation starts).
    #[arg(long, value_name = "FILE", conflicts_with = "bench")]
    timeline_svg: Option<PathBuf>,
    /// Scheme B policy instead of the scenario's (hpf, fifo, rr, bandwidth, edf, lcbe), or an
    /// eBPF object (FILE.o) whose programs run at the scheduler's hooks in lv1/lv2/lv3, with the
    /// contents of the maps pinned by `xpreempt policy`.
    #[arg(long, conflicts_with = "bench")]
    policy: Option<String>,
    /// With an eBPF --policy: the policy that decides which queues run (default: the
    /// scenario's). An error without an eBPF --policy.
    #[arg(long, conflicts_with = "bench")]
    base_policy: Option<String>,
    /// With an eBPF --policy: the state directory whose pinned maps configure it
    /// [default: $XPREEMPT_STATE_DIR, else the per-user default of `xpreempt policy`].
    #[arg(long, requires = "policy", conflicts_with = "bench")]
    state_dir: Option<std::path::PathBuf>,
    /// Override the scenario's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Run every mode over N seeds (the scenario's or --seed, then +1, ...) and report the
    /// spread of the top tier's p99 over standalone and of the makespan.
    #[arg(long, value_name = "N", conflicts_with_all = ["bench", "trace", "svg", "timeline_svg"],
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    seeds: Option<u64>,
    /// The modes to run, comma-separated (none, lv1, scheme-a, lv2, lv3); all when omitted.
    #[arg(long, value_delimiter = ',')]
    modes: Vec<Mode>,
    /// Measure simulated workgroups per second instead of printing the comparison.
    #[arg(long)]
    bench: bool,
}

fn load(args: &Args) -> Result<Scenario> {
    let mut s = match &args.scenario {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading scenario {}", p.display()))?;
            Scenario::parse(&text).with_context(|| format!("scenario {}", p.display()))?
        }
        None => Scenario::default_scenario().context("built-in scenario")?,
    };
    if let Some(seed) = args.seed {
        s.seed = seed;
        s.gpu.seed = seed;
    }
    Ok(s)
}

/// Every choice the arguments make, checked before any simulation: a typo must not cost a
/// full run, nor be silently ignored.
fn options(args: &Args) -> Result<SimOptions> {
    let named = |what: &str, p: &str| {
        xpreempt_core::policy::by_name(p)
            .map(drop)
            .with_context(|| format!("{what} {p}"))
    };
    // The timeline is drawn from the traces.
    let trace = args.trace.is_some() || args.timeline_svg.is_some();
    match args.policy.as_deref() {
        Some(p) if crate::policy::is_object(p) => {
            if let Some(base) = &args.base_policy {
                named("--base-policy", base)?;
            }
            Ok(SimOptions {
                trace,
                policy: args.base_policy.clone(),
                hooks: Some(crate::policy::sim_hooks(p, args.state_dir.as_deref())?),
            })
        }
        policy => {
            if args.base_policy.is_some() {
                anyhow::bail!(
                    "--base-policy only applies with an eBPF --policy FILE.o (it picks the \
                     policy under the eBPF hooks); for a built-in policy use --policy NAME"
                );
            }
            if let Some(p) = policy {
                named("--policy", p)?;
            }
            Ok(SimOptions {
                trace,
                policy: policy.map(str::to_string),
                hooks: None,
            })
        }
    }
}

pub fn run(out: &Output, args: &Args) -> Result<()> {
    let scenario = load(args)?;
    let modes: &[Mode] = if args.modes.is_empty() {
        &Mode::ALL
    } else {
        &args.modes
    };
    if args.bench {
        return bench(out, &scenario, modes);
    }
    let opts = options(args)?;
    if let Some(n) = args.seeds {
        let rep = sweep::sweep(&scenario, modes, scenario.seed, n, &opts)?;
        out.emit(&rep, || sweep::table(&rep))?;
        return checks_passed(&rep.scenario, rep.failures());
    }
    let files = OutFiles::create(&[
        ("trace", args.trace.as_ref()),
        ("SVG", args.svg.as_ref()),
        ("timeline SVG", args.timeline_svg.as_ref()),
    ])?;
    let (rep, runs) = match report::simulate(&scenario, modes, &opts) {
        Ok(r) => r,
        Err(e) => {
            files.discard();
            return Err(e.into());
        }
    };
    let [trace, svg, timeline] = files.0;
    if let Some((path, file)) = trace {
        let mut events = Vec::new();
        for (pid, r) in runs.iter().enumerate() {
            if let Some(t) = &r.trace {
                events.extend(t.to_events(pid as u32 + 1, r.mode.name()));
            }
        }
        let doc = xpreempt_amd::trace::document(events);
        serde_json::to_writer(std::io::BufWriter::new(file), &doc)
            .with_context(|| format!("writing trace {}", path.display()))?;
    }
    if let Some((path, mut file)) = svg {
        file.write_all(xpreempt_sim::svg::cdf(&scenario, &rep, &runs).as_bytes())
            .with_context(|| format!("writing SVG {}", path.display()))?;
    }
    if let Some((path, mut file)) = timeline {
        file.write_all(xpreempt_sim::svg::timeline(&scenario, &runs).as_bytes())
            .with_context(|| format!("writing timeline SVG {}", path.display()))?;
    }
    out.emit(&rep, || report::table(&rep) + &report::monitor_lines(&runs))?;
    checks_passed(&rep.scenario, rep.failures())
}

/// The output files, created before the simulation so that a path that cannot be written fails
/// at once rather than after minutes of simulating.
struct OutFiles([Option<(PathBuf, std::fs::File)>; 3]);

impl OutFiles {
    fn create(paths: &[(&str, Option<&PathBuf>); 3]) -> Result<Self> {
        let mut files = Self([None, None, None]);
        for (slot, (what, path)) in files.0.iter_mut().zip(paths) {
            if let Some(path) = path {
                match std::fs::File::create(path) {
                    Ok(f) => *slot = Some((path.to_path_buf(), f)),
                    Err(e) => {
                        files.discard();
                        return Err(anyhow::Error::new(e)
                            .context(format!("creating {what} file {}", path.display())));
                    }
                }
            }
        }
        Ok(files)
    }

    /// Removes the files: created only to check the paths, an empty file would pass for output.
    fn discard(self) {
        for (path, _) in self.0.into_iter().flatten() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A run that gave up, ran a kernel twice or left a task without a result is a failure,
/// printed in the table or JSON above and in the exit status, never only in a log line.
fn checks_passed(scenario: &str, failures: Vec<String>) -> Result<()> {
    let Some(first) = failures.first() else {
        return Ok(());
    };
    let more = match failures.len() - 1 {
        0 => String::new(),
        n => format!(" (and {n} more problems, listed above)"),
    };
    Err(ChecksFailed {
        summary: format!("scenario {scenario}: {first}{more}"),
    }
    .into())
}

#[derive(Serialize)]
struct BenchRow {
    mode: &'static str,
    workgroups: u64,
    wall_ms: f64,
    workgroups_per_s: f64,
}

#[derive(Serialize)]
struct Bench {
    scenario: String,
    modes: Vec<BenchRow>,
    total_workgroups_per_s: f64,
}

fn bench(out: &Output, scenario: &Scenario, modes: &[Mode]) -> Result<()> {
    let mut rows = Vec::new();
    let (mut wgs, mut wall) = (0u64, 0f64);
    for &mode in modes {
        let t0 = Instant::now();
        let r = runner::run(scenario, mode, RunOptions::default())?;
        let secs = t0.elapsed().as_secs_f64();
        // Completed workgroups: a CWSR-restored one is counted once, not at each dispatch.
        let done = r.stats.wgs_completed;
        wgs += done;
        wall += secs;
        rows.push(BenchRow {
            mode: mode.name(),
            workgroups: done,
            wall_ms: (secs * 1e4).round() / 10.0,
            workgroups_per_s: (done as f64 / secs).round(),
        });
    }
    let b = Bench {
        scenario: scenario.name.clone(),
        modes: rows,
        total_workgroups_per_s: (wgs as f64 / wall).round(),
    };
    out.emit(&b, || {
        let mut s = format!("benchmark: {} (one core)\n", b.scenario);
        s += &format!(
            "{:<9} {:>12} {:>10} {:>14}\n",
            "mode", "workgroups", "wall ms", "workgroups/s"
        );
        for r in &b.modes {
            s += &format!(
                "{:<9} {:>12} {:>10.1} {:>14.0}\n",
                r.mode, r.workgroups, r.wall_ms, r.workgroups_per_s
            );
        }
        s += &format!("total: {:.0} workgroups/s\n", b.total_workgroups_per_s);
        s
    })
}
