//! `xpreempt run [--priority N] [--level 1|2|3] [--pass-through] -- CMD…`: runs an unmodified
//! program with xpreempt's shim preloaded, so that its CUDA streams become XQueues scheduled by
//! the daemon (or by the process itself when no daemon answers). The program replaces this
//! process (`exec`), so its exit status and signals are the caller's to see, unchanged.

use anyhow::{Context, Result, bail};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use xpreempt_ipc::operator::Operator;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Logical priority of the program's queues (larger runs first). Over the daemon's MPS,
    /// 0 and below also run at MPS client priority "below normal" unless
    /// $CUDA_MPS_CLIENT_PRIORITY says otherwise.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub priority: i32,
    /// Preemption level: 1 = bounded in-flight window and launch gating, 2 = also block-level
    /// stops of guard-built kernels, 3 = also the process's channel-group timeslice.
    /// [default: 1 when the daemon owns MPS, else 3]
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub level: Option<u8>,
    /// Launches go straight to the driver; xpreempt only observes and preempts with Lv3 (the
    /// process's timeslice), so it takes no --level and no daemon that owns MPS, where the
    /// process has no timeslice of its own.
    #[arg(long)]
    pub pass_through: bool,
    /// Most commands a stream keeps in flight [default: the shim's, by priority].
    #[arg(long)]
    pub window: Option<u32>,
    /// Most GPU time (µs) a stream keeps in flight, at its measured GPU time per command, and
    /// one command more; 0: no bound by time [default: 2000 at priority 0 and below, none
    /// above; none where level 3 sets the process's timeslice].
    #[arg(long, value_name = "US")]
    pub gpu_window_us: Option<u64>,
    /// The daemon's socket [default: $XPREEMPT_SOCKET, else $XDG_RUNTIME_DIR/xpreempt.sock where
    /// it exists, else /run/xpreempt/xpreempt.sock where that exists (a system daemon)].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// libxpreempt_shim.so [default: $XPREEMPT_SHIM, else next to this binary, else in ../lib
    /// beside its folder (the installed layout)].
    #[arg(long, env = "XPREEMPT_SHIM")]
    pub shim: Option<PathBuf>,
    /// Say nothing about the daemon or MPS on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// Whether the program's CUDA calls can be intercepted at all: without a CUDA driver
/// (libcuda.so.1) there are none, and the daemon has nothing to schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Present,
    Missing,
}

impl Driver {
    pub fn probe() -> Self {
        if xpreempt_cuda::driver_present() {
            Self::Present
        } else {
            Self::Missing
        }
    }
}

/// What the program's environment gets.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub env: Vec<(&'static str, OsString)>,
    pub notes: Vec<String>,
}

/// Where the scheduler is, as `run` found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheduler {
    Daemon {
        socket: PathBuf,
        mps_pipe: Option<String>,
    },
    Local {
        socket: PathBuf,
        why: String,
    },
}

/// Connects to the daemon once to learn whether it runs and owns MPS.
pub fn find_scheduler(socket: &Path) -> Scheduler {
    // Bounded like an application's own wait: a stopped daemon must not delay the program.
    let probe = Operator::connect_within(
        socket,
        xpreempt_ipc::msg::Role::Operator,
        "xpreempt run",
        xpreempt_ipc::operator::APPLICATION_TIMEOUT,
    );
    match probe.and_then(|mut o| o.stats()) {
        Ok(stats) => Scheduler::Daemon {
            socket: socket.to_path_buf(),
            mps_pipe: stats.mps_pipe,
        },
        Err(e) => Scheduler::Local {
            socket: socket.to_path_buf(),
            why: format!("{:#}", anyhow::Error::new(e)),
        },
    }
}

pub fn plan(args: &Args, shim: &Path, scheduler: &Scheduler, driver: Driver) -> Result<Plan> {
    let mut env = Vec::new();
    let mut notes = Vec::new();
    if driver == Driver::Missing {
        // Said first and plainly: a note about the daemon alone would read as if the program's
        // work were being scheduled.
        notes.push(
            "nothing will be intercepted: no CUDA driver found (libcuda.so.1 does not load), so \
             the program makes no CUDA calls for xpreempt to schedule; it runs as it would alone"
                .into(),
        );
    }
    let mut preload = OsString::from(shim);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    env.push(("LD_PRELOAD", preload));
    env.push(("XPREEMPT_INTERCEPT", "1".into()));
    env.push(("XPREEMPT_PRIORITY", args.priority.to_string().into()));
    let mps_pipe = match scheduler {
        Scheduler::Daemon { socket, mps_pipe } => {
            env.push(("XPREEMPT_SOCKET", socket.into()));
            if driver == Driver::Present {
                notes.push(format!(
                    "scheduling through the daemon at {}",
                    socket.display()
                ));
            }
            mps_pipe.clone()
        }
        Scheduler::Local { socket, why } => {
            env.push(("XPREEMPT_SOCKET", socket.into()));
            if driver == Driver::Present {
                notes.push(format!(
                    "no daemon ({why}): the program schedules its own queues, and joins a daemon that starts later"
                ));
            }
            None
        }
    };
    if args.pass_through {
        if let Some(l) = args.level.filter(|&l| l < 3) {
            bail!(
                "--pass-through launches every kernel straight to the driver, so only level 3 (the \
                 process's timeslice) can preempt it; --level {l} would do nothing. Leave out \
                 --level, or leave out --pass-through to gate launches (level 1) and stop guarded \
                 kernels (level 2)"
            );
        }
        if let Some(pipe) = &mps_pipe {
            bail!(
                "--pass-through cannot preempt over the daemon's MPS ({pipe}): MPS clients run in \
                 the MPS server's channel groups, so the program has no timeslice of its own (level \
                 3), and pass-through holds nothing back. Leave out --pass-through (launch gating \
                 and stream priorities work over MPS), or run it beside a daemon without --mps"
            );
        }
    }
    let level = match (args.level, &mps_pipe) {
        (Some(l), _) => l,
        (None, Some(_)) => 1,
        (None, None) => 3,
    };
    if let Some(pipe) = &mps_pipe {
        env.push(("CUDA_MPS_PIPE_DIRECTORY", pipe.into()));
        // MPS maps each CUDA stream of a client to a hardware queue only up to this many.
        if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
            env.push(("CUDA_DEVICE_MAX_CONNECTIONS", "32".into()));
        }
        // The hardware's two MPS client priorities, below normal for priority 0 and under, so
        // that the training's closed kernels yield SMs to higher clients' blocks as they retire.
        // It reaches the legacy default stream (PyTorch's), which stream priorities cannot.
        if args.priority <= 0 && std::env::var_os("CUDA_MPS_CLIENT_PRIORITY").is_none() {
            env.push(("CUDA_MPS_CLIENT_PRIORITY", "1".into()));
            notes.push(format!(
                "over the daemon's MPS ({pipe}), at MPS client priority below normal"
            ));
        } else {
            notes.push(format!("over the daemon's MPS ({pipe})"));
        }
        notes.extend(mps_visible_devices_note(
            std::env::var_os("CUDA_VISIBLE_DEVICES").as_deref(),
        ));
    }
    env.push(("XPREEMPT_LEVEL", level.to_string().into()));
    if args.pass_through {
        env.push(("XPREEMPT_PASS_THROUGH", "1".into()));
    }
    if let Some(w) = args.window {
        env.push(("XPREEMPT_WINDOW", w.to_string().into()));
    }
    if let Some(us) = args.gpu_window_us {
        env.push(("XPREEMPT_GPU_WINDOW_US", us.to_string().into()));
    }
    Ok(Plan { env, notes })
}

/// The shim: `--shim`/`$XPREEMPT_SHIM`, else the first of [`shim_candidates`] that exists.
fn shim_path(args: &Args) -> Result<PathBuf> {
    let path = match &args.shim {
        Some(p) => p.clone(),
        None => {
            let exe = std::env::current_exe().context("finding this binary's directory")?;
            let candidates = shim_candidates(&exe);
            match candidates.iter().find(|p| p.is_file()) {
                Some(p) => p.clone(),
                None => bail!(
                    "the shim libxpreempt_shim.so is missing (looked for {}): install it with \
                     `scripts/install`, build it with `cargo build --release -p xpreempt-shim`, \
                     or give --shim PATH",
                    candidates
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
    };
    if !path.is_file() {
        bail!(
            "the shim {} is missing: build it with `cargo build --release -p xpreempt-shim` or give --shim PATH",
            path.display()
        );
    }
    // LD_PRELOAD needs a path the program can open from any working directory.
    std::fs::canonicalize(&path).with_context(|| format!("resolving {}", path.display()))
}

/// Where the shim may lie, in order: beside the binary (a cargo build folder, where cargo puts
/// both), then `<exe dir>/../lib` (what `scripts/install` makes: bin/ and lib/ under one prefix).
fn shim_candidates(exe: &Path) -> Vec<PathBuf> {
    const SHIM: &str = "libxpreempt_shim.so";
    let dir = exe.parent().unwrap_or(Path::new("."));
    let mut out = vec![dir.join(SHIM)];
    if let Some(prefix) = dir.parent() {
        out.push(prefix.join("lib").join(SHIM));
    }
    out
}

/// Replaces this process with the program; returns only on failure.
pub fn run(args: &Args) -> Result<()> {
    let shim = shim_path(args)?;
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(xpreempt_ipc::default_socket);
    let scheduler = find_scheduler(&socket);
    let plan = plan(args, &shim, &scheduler, Driver::probe())?;
    if !args.quiet {
        for n in &plan.notes {
            eprintln!("xpreempt run: {n}");
        }
    }
    let (program, rest) = args
        .command
        .split_first()
        .context("no program to run after --")?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest);
    for (k, v) in &plan.env {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    let code = match err.kind() {
        std::io::ErrorKind::NotFound => 127,
        _ => 126,
    };
    eprintln!(
        "xpreempt run: could not run {}: {err}",
        Path::new(program).display()
    );
    std::process::exit(code);
}

/// An MPS client sees the devices of the MPS server, numbered from 0, so a CUDA_VISIBLE_DEVICES
/// meant for the whole machine can leave the program with no device: say so where it is set.
fn mps_visible_devices_note(visible: Option<&std::ffi::OsStr>) -> Option<String> {
    visible.map(|v| {
        format!(
            "CUDA_VISIBLE_DEVICES={} is set, but an MPS client sees only the devices of the \
             daemon's MPS server, numbered from 0: if the program finds no CUDA device, unset it \
             for the program and set it for `xpreempt daemon --mps` instead",
            v.to_string_lossy()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(line: &[&str]) -> Args {
        Cli::try_parse_from(std::iter::once("run").chain(line.iter().copied()))
            .unwrap()
            .args
    }

    fn get<'a>(p: &'a Plan, key: &str) -> Option<&'a str> {
        p.env
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_str().unwrap())
    }

    #[test]
    fn an_mps_client_with_visible_devices_set_is_told_what_they_mean_there() {
        assert_eq!(mps_visible_devices_note(None), None);
        let note = mps_visible_devices_note(Some(std::ffi::OsStr::new("1"))).unwrap();
        assert!(note.starts_with("CUDA_VISIBLE_DEVICES=1 is set"), "{note}");
        assert!(note.contains("xpreempt daemon --mps"), "{note}");
    }

    #[test]
    fn the_level_defaults_to_1_over_mps_and_3_when_time_sliced() {
        let a = args(&["--priority", "-3", "--", "python", "-c", "pass"]);
        assert_eq!(a.command, ["python", "-c", "pass"]);
        let mps = Scheduler::Daemon {
            socket: "/s".into(),
            mps_pipe: Some("/s.mps/pipe".into()),
        };
        let p = plan(&a, Path::new("/lib/shim.so"), &mps, Driver::Present).unwrap();
        assert_eq!(get(&p, "XPREEMPT_LEVEL"), Some("1"));
        assert_eq!(get(&p, "XPREEMPT_PRIORITY"), Some("-3"));
        assert_eq!(get(&p, "CUDA_MPS_PIPE_DIRECTORY"), Some("/s.mps/pipe"));
        assert_eq!(get(&p, "XPREEMPT_INTERCEPT"), Some("1"));
        assert!(get(&p, "LD_PRELOAD").unwrap().starts_with("/lib/shim.so"));
        if std::env::var_os("CUDA_MPS_CLIENT_PRIORITY").is_none() {
            assert_eq!(get(&p, "CUDA_MPS_CLIENT_PRIORITY"), Some("1"));
            let high = plan(
                &args(&["--priority", "1", "--", "x"]),
                Path::new("/s.so"),
                &mps,
                Driver::Present,
            )
            .unwrap();
            assert_eq!(get(&high, "CUDA_MPS_CLIENT_PRIORITY"), None);
        }
        let local = Scheduler::Local {
            socket: "/s".into(),
            why: "none".into(),
        };
        let p = plan(&a, Path::new("/lib/shim.so"), &local, Driver::Present).unwrap();
        assert_eq!(get(&p, "XPREEMPT_LEVEL"), Some("3"));
        assert_eq!(get(&p, "CUDA_MPS_PIPE_DIRECTORY"), None);
        assert_eq!(get(&p, "CUDA_MPS_CLIENT_PRIORITY"), None);
        assert!(p.notes[0].contains("no daemon"), "{:?}", p.notes);
        let a = args(&["--level", "2", "--window", "4", "--", "x"]);
        let p = plan(&a, Path::new("/lib/shim.so"), &mps, Driver::Present).unwrap();
        assert_eq!(get(&p, "XPREEMPT_LEVEL"), Some("2"));
        assert_eq!(get(&p, "XPREEMPT_PASS_THROUGH"), None);
        assert_eq!(get(&p, "XPREEMPT_WINDOW"), Some("4"));
        assert_eq!(get(&p, "XPREEMPT_GPU_WINDOW_US"), None);
        let a = args(&["--gpu-window-us", "0", "--", "x"]);
        let p = plan(&a, Path::new("/lib/shim.so"), &mps, Driver::Present).unwrap();
        assert_eq!(get(&p, "XPREEMPT_GPU_WINDOW_US"), Some("0"));
        let a = args(&["--pass-through", "--", "x"]);
        let p = plan(&a, Path::new("/lib/shim.so"), &local, Driver::Present).unwrap();
        assert_eq!(get(&p, "XPREEMPT_LEVEL"), Some("3"));
        assert_eq!(get(&p, "XPREEMPT_PASS_THROUGH"), Some("1"));
    }

    #[test]
    fn pass_through_is_refused_where_it_could_not_preempt() {
        let local = Scheduler::Local {
            socket: "/s".into(),
            why: "none".into(),
        };
        let mps = Scheduler::Daemon {
            socket: "/s".into(),
            mps_pipe: Some("/s.mps/pipe".into()),
        };
        let shim = Path::new("/lib/shim.so");
        for level in ["1", "2"] {
            let a = args(&["--pass-through", "--level", level, "--", "x"]);
            let e = plan(&a, shim, &local, Driver::Present)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("--level {level} would do nothing")),
                "{e}"
            );
        }
        let a = args(&["--pass-through", "--level", "3", "--", "x"]);
        assert!(plan(&a, shim, &local, Driver::Present).is_ok());
        for line in [
            &["--pass-through", "--", "x"][..],
            &["--pass-through", "--level", "3", "--", "x"],
        ] {
            let e = plan(&args(line), shim, &mps, Driver::Present)
                .unwrap_err()
                .to_string();
            assert!(e.contains("cannot preempt over the daemon's MPS"), "{e}");
        }
    }

    #[test]
    fn without_a_cuda_driver_it_says_that_nothing_is_intercepted() {
        let a = args(&["--", "x"]);
        let daemon = Scheduler::Daemon {
            socket: "/s".into(),
            mps_pipe: None,
        };
        let local = Scheduler::Local {
            socket: "/s".into(),
            why: "none".into(),
        };
        for s in [&daemon, &local] {
            let p = plan(&a, Path::new("/lib/shim.so"), s, Driver::Missing).unwrap();
            assert!(
                p.notes[0].starts_with("nothing will be intercepted: no CUDA driver found"),
                "{:?}",
                p.notes
            );
            assert!(
                !p.notes
                    .iter()
                    .any(|n| n.contains("scheduling through") || n.contains("schedules its own")),
                "{:?}",
                p.notes
            );
        }
        let p = plan(&a, Path::new("/lib/shim.so"), &daemon, Driver::Present).unwrap();
        assert!(
            !p.notes
                .iter()
                .any(|n| n.contains("nothing will be intercepted"))
        );
    }

    #[test]
    fn bad_levels_and_a_missing_program_are_refused() {
        let parse =
            |l: &[&str]| Cli::try_parse_from(std::iter::once("run").chain(l.iter().copied()));
        assert!(parse(&["--level", "4", "--", "x"]).is_err());
        assert!(parse(&["--level", "0", "--", "x"]).is_err());
        assert!(parse(&[]).is_err());
    }

    #[test]
    fn the_shim_is_looked_for_beside_the_binary_then_in_the_prefix_lib() {
        let c = shim_candidates(Path::new("/opt/xp/bin/xpreempt"));
        assert_eq!(
            c,
            [
                PathBuf::from("/opt/xp/bin/libxpreempt_shim.so"),
                PathBuf::from("/opt/xp/lib/libxpreempt_shim.so"),
            ]
        );
    }

    #[test]
    fn an_installed_layout_finds_the_shim_in_lib() {
        let root =
            std::env::temp_dir().join(format!("xpreempt-shim-lookup-{}", std::process::id()));
        let (bin, lib) = (root.join("bin"), root.join("lib"));
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libxpreempt_shim.so"), b"").unwrap();
        let found = shim_candidates(&bin.join("xpreempt"))
            .into_iter()
            .find(|p| p.is_file());
        assert_eq!(found, Some(lib.join("libxpreempt_shim.so")));
        std::fs::write(bin.join("libxpreempt_shim.so"), b"").unwrap();
        let found = shim_candidates(&bin.join("xpreempt"))
            .into_iter()
            .find(|p| p.is_file());
        assert_eq!(
            found,
            Some(bin.join("libxpreempt_shim.so")),
            "beside the binary comes first"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
