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

/// Writes `text` to stdout. A reader that went away (`xpreempt list | head -1`) is
/// [`StdoutClosed`], which ends the program quietly with status 0: Rust ignores SIGPIPE, so a
/// write to a closed pipe would otherwise be an error (or, through `println!`, a panic).
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

/// Whether log lines may carry colour: only on a terminal, never in a log file or a pipe.
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// The command ran and printed its result, but the result says something failed (a
/// simulation that did not run every kernel exactly once). Exits with [`CHECKS_FAILED`], and
/// nothing more goes to stdout: under `--json` that stays one parseable object.
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

#[derive(Serialize)]
struct Version {
    name: &'static str,
    version: &'static str,
    policies: &'static [&'static str],
}

pub fn version(out: &Output) -> Result<()> {
    let v = Version {
        name: "xpreempt",
        version: env!("CARGO_PKG_VERSION"),
        policies: &xpreempt_core::policy::POLICY_NAMES,
    };
    out.emit(&v, || {
        format!(
            "{} {}\npolicies: {}\n",
            v.name,
            v.version,
            v.policies.join(", ")
        )
    })
}
