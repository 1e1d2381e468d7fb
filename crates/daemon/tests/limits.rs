//! What a client can make the daemon hold is bounded, refusals are counted by reason, and the
//! daemon keeps serving everyone else: invented devices make no schedulers, connections are
//! capped (with room left for operators, and before the descriptors run out), connections that
//! hold nothing are closed when idle or stalled mid-frame, priority changes are rate-limited,
//! names are made safe to show, and a clean close is no bad frame.

mod common;

use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use xpreempt_core::{Level, QueueConfig};
use xpreempt_daemon::limits::Limits;
use xpreempt_daemon::{Config, Daemon};
use xpreempt_ipc::frame;
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, Role, Target};

fn daemon_with(socket: &Path, limits: Limits) -> Daemon {
    let mut c = Config::new(socket.to_path_buf());
    c.limits = limits;
    Daemon::start(c).expect("daemon starts")
}

fn hello(sock: &Path, role: Role, name: &str) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    frame::write(
        &mut s,
        &ClientMsg::Hello {
            version: xpreempt_ipc::PROTOCOL_VERSION,
            role,
            name: name.into(),
        },
    )
    .unwrap();
    s
}

fn refusals(d: &Daemon, reason: &str) -> u64 {
    d.stats().refusals.get(reason).copied().unwrap_or(0)
}

#[test]
fn invented_devices_make_no_schedulers_and_their_queues_run_locally() {
    let sock = socket("devices");
    let d = daemon_with(&sock, Limits::default());
    let dev = Device::new();
    let a = agent(&sock, "inventor");
    let mut queues = Vec::new();
    for device in 0..200u32 {
        let q = a
            .queue(
                xpreempt_agent::Declaration { device, ..decl(1) },
                QueueConfig::new(4, 2, Level::Lv2).unwrap(),
                dev.dev.create_queue(Level::Lv2),
            )
            .expect("a refused queue still runs, locally");
        queues.push(q);
    }
    let stats = d.stats();
    assert!(
        stats.devices.len() <= Limits::default().devices as usize,
        "{} schedulers",
        stats.devices.len()
    );
    assert_eq!(refusals(&d, "device"), 200 - 16, "{:?}", stats.refusals);
    // Refused by the daemon, the invented device's queue still runs every command once.
    let q = &queues[150];
    q.submit(kernel(1, 100_000)).unwrap();
    q.wait_all().unwrap();
    assert_eq!(dev.dev.block_runs(q.hal(), 0), vec![1]);
    assert!(a.is_remote(), "a refusal is no reason to leave the daemon");
    let json = serde_json::to_string(&d.stats()).unwrap();
    assert!(json.len() < 64 * 1024, "stats grew to {} bytes", json.len());
}

#[test]
fn queues_per_user_are_capped() {
    let sock = socket("queues");
    let d = daemon_with(
        &sock,
        Limits {
            queues_per_uid: 3,
            ..Limits::default()
        },
    );
    let dev = Device::new();
    let a = agent(&sock, "hoarder");
    let qs: Vec<_> = (0..5).map(|_| queue(&a, &dev, 1)).collect();
    assert_eq!(d.stats().devices[0].queues, 3);
    assert_eq!(refusals(&d, "queues_per_uid"), 2);
    for q in &qs {
        q.submit(kernel(1, 100_000)).unwrap();
        q.wait_all().unwrap();
    }
}

#[test]
fn connections_are_capped_and_operators_are_still_served() {
    let sock = socket("conns");
    let d = daemon_with(
        &sock,
        Limits {
            connections: 20,
            connections_per_uid: 1000,
            ..Limits::default()
        },
    );
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..100 {
        let mut s = hello(&sock, Role::Agent, "holder");
        match frame::read::<DaemonMsg>(&mut s) {
            Ok(DaemonMsg::Welcome { .. }) => held.push(s),
            Ok(DaemonMsg::Refused { reason }) => {
                assert!(reason.contains("limit of 20 connections"), "{reason}");
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(held.len(), 20);
    assert_eq!(refused, 80);
    let t = Instant::now();
    let mut op = Operator::connect(&sock);
    assert!(op.list().is_empty());
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(refusals(&d, "connections"), 80);
    drop(held);
}

#[test]
fn one_user_cannot_take_every_connection() {
    let sock = socket("peruid");
    let d = daemon_with(
        &sock,
        Limits {
            connections_per_uid: 10,
            ..Limits::default()
        },
    );
    let held: Vec<UnixStream> = (0..30)
        .filter_map(|_| {
            let mut s = hello(&sock, Role::Agent, "holder");
            matches!(
                frame::read::<DaemonMsg>(&mut s),
                Ok(DaemonMsg::Welcome { .. })
            )
            .then_some(s)
        })
        .collect();
    assert_eq!(held.len(), 10);
    assert_eq!(refusals(&d, "connections_per_uid"), 20);
    // The same user's operator commands still get through.
    let mut op = Operator::connect(&sock);
    assert!(op.list().is_empty());
}

#[test]
fn a_connection_that_holds_nothing_is_closed_when_idle_or_stalled() {
    let sock = socket("idle");
    let d = daemon_with(
        &sock,
        Limits {
            idle: Duration::from_millis(300),
            frame: Duration::from_millis(300),
            ..Limits::default()
        },
    );
    let dev = Device::new();
    let a = agent(&sock, "worker");
    let _q = queue(&a, &dev, 1);
    let mut idle = hello(&sock, Role::Operator, "idler");
    assert_eq!(
        frame::read::<DaemonMsg>(&mut idle).unwrap(),
        DaemonMsg::Ready
    );
    let mut stalled = hello(&sock, Role::Operator, "staller");
    assert_eq!(
        frame::read::<DaemonMsg>(&mut stalled).unwrap(),
        DaemonMsg::Ready
    );
    stalled.write_all(&[200, 0]).unwrap(); // half a length prefix, then nothing
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    match frame::read::<DaemonMsg>(&mut idle).unwrap() {
        DaemonMsg::Refused { reason } => assert!(reason.contains("idle"), "{reason}"),
        other => panic!("{other:?}"),
    }
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest);
    assert_eq!(refusals(&d, "idle"), 1);
    assert!(
        within(Duration::from_secs(2), || refusals(&d, "slow_frame") == 1).is_some(),
        "{:?}",
        d.stats().refusals
    );
    // The agent holds a queue: silent on the socket, it stays.
    std::thread::sleep(Duration::from_millis(500));
    assert!(a.is_remote());
    assert_eq!(Operator::connect(&sock).list().len(), 1);
}

#[test]
fn priority_changes_are_rate_limited_per_user() {
    let sock = socket("rate");
    let d = daemon_with(
        &sock,
        Limits {
            changes_per_sec: 10,
            ..Limits::default()
        },
    );
    let dev = Device::new();
    let a = agent(&sock, "target");
    let _q = queue(&a, &dev, 1);
    let mut op = Operator::connect(&sock);
    let mut refused = 0;
    for p in 0..50 {
        match op.ask(&ClientMsg::SetPriority {
            target: Target::Process(std::process::id()),
            priority: p,
        }) {
            DaemonMsg::Done { .. } => {}
            DaemonMsg::Refused { reason } => {
                assert!(reason.contains("--max-changes-per-sec"), "{reason}");
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(refused >= 35, "{refused}");
    assert_eq!(refusals(&d, "change_rate"), refused);
}

#[test]
fn a_clean_close_is_not_a_bad_frame() {
    let sock = socket("clean");
    let d = daemon_with(&sock, Limits::default());
    for _ in 0..200 {
        let mut s = hello(&sock, Role::Operator, "prober");
        // Asks and leaves without reading a word of the answers, once they have arrived
        // (closing with unread data resets the connection).
        frame::write(&mut s, &ClientMsg::Stats).unwrap();
        let mut fds = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&s),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd.
        unsafe { libc::poll(&mut fds, 1, 1000) };
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = Operator::connect(&sock).list();
    assert_eq!(d.stats().bad_frames, 0, "{:?}", d.stats());
}

#[test]
fn names_with_control_characters_are_escaped_and_capped() {
    let sock = socket("names");
    let _d = daemon_with(&sock, Limits::default());
    let dev = Device::new();
    let evil = format!(
        "ok\x1b[31m\n    9  666 forged-row\r\u{202e}{}",
        "x".repeat(5000)
    );
    let a = xpreempt_agent::Agent::start(xpreempt_agent::Options {
        socket: sock.to_path_buf(),
        name: evil,
        ..xpreempt_agent::Options::default()
    })
    .unwrap();
    let _q = queue(&a, &dev, 1);
    let rows = Operator::connect(&sock).list();
    let name = &rows[0].process_name;
    assert!(!name.chars().any(char::is_control), "{name:?}");
    assert!(name.starts_with("ok\\x1b[31m\\n"), "{name:?}");
    assert!(name.chars().count() <= xpreempt_ipc::names::MAX_NAME + 1);
}

/// xpreemptd with at most 200 descriptors.
fn daemon_with_200_descriptors(sock: &Path) -> DaemonProcess {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_xpreemptd"));
    cmd.arg("--socket").arg(sock).env("XPREEMPT_LOG", "error");
    // SAFETY: setrlimit in the child before exec, async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: 200,
                rlim_max: 200,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let d = DaemonProcess(cmd.spawn().unwrap());
    assert!(
        within(Duration::from_secs(10), || UnixStream::connect(sock)
            .is_ok())
        .is_some()
    );
    d
}

#[test]
fn operators_that_hold_connections_cannot_lock_out_the_next_operator() {
    let sock = socket("nofile-ops");
    let d = daemon_with_200_descriptors(&sock);
    let mut held = Vec::new();
    for _ in 0..300 {
        let Ok(mut s) = UnixStream::connect(&sock) else {
            continue;
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let hello = ClientMsg::Hello {
            version: xpreempt_ipc::PROTOCOL_VERSION,
            role: Role::Operator,
            name: "holder".into(),
        };
        if frame::write(&mut s, &hello).is_ok()
            && matches!(frame::read::<DaemonMsg>(&mut s), Ok(DaemonMsg::Ready))
        {
            held.push(s);
        }
    }
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.0.id()))
        .unwrap()
        .count();
    assert!(fds < 200, "{fds}");
    // The holders fill the reserve too, but a seat there frees after a second of silence.
    let t = Instant::now();
    let listed = within(Duration::from_secs(5), || {
        xpreempt_ipc::operator::Operator::connect(&sock).is_ok_and(|mut o| o.list().is_ok())
    });
    eprintln!("{} holders; list answered after {listed:?}", held.len());
    assert!(
        listed.is_some(),
        "list never got through ({:?})",
        t.elapsed()
    );
}

#[test]
fn connections_are_refused_before_the_daemon_runs_out_of_descriptors() {
    let sock = socket("nofile");
    let d = daemon_with_200_descriptors(&sock);
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..300 {
        let Ok(mut s) = UnixStream::connect(&sock) else {
            refused += 1;
            continue;
        };
        let _ = frame::write(
            &mut s,
            &ClientMsg::Hello {
                version: xpreempt_ipc::PROTOCOL_VERSION,
                role: Role::Agent,
                name: "holder".into(),
            },
        );
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        match frame::read::<DaemonMsg>(&mut s) {
            Ok(DaemonMsg::Welcome { .. }) => held.push(s),
            Ok(DaemonMsg::Refused { .. }) => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.0.id()))
        .unwrap()
        .count();
    eprintln!(
        "{} held, {refused} refused, {fds} descriptors open",
        held.len()
    );
    assert!(fds < 200, "{fds}");
    assert!(held.len() >= 20, "{}", held.len());
    let t = Instant::now();
    let mut op = Operator::connect(&sock);
    assert!(op.list().is_empty());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}
