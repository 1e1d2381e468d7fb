//! The agent's control thread. Connected, it sleeps on the daemon's doorbell, applies each
//! queue's new command, beats the heartbeat and publishes queue statistics; it notices a dead
//! daemon and falls back to local scheduling. Unconnected, it tries to connect now and then.

use crate::sink::publish;
use crate::{AgentError, Connection, Entry, Inner, Mode, connect, local_info, register_remote};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use xpreempt_core::QueueId;
use xpreempt_ipc::shm::{Command, HEARTBEAT, decode_report};

/// How often an unconnected agent looks for a daemon.
const RECONNECT: Duration = Duration::from_millis(200);

pub(crate) struct Control;

impl Control {
    pub fn start(inner: Arc<Inner>, spin: Duration) -> Result<JoinHandle<()>, AgentError> {
        Ok(std::thread::Builder::new()
            .name("xpreempt-agent".into())
            .spawn(move || run(&inner, spin))?)
    }
}

pub(crate) fn say_local(inner: &Inner, why: &AgentError) {
    if !inner.said_local.swap(true, Ordering::SeqCst) {
        tracing::info!(
            socket = %inner.socket.display(),
            "no xpreempt daemon ({why}); scheduling this process's queues locally"
        );
    }
}

fn run(inner: &Inner, spin: Duration) {
    let mut seen = 0u32;
    let mut stats_at = Instant::now();
    while !inner.shutdown.load(Ordering::SeqCst) {
        crate::sink::mirror_wants_work(inner);
        let segment = match &*inner.mode.read().unwrap_or_else(|p| p.into_inner()) {
            Mode::Remote(conn) => Some(conn.segment.clone()),
            Mode::Local => None,
        };
        let Some(segment) = segment else {
            std::thread::sleep(RECONNECT);
            match connect(inner) {
                Ok(conn) => go_remote(inner, conn),
                Err(e) => tracing::trace!(%e, "no daemon yet"),
            }
            continue;
        };
        let header = segment.header();
        seen = header.to_agent.wait(seen, spin, HEARTBEAT);
        header.heartbeat.fetch_add(1, Ordering::SeqCst);
        apply_commands(inner);
        if stats_at.elapsed() >= HEARTBEAT {
            stats_at = Instant::now();
            publish_stats(inner);
            if daemon_gone(inner) {
                go_local(inner);
            }
        }
    }
}

/// Applies every command whose generation moved since the last one applied.
fn apply_commands(inner: &Inner) {
    let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
    let Mode::Remote(conn) = &*mode else { return };
    let mut queues = inner.lock_queues();
    for (slot, entry) in queues.iter_mut().enumerate() {
        let Some(e) = entry.as_mut() else { continue };
        let Some(s) = conn.segment.slot(slot as u32) else {
            continue;
        };
        let cmd = Command::decode(s.command.load(Ordering::SeqCst));
        if cmd.generation == e.applied {
            continue;
        }
        e.applied = cmd.generation;
        e.queue.set_refused(cmd.refused);
        if cmd.suspended != e.suspended {
            let result = if cmd.suspended {
                e.queue.suspend()
            } else {
                e.queue.resume()
            };
            match result {
                Ok(report) => {
                    e.suspended = cmd.suspended;
                    if let Some(r) = report {
                        publish(inner, &mode, QueueId(slot as u32), r);
                    }
                }
                // Left as it was; the daemon's retry (a new command) tries again.
                Err(err) => tracing::warn!(%err, "applying the daemon's command"),
            }
        }
        s.applied.store(cmd.generation, Ordering::SeqCst);
    }
}

fn publish_stats(inner: &Inner) {
    let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
    let Mode::Remote(conn) = &*mode else { return };
    let queues = inner.lock_queues();
    for (slot, entry) in queues.iter().enumerate() {
        let (Some(e), Some(s)) = (entry, conn.segment.slot(slot as u32)) else {
            continue;
        };
        let st = e.queue.stats();
        s.in_flight.store(
            st.launched
                .saturating_sub(st.completed)
                .min(u64::from(u32::MAX)) as u32,
            Ordering::Relaxed,
        );
        s.pending.store(
            st.submitted
                .saturating_sub(st.launched)
                .min(u64::from(u32::MAX)) as u32,
            Ordering::Relaxed,
        );
        s.preemptions.store(st.preemptions, Ordering::Relaxed);
        s.resumes.store(st.resumes, Ordering::Relaxed);
        s.suspend_p99_ns
            .store(st.suspend_latency.summary().p99, Ordering::Relaxed);
    }
}

/// Whether the daemon's end of the socket has closed.
fn daemon_gone(inner: &Inner) -> bool {
    let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
    let Mode::Remote(conn) = &*mode else {
        return false;
    };
    let Ok(stream) = conn.stream.try_lock() else {
        // Someone is talking to it right now: it is there.
        return false;
    };
    let mut byte = [0u8; 1];
    // SAFETY: a non-blocking peek of at most one byte into a local buffer.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            byte.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n == 0 || (n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock)
}

/// The daemon is gone: resume what it held suspended at once, then schedule locally.
fn go_local(inner: &Inner) {
    let mut mode = inner.mode.write().unwrap_or_else(|p| p.into_inner());
    *mode = Mode::Local;
    let mut queues = inner.lock_queues();
    tracing::warn!("xpreempt daemon gone; resuming this process's queues and scheduling locally");
    for (slot, entry) in queues.iter_mut().enumerate() {
        let Some(e) = entry.as_mut() else { continue };
        e.queue.set_refused(false);
        if e.suspended
            && let Err(err) = e.queue.resume()
        {
            tracing::warn!(%err, "resuming after the daemon died");
        }
        e.suspended = false;
        e.remote = None;
        e.applied = 0;
        hand_over_locally(inner, slot, e);
    }
}

fn hand_over_locally(inner: &Inner, slot: usize, e: &Entry) {
    let id = QueueId(slot as u32);
    if let Err(err) = inner
        .local
        .register(local_info(id, &e.decl), e.queue.clone())
    {
        tracing::warn!(%err, "local registration");
        return;
    }
    if let Some(r) = decode_report(inner.reports[slot].load(Ordering::SeqCst)) {
        inner.local_sink.report(id, r);
    }
}

/// A daemon answers: move every queue to it.
fn go_remote(inner: &Inner, conn: Connection) {
    let mut mode = inner.mode.write().unwrap_or_else(|p| p.into_inner());
    let mut queues = inner.lock_queues();
    let mut registered = Vec::new();
    for (slot, entry) in queues.iter_mut().enumerate() {
        let Some(e) = entry.as_mut() else { continue };
        let report = inner.reports[slot].load(Ordering::SeqCst);
        match register_remote(&conn, slot as u32, &e.decl, report) {
            Ok(remote) => registered.push((slot, remote)),
            Err(err) => {
                tracing::warn!(%err, "registering with the daemon; staying local");
                return;
            }
        }
    }
    for (slot, remote) in registered {
        let id = QueueId(slot as u32);
        inner.local.unregister(id);
        if let Some(e) = queues[slot].as_mut() {
            // The local scheduler may have left it suspended; the daemon decides from here.
            if let Err(err) = e.queue.resume() {
                tracing::warn!(%err, "resuming on the way to the daemon");
            }
            e.queue.set_refused(false);
            e.remote = Some(remote);
            e.suspended = false;
            e.applied = 0;
        }
    }
    tracing::info!(socket = %inner.socket.display(), "connected to the xpreempt daemon");
    inner.said_local.store(false, Ordering::SeqCst);
    *mode = Mode::Remote(conn);
    drop(mode);
    crate::sink::mirror_wants_work(inner);
}
