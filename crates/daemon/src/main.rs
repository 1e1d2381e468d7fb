//! `xpreemptd`: see `xpreempt_daemon`.

use clap::Parser;
use std::io::IsTerminal;

#[derive(Parser)]
#[command(
    name = "xpreemptd",
    version,
    about = "xpreempt's global-mode daemon: one scheduler per GPU for every process"
)]
struct Cli {
    #[command(flatten)]
    args: xpreempt_daemon::cli::Args,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("XPREEMPT_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a service's log file must hold plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    xpreempt_daemon::cli::run(&Cli::parse().args)
}
