//! A two-queue demo on the reference backend.

use crate::output::Output;
use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_out: &Output, _args: &Args) -> Result<()> {
    anyhow::bail!("the demo is being written")
}
