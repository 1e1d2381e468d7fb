//! The socket's side of the daemon: the accept loop, which admits a connection or refuses it
//! at once (connection limits), and one thread per connection, which reads the Hello, hands an
//! agent its segment and board, and answers requests until the peer leaves, goes idle without
//! holding anything, or stalls in the middle of a frame.

use crate::limits::{Admit, Reason};
use crate::shared::{Shared, error_chain};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use xpreempt_ipc::frame::{self, FrameError};
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, Role, hello_version};
use xpreempt_ipc::shm::{SLOTS, Segment};
use xpreempt_ipc::unix::{Cred, peer_cred, send_fd};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection admitted into the operators' reserve may stay silent.
const RESERVE_IDLE: Duration = Duration::from_secs(1);

pub(crate) fn accept(shared: &Arc<Shared>, listener: UnixListener) {
    for stream in listener.incoming() {
        if shared.is_stopping() {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%e, "accept");
                // Out of descriptors, say: give the system a moment instead of spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let cred = match peer_cred(&stream) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%e, "no peer credentials; connection dropped");
                continue;
            }
        };
        let limits = &shared.config.limits;
        let admit = shared.admission().admit(cred.uid, limits);
        if let Admit::No(reason) = admit {
            let why = match reason {
                Reason::ConnectionsPerUid => format!(
                    "user {} already has {} connections to the daemon (--max-connections-per-uid)",
                    cred.uid, limits.connections_per_uid
                ),
                _ => format!(
                    "the daemon is at its limit of {} connections (--max-connections)",
                    limits.connections
                ),
            };
            refuse_at_once(shared, stream, cred, reason, why);
            continue;
        }
        let s = shared.clone();
        let operator_only = match admit {
            Admit::OperatorOnly(r) => Some(r),
            _ => None,
        };
        let spawned = std::thread::Builder::new()
            .name("xpreemptd-client".into())
            .spawn(move || serve(&s, stream, cred, operator_only));
        if let Err(e) = spawned {
            shared.admission().leave(cred.uid);
            tracing::error!(%e, "no thread for a new client; connection dropped");
        }
    }
}

/// Refuses from the accept loop, which must never wait on a client: the refusal is written
/// without blocking (it fits an empty socket buffer) and the connection closed.
fn refuse_at_once(
    shared: &Shared,
    mut stream: UnixStream,
    cred: Cred,
    reason: Reason,
    why: String,
) {
    let first = {
        let mut st = shared.lock();
        st.refused(reason) == 1
    };
    // Said once per reason and then at debug level: a flood must not flood the log too.
    if first {
        tracing::warn!(pid = cred.pid, uid = cred.uid, "connection refused: {why}");
    } else {
        tracing::debug!(pid = cred.pid, uid = cred.uid, "connection refused: {why}");
    }
    let _ = stream.set_nonblocking(true);
    let _ = frame::write(&mut stream, &DaemonMsg::Refused { reason: why });
}

fn serve(shared: &Arc<Shared>, stream: UnixStream, cred: Cred, operator_only: Option<Reason>) {
    let conn = shared.next_connection.fetch_add(1, Ordering::Relaxed);
    if let Ok(c) = stream.try_clone() {
        shared
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(conn, c);
    }
    serve_connection(shared, stream, cred, operator_only);
    shared
        .connections
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&conn);
    shared.admission().leave(cred.uid);
}

/// Refuses with a reason the client reads, counted under `reason` (or as a bad frame).
fn refuse(shared: &Shared, stream: &mut UnixStream, cred: Cred, why: Refusal, text: String) {
    {
        let mut st = shared.lock();
        match why {
            Refusal::BadFrame => st.stats.bad_frames += 1,
            Refusal::Limit(r) => {
                st.refused(r);
            }
        }
    }
    if may_warn() {
        tracing::warn!(pid = cred.pid, uid = cred.uid, "connection refused: {text}");
    } else {
        tracing::debug!(pid = cred.pid, uid = cred.uid, "connection refused: {text}");
    }
    let _ = frame::write(stream, &DaemonMsg::Refused { reason: text });
}

/// Warnings about clients' misbehaviour, at most this many a second: an attack must not flood
/// the log as well (every refusal is still counted, and logged at debug level).
const WARNINGS_PER_SEC: u64 = 10;

fn may_warn() -> bool {
    use std::sync::atomic::AtomicU64;
    static SECOND: AtomicU64 = AtomicU64::new(0);
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if SECOND.swap(now, Ordering::Relaxed) != now {
        COUNT.store(0, Ordering::Relaxed);
    }
    COUNT.fetch_add(1, Ordering::Relaxed) < WARNINGS_PER_SEC
}

enum Refusal {
    BadFrame,
    Limit(Reason),
}

fn serve_connection(
    shared: &Arc<Shared>,
    mut stream: UnixStream,
    cred: Cred,
    operator_only: Option<Reason>,
) {
    let mut limits = shared.config.limits.clone();
    if operator_only.is_some() {
        // A seat of the operators' reserve is for a command, not for holding: it frees soon.
        limits.idle = limits.idle.min(RESERVE_IDLE);
    }
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    // A client that does not take its answers cannot hold this thread either.
    let _ = stream.set_write_timeout(Some(limits.frame));
    let (role, name) = match hello(&mut stream, cred) {
        Ok(h) => h,
        Err(Hello::Gone) => {
            tracing::debug!(pid = cred.pid, "connection closed before hello");
            return;
        }
        Err(Hello::Silent) => {
            let text = format!("no hello within {} s", HELLO_TIMEOUT.as_secs());
            refuse(
                shared,
                &mut stream,
                cred,
                Refusal::Limit(Reason::HelloTimeout),
                text,
            );
            return;
        }
        Err(Hello::Refused(why)) => {
            refuse(shared, &mut stream, cred, Refusal::BadFrame, why);
            return;
        }
    };
    let name = xpreempt_ipc::names::clean(&name);
    if let Some(reason) = operator_only
        && role != Role::Operator
    {
        let text = match reason {
            Reason::ConnectionsPerUid => format!(
                "user {} already has {} connections to the daemon (--max-connections-per-uid)",
                cred.uid, limits.connections_per_uid
            ),
            _ => format!(
                "the daemon is at its limit of {} connections (--max-connections)",
                limits.connections
            ),
        };
        refuse(shared, &mut stream, cred, Refusal::Limit(reason), text);
        return;
    }
    let segment = match role {
        Role::Agent => match Segment::create(SLOTS) {
            Ok(s) => Some(Arc::new(s)),
            Err(e) => {
                tracing::error!(pid = cred.pid, "{e}");
                let _ = frame::write(
                    &mut stream,
                    &DaemonMsg::Refused {
                        reason: format!("the daemon could not create a shared segment: {e}"),
                    },
                );
                return;
            }
        },
        Role::Operator | Role::Rm => None,
    };
    let (id, seat) = {
        let mut st = shared.lock();
        let wants = st.wants_work();
        if let Some(s) = &segment {
            s.header()
                .wants_work
                .store(u32::from(wants), Ordering::Relaxed);
        }
        let id = st.add_client(cred, name.clone(), segment.clone());
        (id, st.clients.get(&id).and_then(|c| c.seat.clone()))
    };
    tracing::info!(pid = cred.pid, uid = cred.uid, %name, ?role, "client connected");
    let alive = Arc::new(AtomicBool::new(true));
    let fast_path = match &segment {
        Some(seg) => {
            let welcome = frame::write(
                &mut stream,
                &DaemonMsg::Welcome {
                    slots: seg.slots(),
                    bell: seat.as_ref().map(|s| s.bell),
                },
            )
            .map_err(|e| e.to_string())
            .and_then(|()| send_fd(&stream, seg.fd()).map_err(|e| e.to_string()))
            .and_then(|()| match &seat {
                Some(s) => send_fd(&stream, s.board.fd()).map_err(|e| e.to_string()),
                None => Ok(()),
            });
            if let Err(e) = welcome {
                tracing::warn!(pid = cred.pid, "welcome failed: {e}");
                shared.lock().remove_client(id);
                return;
            }
            let (s, seg, alive) = (shared.clone(), seg.clone(), alive.clone());
            std::thread::Builder::new()
                .name("xpreemptd-fast".into())
                .spawn(move || fast_path(&s, id, &seg, &alive))
                .ok()
        }
        None => {
            let _ = frame::write(&mut stream, &DaemonMsg::Ready);
            None
        }
    };
    loop {
        match readable(&stream, limits.idle) {
            Ok(true) => {}
            Ok(false) => {
                if shared.lock().holds_anything(id) {
                    continue;
                }
                let text = format!(
                    "idle for {} s without a queue (--idle-timeout-ms)",
                    limits.idle.as_secs()
                );
                refuse(
                    shared,
                    &mut stream,
                    cred,
                    Refusal::Limit(Reason::Idle),
                    text,
                );
                break;
            }
            Err(_) => break,
        }
        // Begun, a frame must arrive in full soon: a peer that stalls mid-frame holds nothing.
        let _ = stream.set_read_timeout(Some(limits.frame));
        let msg = match frame::read::<ClientMsg>(&mut stream) {
            Ok(m) => m,
            Err(FrameError::Closed) => break,
            Err(FrameError::Io(e)) if is_timeout(&e) => {
                shared.lock().refused(Reason::SlowFrame);
                if may_warn() {
                    tracing::warn!(
                        pid = cred.pid,
                        "a frame stalled half-way; connection closed"
                    );
                }
                break;
            }
            Err(e) => {
                shared.lock().stats.bad_frames += 1;
                if may_warn() {
                    tracing::warn!(pid = cred.pid, error = %e, "bad frame; connection closed");
                } else {
                    tracing::debug!(pid = cred.pid, error = %e, "bad frame; connection closed");
                }
                break;
            }
        };
        if let Some(reply) = crate::requests::handle(shared, id, cred, msg)
            && frame::write(&mut stream, &reply).is_err()
        {
            break;
        }
    }
    alive.store(false, Ordering::SeqCst);
    if let Some(seg) = &segment {
        seg.header().to_daemon.ring();
    }
    if let Some(t) = fast_path {
        let _ = t.join();
    }
    shared.lock().remove_client(id);
    shared.ticker.notify_all();
    tracing::info!(pid = cred.pid, %name, "client gone; its queues are removed");
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Waits up to `limit` for the peer to send something (or close); `Ok(false)` when it did not.
fn readable(stream: &UnixStream, limit: Duration) -> io::Result<bool> {
    let mut fds = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = limit.as_millis().min(i32::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: poll(2) on one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut fds, 1, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

enum Hello {
    /// The peer left without a word (a probe, or a client that died at once).
    Gone,
    /// The peer said nothing within [`HELLO_TIMEOUT`].
    Silent,
    Refused(String),
}

/// Reads the first frame: it must be a `Hello` of this protocol version.
fn hello(stream: &mut UnixStream, cred: Cred) -> Result<(Role, String), Hello> {
    let body = match frame::read_bytes(stream) {
        Ok(b) => b,
        Err(FrameError::Closed) => return Err(Hello::Gone),
        Err(FrameError::Io(e)) if is_timeout(&e) => return Err(Hello::Silent),
        Err(e) => return Err(Hello::Refused(error_chain(&e))),
    };
    match hello_version(&body) {
        Some(v) if v == xpreempt_ipc::PROTOCOL_VERSION => {}
        Some(v) => {
            return Err(Hello::Refused(format!(
                "client (pid {}) speaks protocol version {v}; this daemon speaks {}",
                cred.pid,
                xpreempt_ipc::PROTOCOL_VERSION
            )));
        }
        None => return Err(Hello::Refused("the first message must be Hello".into())),
    }
    match frame::decode::<ClientMsg>(&body) {
        Ok(ClientMsg::Hello { role, name, .. }) => Ok((role, name)),
        Ok(_) => Err(Hello::Refused("the first message must be Hello".into())),
        Err(e) => Err(Hello::Refused(e.to_string())),
    }
}

/// How long a fast-path thread spins on its doorbell before it sleeps in the kernel. The daemon
/// is its own process, never the application's; 50 µs met the decision-latency goals on a
/// 16-core H100 host and ten times longer bought nothing for up to 1.6 cores
/// (docs/results/daemon-latency.md).
const SPIN: Duration = Duration::from_micros(50);

/// Sleeps on the agent's doorbell and decides on every state change it rings for.
fn fast_path(shared: &Shared, id: u64, segment: &Segment, alive: &AtomicBool) {
    let bell = &segment.header().to_daemon;
    let mut seen = bell.value();
    let mut rung = false;
    while alive.load(Ordering::SeqCst) {
        let mut st = shared.lock();
        if rung {
            st.stats.fast_path_wakeups += 1;
        }
        let before = st.run_timers();
        st.take_reports(id);
        let after = st.run_timers();
        drop(st);
        if after.is_some() && (before.is_none() || after < before) {
            shared.ticker.notify_all();
        }
        let now = bell.wait(seen, SPIN, Duration::from_millis(100));
        rung = now != seen;
        seen = now;
    }
}
