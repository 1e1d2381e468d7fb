//! `xpreempt`: run programs under the scheduler, run and query its daemon, load policies, and
//! simulate the AMD queue hardware. Every subcommand prints a table for people, or one JSON
//! object with `--json`; errors too, as `{"error": "..."}` on stdout. The benchmarks are another
//! binary, `xpreempt-bench`. A reader that closes stdout early (`… | head`) ends the program
//! quietly with status 0 (`output::print`).

mod costs;
mod demo;
mod ops;
mod output;
mod policy;
mod run;
mod sim;
mod top;
mod units;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "xpreempt",
    version,
    about = "Preemptive, priority-aware scheduling of GPU command queues",
    after_help = "Output into a pipe that closes early (`xpreempt list | head -1`) ends quietly, \
                  with status 0. The benchmarks are another binary: xpreempt-bench."
)]
struct Cli {
    /// Print one JSON object instead of a table. Errors are then one JSON object too,
    /// `{"error": "..."}` on stdout, with a non-zero exit status (1 for an error, 2 for bad
    /// arguments, 3 when `sim` ran but a mode failed its checks).
    #[arg(long, global = true)]
    json: bool,
    /// Log filter, e.g. `info` or `xpreempt_core=debug` (also XPREEMPT_LOG).
    #[arg(long, global = true, env = "XPREEMPT_LOG", default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the version and what this build can drive.
    Version,
    /// A small scheduling demo on the reference backend (virtual clock, no GPU).
    Demo(demo::Args),
    /// Load an eBPF policy and read or write its maps.
    Policy(policy::Args),
    /// Run a scenario on the AMD queue-hardware model under none, lv1, scheme-a, lv2 and lv3.
    Sim(sim::Args),
    /// Run the global-mode daemon (the same as `xpreemptd`).
    Daemon(xpreempt_daemon::cli::Args),
    /// The running daemon's queues: process, priorities, state, counters.
    List(ops::Conn),
    /// The running daemon's statistics.
    Stats(ops::Conn),
    /// Change the priority of a process's queues (PID) or of one queue (q7).
    SetPriority(ops::SetPriority),
    /// A live view of the daemon's queues (`--json`: one snapshot, then exit).
    Top(top::Args),
    /// Run an unmodified CUDA program under xpreempt (preloads the shim; exits with the
    /// program's status).
    Run(run::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let json = cli.json;
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => output::fail(json, &e),
    }
}

/// clap's own errors (unknown flags, bad values) keep clap's text and exit status, except that
/// under `--json` they become the same `{"error": ...}` object every other error is. `--help`
/// and `--version` are not errors and print as usual.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let shown = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if !shown && std::env::args_os().any(|a| a == "--json") {
        let text = e.render().to_string();
        let _ = output::print(&format!(
            "{}\n",
            serde_json::json!({ "error": text.trim_end() })
        ));
        return ExitCode::from(2);
    }
    let _ = e.print();
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

fn run(cli: Cli) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        .with_ansi(output::stderr_is_terminal())
        .init();
    let out = output::Output { json: cli.json };
    match cli.command {
        Command::Version => output::version(&out),
        Command::Demo(args) => demo::run(&out, &args),
        Command::Policy(args) => policy::run(&out, &args),
        Command::Sim(args) => sim::run(&out, &args),
        Command::Daemon(args) => xpreempt_daemon::cli::run(&args),
        Command::List(conn) => ops::list(&out, &conn),
        Command::Stats(conn) => ops::stats(&out, &conn),
        Command::SetPriority(args) => ops::set_priority(&out, &args),
        Command::Top(args) => top::run(&out, args),
        Command::Run(args) => run::run(&args),
    }
}
