//! Human tables or one JSON object: the choice every subcommand shares, and how errors and a
//! closed stdout end the program.

use anyhow::Result;
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

pub struct Output {
    pub json: bool,
}

impl Output {
    /// Prints `value` as JSON, or `table()` for people.
    pub fn emit<T: Serialize>(&self, value: &T, table: impl FnOnce() -> String) -> Result<()> {
        if self.json {
            print(&format!("{}\n", serde_json::to_string(value)?))
        } else {
            print(&table())
        }
    }
}

/// Writes `text` to stdout. A reader that went away (`… | head`) is [`StdoutClosed`], which
/// ends the program quietly.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        r => Ok(r?),
    }
}

/// Stdout's reader closed the pipe: not a failure of the command (a pager or `head` had enough).
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Whether log lines may carry colour: only on a terminal, never in a file or a pipe.
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// The command ran and printed its result, but the result says something failed (a scenario
/// that did not run). Exits with [`CHECKS_FAILED`], and nothing more goes to stdout: under
/// `--json` that stays one parseable object.
#[derive(Debug)]
pub struct ChecksFailed {
    pub summary: String,
}

impl std::fmt::Display for ChecksFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary)
    }
}

impl std::error::Error for ChecksFailed {}

/// Exit status of an error: bad input, I/O, a run that could not be made.
pub const ERROR: u8 = 1;
/// Exit status of a command whose result failed its own checks ([`ChecksFailed`]).
pub const CHECKS_FAILED: u8 = 3;

/// Reports an error the way `--json` promises: `{"error": "..."}` (the whole cause chain) on
/// stdout, so that a pipe into a JSON reader always gets one object; a person gets the chain
/// on stderr.
pub fn fail(json: bool, err: &anyhow::Error) -> ExitCode {
    if err.downcast_ref::<StdoutClosed>().is_some() {
        return ExitCode::SUCCESS;
    }
    if let Some(c) = err.downcast_ref::<ChecksFailed>() {
        let _ = writeln!(std::io::stderr(), "error: {c}");
        return ExitCode::from(CHECKS_FAILED);
    }
    if json {
        let _ = print(&format!(
            "{}\n",
            serde_json::json!({ "error": format!("{err:#}") })
        ));
    } else {
        let _ = writeln!(std::io::stderr(), "Error: {err:?}");
    }
    ExitCode::from(ERROR)
}

/// clap's own errors (unknown flags, bad values) keep clap's text and exit status, except that
/// under `--json` they become the same `{"error": ...}` object every other error is. `--help`
/// and `--version` are not errors and print as usual.
pub fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let shown = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if !shown && std::env::args_os().any(|a| a == "--json") {
        let text = e.render().to_string();
        let _ = print(&format!(
            "{}\n",
            serde_json::json!({ "error": text.trim_end() })
        ));
        return ExitCode::from(2);
    }
    let _ = e.print();
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}
