//! `xpreempt-bench`: xpreempt's measurements, kept out of the user's `xpreempt` binary. The GPU
//! benchmarks (`info`, `latency`, `lcbe`, `lv3-probe`) need a CUDA device; `daemon` and `request`
//! measure global mode's CPU paths on stand-in queues and run anywhere. Every subcommand prints a
//! table for people, or one JSON object with `--json`; errors too, as `{"error": "..."}` on
//! stdout. A reader that closes the pipe early (`xpreempt-bench … | head`) ends the program
//! quietly with status 0.

mod cpu;
mod gpu;
mod output;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "xpreempt-bench",
    version,
    about = "xpreempt's benchmarks: preemption latency, LC/BE sharing and overhead on a CUDA GPU; \
             global mode's decision latency and request overhead on any machine"
)]
struct Cli {
    /// Print one JSON object instead of a table. Errors are then one JSON object too,
    /// `{"error": "..."}` on stdout, with a non-zero exit status (1 for an error, 2 for bad
    /// arguments, 3 when a benchmark ran but a scenario failed).
    #[arg(long, global = true)]
    json: bool,
    /// Log filter, e.g. `info` or `xpreempt_core=debug` (also XPREEMPT_LOG).
    #[arg(long, global = true, env = "XPREEMPT_LOG", default_value = "warn")]
    log: String,
    /// CUDA device ordinal (the GPU benchmarks).
    #[arg(long, default_value_t = 0, global = true)]
    device: i32,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Gpu(gpu::What),
    /// Global mode's decision latency and the daemon's CPU use (no GPU needed).
    Daemon(cpu::daemon::Args),
    /// What the stack adds to a latency-critical request, on a stand-in GPU (no GPU needed).
    Request(cpu::request::Args),
    /// (internal) a background client of `daemon`.
    #[command(hide = true)]
    Client(cpu::daemon::ClientArgs),
    /// (internal) the daemon the global-mode benchmarks measure: the code `xpreemptd` runs, in a
    /// process of its own.
    #[command(hide = true)]
    Xpreemptd(xpreempt_daemon::cli::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return output::usage_error(e),
    };
    let json = cli.json;
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => output::fail(json, &e),
    }
}

fn run(cli: Cli) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log)?)
        .with_writer(std::io::stderr)
        .with_ansi(output::stderr_is_terminal())
        .init();
    let out = output::Output { json: cli.json };
    match cli.command {
        Command::Gpu(what) => gpu::run(&out, cli.device, &what),
        Command::Daemon(args) => cpu::daemon::run(&out, &args),
        Command::Request(args) => cpu::request::run(&out, &args),
        Command::Client(args) => cpu::daemon::client(&args),
        Command::Xpreemptd(args) => xpreempt_daemon::cli::run(&args),
    }
}
