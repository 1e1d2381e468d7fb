//! `xpreempt`: run the scheduler on the built-in AMD model or a real GPU, load policies, and
//! benchmark. Every subcommand prints a table for people, or one JSON object with `--json`.

mod bench;
mod demo;
mod ops;
mod output;
mod policy;
mod sim;
mod top;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xpreempt",
    version,
    about = "Preemptive, priority-aware scheduling of GPU command queues"
)]
struct Cli {
    /// Print one JSON object instead of a table.
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
    /// Benchmarks on a real GPU (CUDA): preemption latency, LC/BE sharing, overhead.
    Bench(bench::Args),
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
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        .init();
    let out = output::Output { json: cli.json };
    match cli.command {
        Command::Version => output::version(&out),
        Command::Demo(args) => demo::run(&out, &args),
        Command::Bench(args) => bench::run(&out, &args),
        Command::Policy(args) => policy::run(&out, &args),
        Command::Sim(args) => sim::run(&out, &args),
        Command::Daemon(args) => xpreempt_daemon::cli::run(&args),
        Command::List(conn) => ops::list(&out, &conn),
        Command::Stats(conn) => ops::stats(&out, &conn),
        Command::SetPriority(args) => ops::set_priority(&out, &args),
        Command::Top(args) => top::run(&out, args),
    }
}
