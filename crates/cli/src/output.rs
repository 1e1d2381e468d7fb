//! Human tables or one JSON object: the choice every subcommand shares.

use anyhow::Result;
use serde::Serialize;

pub struct Output {
    pub json: bool,
}

impl Output {
    /// Prints `value` as JSON, or `table()` for people.
    pub fn emit<T: Serialize>(&self, value: &T, table: impl FnOnce() -> String) -> Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(value)?);
        } else {
            print!("{}", table());
        }
        Ok(())
    }
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
