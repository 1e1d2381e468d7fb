//! The agent's control thread. Connected, it waits on its bell (rung by the daemon's commands
//! and by the fast path's higher queues), makes each queue do what the daemon's command and the
//! board say, beats the heartbeat and publishes queue statistics; it notices a dead daemon and
//! falls back to local scheduling. Unconnected, it tries to connect now and then.

use crate::sink::{bit_of, is_active, pay_owed_ring, publish};
use crate::{
    AgentError, Connection, Entry, Inner, Mode, connect, local_info, register_remote, set_bit,
};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use xpreempt_core::QueueId;
use xpreempt_ipc::shm::{HEARTBEAT, decode_report};

/// How often an unconnected agent looks for a daemon at first; after each failure it waits
/// twice as long, up to [`RECONNECT_MAX`], so that a stopped daemon's backlog is not filled by
/// every agent.
const RECONNECT: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(3);
/// How many agent timeouts a background handshake may take.
const RECONNECT_PATIENCE: u32 = 10;

/// How long the daemon may stop beating (`Header::daemon_beat`) while it holds one of this
/// process's queues suspended before the agent gives up on it and schedules locally.
pub(crate) const DAEMON_SILENCE: Duration = Duration::from_secs(2);

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
    // Spinning on the bell until then, while a queue may be preempted through the board.
    let mut hot_until = Instant::now();
    let mut exposed = false;
    let mut backoff = RECONNECT;
    // The daemon's beat as last seen, and when it moved.
    let mut daemon_beat = (0u64, Instant::now());
    while !inner.shutdown.load(Ordering::SeqCst) {
        crate::sink::mirror_wants_work(inner);
        let connected = matches!(
            &*inner.mode.read().unwrap_or_else(|p| p.into_inner()),
            Mode::Remote(_)
        );
        if !connected {
            sleep_unless_shutdown(inner, backoff);
            if inner.shutdown.load(Ordering::SeqCst) {
                break;
            }
            // Off the application's threads, a handshake may take longer than a request: a
            // loaded machine then still gets its agents back to the daemon.
            match connect(inner, inner.timeout * RECONNECT_PATIENCE) {
                Ok(conn) => {
                    backoff = RECONNECT;
                    daemon_beat = (0, Instant::now());
                    go_remote(inner, conn);
                }
                // A daemon that does not answer is asked less and less often; one that is
                // not there costs nothing to ask.
                Err(e @ AgentError::Timeout(_)) => {
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                    tracing::trace!(%e, "the daemon does not answer");
                }
                Err(e) => {
                    backoff = RECONNECT;
                    tracing::trace!(%e, "no daemon yet");
                }
            }
            continue;
        }
        let turn = apply_commands(inner);
        let now = Instant::now();
        if turn.board_moved || (turn.exposed && !exposed) {
            hot_until = now + inner.hot;
        }
        exposed = turn.exposed;
        let hot = if exposed && hot_until > now {
            (hot_until - now).min(HEARTBEAT)
        } else {
            spin
        };
        if stats_at.elapsed() >= HEARTBEAT {
            stats_at = now;
            publish_stats(inner);
            clear_stale_bits(inner);
            pay_owed_rings(inner);
            if let Some(why) = daemon_failed(inner, &mut daemon_beat) {
                // A daemon closes a connection that holds no queue once it is idle: nothing
                // to say then (the agent reconnects quietly).
                if inner
                    .lock_queues()
                    .iter()
                    .flatten()
                    .any(|e| e.remote.is_some())
                {
                    tracing::warn!(
                        "xpreempt daemon {why}; resuming this process's queues and scheduling locally"
                    );
                } else {
                    tracing::debug!("xpreempt daemon {why}; reconnecting");
                }
                go_local(inner);
                continue;
            }
        }
        // Waited on without the mode lock, so that a switch to local mode need not wait.
        let bell = match &*inner.mode.read().unwrap_or_else(|p| p.into_inner()) {
            Mode::Remote(conn) => {
                conn.segment
                    .header()
                    .heartbeat
                    .fetch_add(1, Ordering::SeqCst);
                conn.bell_ref()
            }
            Mode::Local => continue,
        };
        seen = bell.get().wait(seen, hot, HEARTBEAT);
    }
}

/// What one pass over the queues saw.
#[derive(Default)]
struct Turn {
    /// A queue with work has a higher queue of its user that may stop it through the board.
    exposed: bool,
    /// The board (not only the daemon's command) suspended or resumed a queue.
    board_moved: bool,
}

/// Makes every queue do what the daemon's command and the board say: it is suspended while a
/// bit of its `preempted_by` is set, or while the daemon's command holds it (a liftable one
/// only until its lift bits clear).
fn apply_commands(inner: &Inner) -> Turn {
    let mut turn = Turn::default();
    let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
    let Mode::Remote(conn) = &*mode else {
        return turn;
    };
    let active = conn.board.as_ref().map_or(0, |(b, _)| b.active().load());
    let mut queues = inner.lock_queues();
    for (slot, entry) in queues.iter_mut().enumerate() {
        let Some(e) = entry.as_mut().filter(|e| e.remote.is_some()) else {
            continue;
        };
        let Some(s) = conn.segment.slot(slot as u32) else {
            continue;
        };
        let (cmd, lift) = s.command_and_lift();
        let preempted_by = if conn.board.is_some() {
            s.preempted_by.load()
        } else {
            0
        };
        let by_board = preempted_by & active != 0;
        let want = by_board || cmd.holds(active, lift);
        if preempted_by != 0 && is_active(s.report.load(Ordering::SeqCst)) {
            turn.exposed = true;
        }
        if cmd.generation != e.applied {
            e.queue.set_refused(cmd.refused);
        }
        if want != e.suspended {
            let result = if want {
                e.queue.suspend()
            } else {
                e.queue.resume()
            };
            match result {
                Ok(report) => {
                    e.suspended = want;
                    turn.board_moved |= want != cmd.suspended || (cmd.liftable && !want);
                    if let Some(r) = report {
                        publish(inner, &mode, QueueId(slot as u32), r);
                    }
                }
                // Left as it was; the next turn (or the daemon's retry) tries again.
                Err(err) => tracing::warn!(%err, "applying the daemon's command"),
            }
        }
        if cmd.generation != e.applied {
            e.applied = cmd.generation;
            s.applied.store(cmd.generation, Ordering::SeqCst);
        }
    }
    turn
}

/// A bit set ahead of a submission that then never reported Ready (its launch failed) would
/// stop other queues for nothing: cleared once seen twice under the same idle report.
fn clear_stale_bits(inner: &Inner) {
    let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
    let Mode::Remote(conn) = &*mode else { return };
    let Some((board, _)) = &conn.board else {
        return;
    };
    let mut queues = inner.lock_queues();
    for (slot, entry) in queues.iter_mut().enumerate() {
        let Some(e) = entry.as_mut() else { continue };
        let (Some(bit), Some(s)) = (
            bit_of(inner, QueueId(slot as u32)),
            conn.segment.slot(slot as u32),
        ) else {
            continue;
        };
        let word = s.report.load(Ordering::SeqCst);
        if is_active(word) || !board.active().is_set(bit) {
            e.stale_bit = None;
        } else if e.stale_bit.replace(word) == Some(word) {
            board.announce(bit, is_active(s.report.load(Ordering::SeqCst)));
            e.stale_bit = None;
        }
    }
}

/// A ring put off for a watcher that had already turned to the hardware is paid within a
/// heartbeat.
fn pay_owed_rings(inner: &Inner) {
    let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
    for queue in 0..inner.rings_owed.len() {
        pay_owed_ring(inner, &mode, queue);
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
        s.suspend_latency.store(&st.suspend_latency);
        s.drain_latency.store(&st.drain_latency);
        s.resume_latency.store(&st.resume_latency);
        s.gpu.store(&e.queue.gpu_time());
    }
}

/// Sleeps `d` in short steps, so that a dropped agent does not wait out a long back-off.
fn sleep_unless_shutdown(inner: &Inner, d: Duration) {
    let until = Instant::now() + d;
    while !inner.shutdown.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// Why the daemon is to be given up on, if it is: its end of the socket closed, a request
/// to it failed or ran out of time, or it stopped beating while it holds a queue suspended.
fn daemon_failed(inner: &Inner, beat: &mut (u64, Instant)) -> Option<&'static str> {
    let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
    let Mode::Remote(conn) = &*mode else {
        return None;
    };
    if conn.broken.load(Ordering::SeqCst) {
        return Some("did not answer in time");
    }
    let now = conn.segment.header().daemon_beat.load(Ordering::SeqCst);
    if now != beat.0 {
        *beat = (now, Instant::now());
    } else if beat.1.elapsed() >= DAEMON_SILENCE
        && inner
            .lock_queues()
            .iter()
            .flatten()
            .any(|e| e.remote.is_some() && e.suspended)
    {
        return Some("stopped answering while it held a queue suspended");
    }
    drop(mode);
    daemon_gone(inner).then_some("gone")
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
    for (slot, entry) in queues.iter_mut().enumerate() {
        let Some(e) = entry.as_mut() else { continue };
        if e.remote.is_none() {
            // The daemon refused it or did not answer for it: it is local already.
            inner.set_local_slot(slot, false);
            continue;
        }
        e.queue.set_refused(false);
        if e.suspended
            && let Err(err) = e.queue.resume()
        {
            tracing::warn!(%err, "resuming after the daemon died");
        }
        e.suspended = false;
        e.remote = None;
        e.applied = 0;
        e.stale_bit = None;
        set_bit(inner, slot, None);
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
    for slot in 0..inner.local_slots.len() {
        inner.set_local_slot(slot, false);
    }
    for (slot, entry) in queues.iter_mut().enumerate() {
        let Some(e) = entry.as_mut() else { continue };
        let report = inner.reports[slot].load(Ordering::SeqCst);
        match register_remote(&conn, slot as u32, &e.decl, report) {
            Ok(remote) => registered.push((slot, remote)),
            // This queue stays with the local scheduler; the others go to the daemon.
            Err(AgentError::Refused(why)) => {
                tracing::warn!(%why, "the daemon refused a queue; it stays local");
                inner.set_local_slot(slot, true);
            }
            Err(err) => {
                tracing::warn!(%err, "registering with the daemon; staying local");
                return;
            }
        }
    }
    for (slot, (remote, bit)) in registered {
        let id = QueueId(slot as u32);
        set_bit(inner, slot, bit);
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
            e.stale_bit = None;
        }
    }
    tracing::info!(socket = %inner.socket.display(), "connected to the xpreempt daemon");
    inner.said_local.store(false, Ordering::SeqCst);
    *mode = Mode::Remote(conn);
    drop(mode);
    crate::sink::mirror_wants_work(inner);
}
