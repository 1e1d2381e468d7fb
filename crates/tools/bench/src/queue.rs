//! The one way the benchmarks build a preemptible queue: a `CudaQueue` (the CUDA backend's one
//! queue, on a stream of its own) under an `XQueue`, either
//! in this process alone (no scheduler, or the local scheduler's sink) or registered with
//! `xpreemptd` through a global-mode agent. BE, LC and the latency probe's victim all come from
//! a [`QueueSpec`], so the scenarios differ only in who suspends the queue.

use crate::marks::{Marked, Marks, marked};
use crate::{BenchError, Env, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::xqueue::threaded::{EventSink, SharedXQueue};
use xpreempt_core::{Hints, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_cuda::queue::{CudaQueue, CudaQueueConfig};

/// Completion words one guarded launch may use: a wave of blocks times a few hundred kernels'
/// worth, far above any benchmark kernel.
const MAX_UNITS: u32 = 1 << 21;

/// For A/B runs of one build, every benchmark queue's setting from the environment:
/// `XP_BENCH_IDLE_POLL_US=N` its idle poll ([`QueueConfig::with_idle_poll`]; 0: the old way,
/// every submission to an idle queue wakes its watcher).
pub fn with_env_overrides(mut config: QueueConfig) -> QueueConfig {
    let ns = |name| env_micros(name).map(|us| us.saturating_mul(1_000));
    if let Some(ns) = ns("XP_BENCH_IDLE_POLL_US") {
        config = config.with_idle_poll(ns);
    }
    config
}

/// A setting in µs from the environment variable `name`, if it is set to a number.
pub(crate) fn env_micros(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// Submits `k` to `q` as the application's own launch (`xpreempt_cuda::queue::submitting`): the
/// queue's completion watcher then keeps off the CPU of the thread that launches, as it keeps off
/// an intercepted application's.
pub fn submit_kernel(q: &BenchQueue, k: &xpreempt_cuda::Kernel) -> Result<xpreempt_core::Seq> {
    let command = xpreempt_core::Command::kernel(xpreempt_cuda::Deferred::kernel(k.clone()));
    Ok(xpreempt_cuda::queue::submitting(|| q.submit(command)).0?)
}

/// Every benchmark queue: a CUDA queue whose stops can be marked (`--marks`).
pub type BenchQueue = SharedXQueue<Marked<CudaQueue>>;

/// The shape of one benchmark queue.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueSpec {
    pub level: Level,
    pub stream_priority: i32,
    /// XQueue window (commands in flight) and sync-point spacing.
    pub threshold: u32,
    pub batch: u32,
}

impl QueueSpec {
    /// The hardware queue alone, for a caller that wraps it itself (the agent).
    pub fn hal(&self, env: &Env, marks: Option<Arc<Marks>>) -> Result<Marked<CudaQueue>> {
        let q = CudaQueue::on_device(
            env.device.clone(),
            self.stream_priority,
            CudaQueueConfig {
                level: self.level,
                lv3: self.lv3(),
                // The CUDA queue needs threshold + 1 slots; twice that leaves room for a
                // suspension's relaunch while new commands keep arriving.
                slots: 2 * self.threshold + 2,
                max_units: MAX_UNITS,
                ..CudaQueueConfig::default()
            },
        )?;
        Ok(marked(q, marks))
    }

    /// The process's Lv3 control for a queue at Lv3, if the preloaded shim offers one.
    fn lv3(&self) -> Option<xpreempt_cuda::lv3::ProcessLv3> {
        if self.level < Level::Lv3 {
            return None;
        }
        match crate::timeslice::shared() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(%e, "Lv3 (channel-group timeslice) unavailable; this queue uses Lv2/Lv1");
                None
            }
        }
    }

    pub fn config(&self) -> Result<QueueConfig> {
        Ok(with_env_overrides(QueueConfig::new(
            self.threshold,
            self.batch,
            self.level,
        )?))
    }

    /// A queue of this process: nobody schedules it (`sink` None; the benchmark suspends it
    /// itself) or it reports to a local scheduler's `sink`.
    pub fn local(
        &self,
        env: &Env,
        id: QueueId,
        sink: Option<EventSink>,
        marks: Option<Arc<Marks>>,
    ) -> Result<Arc<BenchQueue>> {
        let hal = self.hal(env, marks)?;
        let hw = hal.max_level();
        Ok(Arc::new(SharedXQueue::new(
            XQueue::new(id, self.config()?, hw),
            hal,
            sink,
        )))
    }

    /// A queue registered with the daemon through `agent`, declared at `priority` on the
    /// benchmark's device.
    pub fn with_agent(
        &self,
        env: &Env,
        agent: &Agent,
        priority: i32,
        latency_critical: bool,
        marks: Option<Arc<Marks>>,
    ) -> Result<Arc<BenchQueue>> {
        let decl = Declaration {
            device: env.device.ordinal as u32,
            priority,
            hints: Hints {
                latency_critical: Some(latency_critical),
                ..Hints::default()
            },
            interleave: None,
            level: self.level,
        };
        Ok(agent.queue(decl, self.config()?, self.hal(env, marks)?)?)
    }
}

/// How a side joins global mode: the daemon's socket and the priority its queue is declared at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    pub socket: PathBuf,
    pub priority: i32,
}

impl AgentSpec {
    /// Starts this process's agent. A scenario through the daemon measures nothing if the agent
    /// fell back to local scheduling, so that is an error here, not a log line.
    pub fn connect(&self, name: &str) -> Result<Agent> {
        let agent = Agent::start(Options {
            socket: self.socket.clone(),
            name: name.into(),
            ..Options::default()
        })?;
        ensure_remote(&agent, &self.socket)?;
        Ok(agent)
    }
}

impl AgentSpec {
    /// Runs `work` on a queue of shape `qs` registered with the daemon through this process's
    /// agent, then unregisters it. A run during which the agent lost the daemon (and so
    /// scheduled part of it locally) fails.
    pub fn run<T>(
        &self,
        name: &str,
        env: &Env,
        qs: &QueueSpec,
        latency_critical: bool,
        marks: Option<Arc<Marks>>,
        work: impl FnOnce(&BenchQueue) -> Result<T>,
    ) -> Result<T> {
        let agent = self.connect(name)?;
        let q = qs.with_agent(env, &agent, self.priority, latency_critical, marks)?;
        let r = work(&q);
        let remote = agent.is_remote();
        agent.remove(q.id());
        // The queue goes before its agent (whose control thread may still apply commands to it).
        drop(q);
        drop(agent);
        let r = r?;
        if remote {
            Ok(r)
        } else {
            Err(BenchError::LostDaemon)
        }
    }
}

/// Fails unless `agent` is connected to the daemon at `socket` now.
pub fn ensure_remote(agent: &Agent, socket: &std::path::Path) -> Result<()> {
    if agent.is_remote() {
        Ok(())
    } else {
        Err(BenchError::NoDaemon {
            socket: socket.to_path_buf(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_that_finds_no_daemon_is_an_error_not_a_local_run() {
        let spec = AgentSpec {
            socket: std::env::temp_dir().join(format!(
                "xpreempt-bench-no-daemon-{}/xpreempt.sock",
                std::process::id()
            )),
            priority: 10,
        };
        let err = spec.connect("test").map(|_| ()).expect_err("no daemon");
        assert!(matches!(err, BenchError::NoDaemon { .. }), "{err}");
        assert!(err.to_string().contains("no xpreempt daemon answered"));
    }

    #[test]
    fn specs_cross_the_process_boundary_intact() {
        let a = AgentSpec {
            socket: "/tmp/x.sock".into(),
            priority: -3,
        };
        let json = serde_json::to_string(&a).expect("json");
        assert_eq!(serde_json::from_str::<AgentSpec>(&json).expect("back"), a);
        let q = QueueSpec {
            level: Level::Lv2,
            stream_priority: -5,
            threshold: 2,
            batch: 1,
        };
        assert!(q.config().is_ok());
        let bad = QueueSpec { batch: 3, ..q };
        assert!(matches!(bad.config(), Err(BenchError::QueueConfig(_))));
    }
}
