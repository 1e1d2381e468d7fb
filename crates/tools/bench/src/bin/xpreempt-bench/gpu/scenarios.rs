//! The LC/BE scenarios of `xpreempt-bench lcbe`: what each one runs (a [`Plan`]), which path it
//! measures, and the checks on the command line made before any GPU work.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use xpreempt_bench::roles::{BeSpec, LcSpec};
use xpreempt_core::Level;
use xpreempt_cuda::mps::Sharing;

/// Every scenario, in the order `--help` lists them.
pub(super) const SCENARIOS: [&str; 19] = [
    "lc-alone",
    "lc-alone-xq",
    "lc-alone-daemon",
    "be-alone",
    "be-alone-xp",
    "native-2proc",
    "prio-1proc",
    "xp-lv1-1proc",
    "xp-lv2-1proc",
    "xp-lv2-1proc-xq",
    "xp-sched-lv2-1proc",
    "xp-daemon-2proc",
    "xp-lv3-2proc",
    "xp-lv3static-2proc",
    "mps-default",
    "mps-prio",
    "mps-client-prio",
    "xp-mps-2proc",
    "xp-daemon-mps-2proc",
];

pub(super) struct LcbeParams {
    pub(super) device: i32,
    pub(super) block_us: f64,
    pub(super) kernel_us: f64,
    pub(super) persistent: bool,
    pub(super) secs: f64,
    pub(super) label: String,
    pub(super) shim: Option<PathBuf>,
    /// Each side writes its marks here as `<scenario>-lc.json` / `<scenario>-be.json`.
    pub(super) marks: Option<PathBuf>,
    /// Each scenario's result keeps its LC requests' latencies.
    pub(super) samples: bool,
}

impl LcbeParams {
    /// The measuring window (valid once `validate` passed).
    pub(super) fn window(&self) -> Duration {
        Duration::try_from_secs_f64(self.secs).unwrap_or_default()
    }

    /// The numbers every scenario relies on (checked before the GPU is opened).
    pub(super) fn validate(&self) -> Result<()> {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.secs) {
            bail!(
                "--secs must be a positive number of seconds, not {}",
                self.secs
            );
        }
        // The BE side runs up to 30 s longer than the window (its start and drain).
        xpreempt_bench::run_length(self.secs + 30.0).context("--secs")?;
        if !positive(self.block_us) || !positive(self.kernel_us) {
            bail!(
                "--block-us ({}) and --kernel-us ({}) must be positive",
                self.block_us,
                self.kernel_us
            );
        }
        if self.kernel_us < self.block_us {
            bail!(
                "--kernel-us ({}) is shorter than a block (--block-us {})",
                self.kernel_us,
                self.block_us
            );
        }
        Ok(())
    }
}

/// The comma-separated `--scenarios`, each checked: an unknown name fails the whole command
/// before anything runs, rather than after minutes of the others.
pub(super) fn parse_scenarios(p: &LcbeParams, list: &str) -> Result<Vec<String>> {
    p.validate()?;
    let names: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    if names.is_empty() {
        bail!("--scenarios is empty; known: {}", known());
    }
    for n in &names {
        plan(p, n, 0, 0)?;
    }
    Ok(names)
}

fn known() -> String {
    SCENARIOS.join(", ")
}

/// How a scenario's BE side is preempted, so that results are read for what they measure.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ScenarioPath {
    /// Through xpreempt's scheduler in this process (LocalScheduler, a policy, the XQueue
    /// protocol).
    #[serde(rename = "scheduler")]
    Scheduler,
    /// Through the global-mode daemon: each side's agent registers its queue with a separate
    /// daemon (`xpreemptd`'s code), which decides (the product's path across processes).
    #[serde(rename = "scheduler (xpreemptd)")]
    Daemon,
    /// The preemption mechanism driven by the benchmark's own shared-word controller (or a
    /// timeslice set directly), bypassing the scheduler.
    #[serde(rename = "mechanism (bench-only controller)")]
    Mechanism,
    /// No xpreempt preemption: native streams, stream priorities, MPS, or a side alone.
    #[serde(rename = "baseline")]
    Baseline,
}

impl ScenarioPath {
    pub(super) fn label(self) -> &'static str {
        match self {
            ScenarioPath::Scheduler => "scheduler",
            ScenarioPath::Daemon => "scheduler (xpreemptd)",
            ScenarioPath::Mechanism => "mechanism (bench-only controller)",
            ScenarioPath::Baseline => "baseline",
        }
    }
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
        marks: None,
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
        unscheduled_queue: false,
        marks: None,
        samples: p.samples,
    }
}

/// The LC side through an XQueue of its process that nobody schedules: with its plain-stream
/// twin, it separates the queue's cost from the scheduler's in `xp-sched-lv2-1proc`.
fn through_queue(mut lc: LcSpec) -> LcSpec {
    lc.unscheduled_queue = true;
    lc
}

pub(super) enum Plan {
    OneProc(Option<BeSpec>, Option<LcSpec>),
    /// One process, both queues under the local-mode scheduler.
    Sched(BeSpec, LcSpec),
    TwoProc {
        be: BeSpec,
        lc: LcSpec,
        be_env: Vec<(String, String)>,
        preload: bool,
    },
    /// A private daemon (`xpreemptd`'s code), and each side in its own process with its queue registered
    /// through the agent (the specs get the socket when the daemon is up).
    Daemon {
        be: Option<BeSpec>,
        lc: LcSpec,
        /// The sharing mode the scenario's name promises; another one is an error.
        sharing: Option<Sharing>,
    },
}

impl Plan {
    /// Points each side's marks at `dir`, named after the scenario.
    fn mark_into(&mut self, dir: &Path, name: &str) {
        let file = |side: &str| Some(dir.join(format!("{name}-{side}.json")));
        let (be, lc) = match self {
            Plan::OneProc(be, lc) => (be.as_mut(), lc.as_mut()),
            Plan::Sched(be, lc) => (Some(be), Some(lc)),
            Plan::TwoProc { be, lc, .. } => (Some(be), Some(lc)),
            Plan::Daemon { be, lc, .. } => (be.as_mut(), Some(lc)),
        };
        if let Some(be) = be {
            be.marks = file("be");
        }
        if let Some(lc) = lc {
            lc.marks = file("lc");
        }
    }
}

pub(super) fn plan(p: &LcbeParams, name: &str, greatest: i32, least: i32) -> Result<Plan> {
    let mut plan = scenario(p, name, greatest, least)?;
    if let Some(dir) = &p.marks {
        plan.mark_into(dir, name);
    }
    Ok(plan)
}

fn scenario(p: &LcbeParams, name: &str, greatest: i32, least: i32) -> Result<Plan> {
    let mut lc_alone = lc_spec(p, greatest, false);
    lc_alone.alone = true;
    let daemon_pair = |be_prio: i32, lc_prio: i32, sharing: Sharing| Plan::Daemon {
        be: Some(be_spec(p, Some(Level::Lv2), be_prio, true)),
        lc: lc_spec(p, lc_prio, false),
        sharing: Some(sharing),
    };
    Ok(match name {
        "lc-alone-xq" => Plan::OneProc(None, Some(through_queue(lc_alone))),
        "lc-alone" => Plan::OneProc(None, Some(lc_alone)),
        "lc-alone-daemon" => Plan::Daemon {
            be: None,
            lc: lc_alone,
            sharing: None,
        },
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
        "xp-lv2-1proc-xq" => Plan::OneProc(
            Some(be_spec(p, Some(Level::Lv2), least, true)),
            Some(through_queue(lc_spec(p, greatest, true))),
        ),
        "xp-sched-lv2-1proc" => Plan::Sched(
            be_spec(p, Some(Level::Lv2), least, true),
            lc_spec(p, greatest, false),
        ),
        // Contexts of two processes are time-sliced: stream priorities do not reach across
        // them, so both stay at 0 (as in native-2proc and xp-lv3-2proc).
        "xp-daemon-2proc" => daemon_pair(0, 0, Sharing::TimeSliced),
        // Under MPS they do: the same priorities as xp-mps-2proc.
        "xp-daemon-mps-2proc" => daemon_pair(least, greatest, Sharing::MpsClient),
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
        other => bail!("unknown scenario `{other}`; known: {}", known()),
    })
}

/// Read off what the plan does rather than kept as a second list of names: the LC side signals
/// the shared control word, or a timeslice is set directly, only in mechanism scenarios.
pub(super) fn path_of(plan: &Plan) -> ScenarioPath {
    let mechanism = |be: Option<&BeSpec>, lc: Option<&LcSpec>| {
        lc.is_some_and(|l| l.signal || l.timeslice_us.is_some())
            || be.is_some_and(|b| b.static_timeslice_us.is_some())
    };
    match plan {
        Plan::Sched(..) => ScenarioPath::Scheduler,
        Plan::Daemon { .. } => ScenarioPath::Daemon,
        Plan::OneProc(be, lc) if mechanism(be.as_ref(), lc.as_ref()) => ScenarioPath::Mechanism,
        Plan::TwoProc { be, lc, .. } if mechanism(Some(be), Some(lc)) => ScenarioPath::Mechanism,
        Plan::OneProc(..) | Plan::TwoProc { .. } => ScenarioPath::Baseline,
    }
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
            marks: None,
            samples: false,
        }
    }

    #[test]
    fn every_scenario_says_which_path_it_measures() {
        use ScenarioPath::*;
        let expected = [
            ("lc-alone", Baseline),
            ("lc-alone-xq", Baseline),
            ("be-alone", Baseline),
            ("be-alone-xp", Baseline),
            ("native-2proc", Baseline),
            ("prio-1proc", Baseline),
            ("mps-default", Baseline),
            ("mps-prio", Baseline),
            ("mps-client-prio", Baseline),
            ("xp-lv1-1proc", Mechanism),
            ("xp-lv2-1proc", Mechanism),
            ("xp-lv2-1proc-xq", Mechanism),
            ("xp-mps-2proc", Mechanism),
            ("xp-lv3-2proc", Mechanism),
            ("xp-lv3static-2proc", Mechanism),
            ("xp-sched-lv2-1proc", Scheduler),
            ("lc-alone-daemon", Daemon),
            ("xp-daemon-2proc", Daemon),
            ("xp-daemon-mps-2proc", Daemon),
        ];
        for (name, path) in expected {
            let plan = plan(&params(), name, -5, 0).expect("known scenario");
            assert_eq!(path_of(&plan), path, "{name}");
        }
        // The table above covers the whole list.
        for name in SCENARIOS {
            assert!(expected.iter().any(|(n, _)| *n == name), "{name}");
        }
        let err = plan(&params(), "nope", -5, 0)
            .map(|_| ())
            .expect_err("unknown");
        assert!(format!("{err}").contains("xp-daemon-2proc"), "{err}");
        assert_eq!(
            serde_json::to_string(&Mechanism).expect("json"),
            "\"mechanism (bench-only controller)\""
        );
        assert_eq!(
            serde_json::to_string(&Daemon).expect("json"),
            "\"scheduler (xpreemptd)\""
        );
        for p in [Scheduler, Daemon, Mechanism, Baseline] {
            assert_eq!(
                serde_json::to_string(&p).expect("json"),
                format!("\"{}\"", p.label())
            );
        }
    }

    #[test]
    fn daemon_scenarios_put_lc_above_be_and_name_their_sharing_mode() {
        let (greatest, least) = (-5, 0);
        let check = |name: &str, be_prio: i32, lc_prio: i32, sharing: Sharing| {
            let Ok(Plan::Daemon {
                be: Some(be),
                lc,
                sharing: s,
            }) = plan(&params(), name, greatest, least)
            else {
                panic!("{name}: not a daemon pair");
            };
            // Lv2 guard: the daemon's suspension stops the BE kernels at the next block.
            assert_eq!((be.level, be.guarded), (Some(Level::Lv2), true), "{name}");
            assert_eq!((be.stream_priority, lc.stream_priority), (be_prio, lc_prio));
            // The daemon decides: the LC side never drives the benchmark's controller.
            assert!(
                !lc.signal && lc.timeslice_us.is_none() && !lc.alone,
                "{name}"
            );
            assert_eq!(s, Some(sharing), "{name}");
        };
        check("xp-daemon-2proc", 0, 0, Sharing::TimeSliced);
        check("xp-daemon-mps-2proc", least, greatest, Sharing::MpsClient);
        let Ok(Plan::Daemon {
            be: None,
            lc,
            sharing: None,
        }) = plan(&params(), "lc-alone-daemon", greatest, least)
        else {
            panic!("lc-alone-daemon: LC alone through the daemon");
        };
        let Ok(Plan::OneProc(None, Some(native))) = plan(&params(), "lc-alone", greatest, least)
        else {
            panic!("lc-alone");
        };
        // Compared with each other: the same requests at the same stream priority.
        assert_eq!(
            serde_json::to_string(&lc).expect("json"),
            serde_json::to_string(&native).expect("json")
        );
    }

    #[test]
    fn bad_arguments_fail_before_anything_runs() {
        let p = params();
        assert_eq!(
            parse_scenarios(&p, " lc-alone, xp-daemon-2proc ,").expect("valid"),
            ["lc-alone", "xp-daemon-2proc"]
        );
        assert!(parse_scenarios(&p, " , ").is_err());
        let err = parse_scenarios(&p, "lc-alone,xp-daemon").expect_err("unknown");
        assert!(
            format!("{err}").contains("unknown scenario `xp-daemon`"),
            "{err}"
        );
        for (secs, block_us, kernel_us) in [
            (0.0, 20.0, 1000.0),
            (f64::NAN, 20.0, 1000.0),
            (1.0, 0.0, 1000.0),
            (1.0, 20.0, -1.0),
            (1.0, 20.0, 10.0),
            (1.0, f64::INFINITY, f64::INFINITY),
            (1e300, 20.0, 1000.0),
        ] {
            let p = LcbeParams {
                secs,
                block_us,
                kernel_us,
                ..params()
            };
            assert!(
                parse_scenarios(&p, "lc-alone").is_err(),
                "{secs} {block_us} {kernel_us}"
            );
        }
    }
}
