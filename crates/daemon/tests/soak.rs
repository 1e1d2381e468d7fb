//! Soak and attack: a real daemon process under everything a hostile or broken local client can
//! do at once — agents registering and leaving, queues on invented devices, connections held
//! open or silent, bad frames — while it is stopped (SIGSTOP) and later killed and restarted,
//! and a pair of real clients keeps preempting each other. It asserts that the daemon's memory
//! stays bounded (VmRSS/VmHWM from /proc), that the live pair is served whenever the daemon
//! runs, that every command runs exactly once, and that an application always starts at once.
//!
//! CI size: about 25 s. `XPREEMPT_SOAK_SECS=600` runs it for ten minutes;
//! `XPREEMPT_SOAK_REPORT=FILE` writes its figures there as JSON.

mod common;

use common::*;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};
use xpreempt_core::HwQueue;
use xpreempt_core::xqueue::threaded::Preemptible;
use xpreempt_ipc::frame;
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, DaemonStats, QueueDecl, Role};

/// What the attackers and the live pair did, and what the daemon showed.
#[derive(Default)]
struct Figures {
    connections: AtomicU64,
    churn_agents: AtomicU64,
    churn_commands: AtomicU64,
    invented_devices: AtomicU64,
    held: AtomicU64,
    silent: AtomicU64,
    bad_frames_sent: AtomicU64,
    rounds_served: AtomicU64,
    rounds_skipped: AtomicU64,
    app_starts: AtomicU64,
    app_start_max_us: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, SeqCst);
}

/// VmRSS and VmHWM of a process, in KiB.
fn memory(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn connect(sock: &Path) -> Option<UnixStream> {
    let s = xpreempt_ipc::unix::connect_within(sock, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    Some(s)
}

fn hello(s: &mut UnixStream, role: Role) -> Option<DaemonMsg> {
    frame::write(
        s,
        &ClientMsg::Hello {
            version: xpreempt_ipc::PROTOCOL_VERSION,
            role,
            name: "soak\x1b[31m\nattacker".into(),
        },
    )
    .ok()?;
    frame::read(s).ok()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A raw agent registering queues on invented devices (and a few real ones) in every slot.
fn invent_devices(sock: &Path, rng: &mut Rng, f: &Figures) {
    let Some(mut s) = connect(sock) else { return };
    bump(&f.connections, 1);
    let Some(DaemonMsg::Welcome { bell, .. }) = hello(&mut s, Role::Agent) else {
        return;
    };
    // The segment and board descriptors follow the welcome.
    let _segment = xpreempt_ipc::unix::recv_fd(&s);
    let _board = bell.map(|_| xpreempt_ipc::unix::recv_fd(&s));
    for slot in 0..64 {
        let device = (rng.next() % 1_000_000) as u32;
        let decl = QueueDecl { device, ..decl(0) };
        if frame::write(&mut s, &ClientMsg::Register { slot, decl }).is_err() {
            return;
        }
        if frame::read::<DaemonMsg>(&mut s).is_err() {
            return;
        }
        bump(&f.invented_devices, 1);
    }
}

/// Connections that say hello and hold, and some that never say a word.
fn hold_connections(sock: &Path, f: &Figures, stop: &AtomicBool) {
    let mut held = Vec::new();
    for i in 0..150 {
        let Some(mut s) = connect(sock) else { break };
        bump(&f.connections, 1);
        if i % 5 == 0 {
            bump(&f.silent, 1);
        } else if !matches!(hello(&mut s, Role::Operator), Some(DaemonMsg::Ready)) {
            continue;
        }
        bump(&f.held, 1);
        held.push(s);
    }
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && !stop.load(SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Malformed, truncated, oversized and wrong-version frames, each on a connection of its own.
fn bad_frames(sock: &Path, rng: &mut Rng, f: &Figures) {
    let mut good = Vec::new();
    frame::write(
        &mut good,
        &ClientMsg::Hello {
            version: xpreempt_ipc::PROTOCOL_VERSION,
            role: Role::Operator,
            name: "fuzz".into(),
        },
    )
    .unwrap();
    for i in 0..20 {
        let Some(mut s) = connect(sock) else { return };
        bump(&f.connections, 1);
        let mut bytes = good.clone();
        match i % 4 {
            0 => bytes = (0..rng.next() % 64).map(|_| rng.next() as u8).collect(),
            1 => bytes[..4].copy_from_slice(&u32::MAX.to_le_bytes()),
            2 => {
                let at = 4 + (rng.next() as usize) % (bytes.len() - 4);
                bytes[at] ^= (rng.next() as u8) | 1;
            }
            _ => bytes[5] = 99, // another protocol version
        }
        let _ = s.write_all(&bytes);
        bump(&f.bad_frames_sent, 1);
    }
}

/// An application process starting: its agent must be ready at once whatever the daemon does,
/// and its queue must run every command once.
fn app_start(sock: &Path, dev: &Device, f: &Figures, churn: bool) {
    let t = Instant::now();
    let a = agent(sock, "app");
    let took = t.elapsed();
    bump(&f.app_starts, 1);
    f.app_start_max_us
        .fetch_max(took.as_micros() as u64, SeqCst);
    assert!(
        took < Duration::from_millis(500),
        "an application waited {took:?}"
    );
    if !churn {
        return;
    }
    bump(&f.churn_agents, 1);
    let q = queue(&a, dev, 3);
    for _ in 0..3 {
        q.submit(kernel(1, 200_000)).unwrap();
    }
    q.wait_all().unwrap();
    for s in 0..3 {
        assert_eq!(dev.dev.block_runs(q.hal(), s), vec![1], "churn command {s}");
    }
    bump(&f.churn_commands, 3);
}

fn stats(sock: &Path) -> Option<DaemonStats> {
    xpreempt_ipc::operator::Operator::connect_within(
        sock,
        Role::Operator,
        "soak",
        Duration::from_secs(5),
    )
    .ok()?
    .stats()
    .ok()
}

/// Memory samples of the daemon process now running.
struct Memory {
    pid: Mutex<u32>,
    samples: Mutex<Vec<(u32, u64, u64)>>,
}

#[test]
fn the_daemon_survives_attacks_while_live_clients_keep_being_served() {
    let secs: u64 = std::env::var("XPREEMPT_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let total = Duration::from_secs(secs);
    let sock = socket("soak");
    let args = ["--idle-timeout-ms", "2000", "--watchdog-ms", "300"];
    let daemon = Mutex::new(Some(DaemonProcess::start(&sock, &args)));
    let dev = Device::new();
    let f = Figures::default();
    let stop = AtomicBool::new(false);
    // Set while the daemon is stopped or being replaced: the live pair is not judged then.
    let down = AtomicBool::new(false);
    let mem = Memory {
        pid: Mutex::new(daemon.lock().unwrap().as_ref().unwrap().0.id()),
        samples: Mutex::new(Vec::new()),
    };
    let (be_agent, lc_agent) = (agent(&sock, "be"), agent(&sock, "lc"));
    let be = queue(&be_agent, &dev, 1);
    let lc = queue(&lc_agent, &dev, 10);
    let mut stats_before_kill = None;
    let started = Instant::now();
    std::thread::scope(|scope| {
        // The live pair: the low queue always busy, the high one preempting it every round.
        scope.spawn(|| {
            let mut submitted_lc = 0u64;
            while !stop.load(SeqCst) {
                while be.hal().completed() + 4 > be_submitted(&be) {
                    be.submit(kernel(1, 2_000_000)).unwrap();
                }
                let judged = !down.load(SeqCst) && be_agent.is_remote() && lc_agent.is_remote();
                let before = Preemptible::stats(&*be).preemptions;
                lc.submit(kernel(1, 5_000_000)).unwrap();
                submitted_lc += 1;
                let served = within(Duration::from_secs(2), || {
                    Preemptible::stats(&*be).preemptions > before
                });
                lc.wait_all().unwrap();
                let still = !down.load(SeqCst) && be_agent.is_remote() && lc_agent.is_remote();
                match (served, judged && still) {
                    (Some(_), _) => bump(&f.rounds_served, 1),
                    (None, false) => bump(&f.rounds_skipped, 1),
                    (None, true) => panic!("a live client was not served"),
                }
                assert_eq!(lc.hal().completed(), submitted_lc);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        // Attackers.
        scope.spawn(|| {
            let mut rng = Rng(0x2545_f491_4f6c_dd1d);
            while !stop.load(SeqCst) {
                invent_devices(&sock, &mut rng, &f);
                bad_frames(&sock, &mut rng, &f);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        scope.spawn(|| {
            while !stop.load(SeqCst) {
                hold_connections(&sock, &f, &stop);
            }
        });
        scope.spawn(|| {
            while !stop.load(SeqCst) {
                app_start(&sock, &dev, &f, true);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        // Memory.
        scope.spawn(|| {
            while !stop.load(SeqCst) {
                let pid = *mem.pid.lock().unwrap();
                if let Some((rss, hwm)) = memory(pid) {
                    mem.samples.lock().unwrap().push((pid, rss, hwm));
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        // The daemon stopped for a while at a third of the run, killed and replaced at two.
        std::thread::sleep(total / 3);
        down.store(true, SeqCst);
        daemon
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .signal(libc::SIGSTOP);
        for _ in 0..5 {
            app_start(&sock, &dev, &f, false);
        }
        std::thread::sleep(Duration::from_millis(1500));
        daemon
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .signal(libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(500));
        down.store(false, SeqCst);
        std::thread::sleep(total / 3);
        stats_before_kill = stats(&sock);
        down.store(true, SeqCst);
        drop(daemon.lock().unwrap().take()); // SIGKILL
        app_start(&sock, &dev, &f, false);
        let next = DaemonProcess::start(&sock, &args);
        *mem.pid.lock().unwrap() = next.0.id();
        *daemon.lock().unwrap() = Some(next);
        assert!(
            within(Duration::from_secs(10), || be_agent.is_remote()
                && lc_agent.is_remote())
            .is_some(),
            "the live pair did not come back to the restarted daemon"
        );
        down.store(false, SeqCst);
        let left = total.saturating_sub(started.elapsed());
        std::thread::sleep(left);
        stop.store(true, SeqCst);
    });
    be.wait_all().unwrap();
    lc.wait_all().unwrap();
    for (name, q) in [("low", &be), ("high", &lc)] {
        let n = q.hal().completed();
        for s in 0..n {
            assert_eq!(
                dev.dev.block_runs(q.hal(), s),
                vec![1],
                "{name} command {s}"
            );
        }
    }
    let after = stats(&sock).expect("the restarted daemon answers");
    let samples = mem.samples.lock().unwrap().clone();
    report(
        &f,
        &samples,
        stats_before_kill.as_ref(),
        &after,
        secs,
        &be,
        &lc,
    );
}

fn be_submitted(
    q: &xpreempt_core::xqueue::threaded::SharedXQueue<xpreempt_hal::reference::RefQueue>,
) -> u64 {
    Preemptible::stats(q).submitted
}

#[allow(clippy::too_many_arguments)]
fn report(
    f: &Figures,
    samples: &[(u32, u64, u64)],
    before: Option<&DaemonStats>,
    after: &DaemonStats,
    secs: u64,
    be: &xpreempt_core::xqueue::threaded::SharedXQueue<xpreempt_hal::reference::RefQueue>,
    lc: &xpreempt_core::xqueue::threaded::SharedXQueue<xpreempt_hal::reference::RefQueue>,
) {
    let hwm = samples.iter().map(|s| s.2).max().unwrap_or(0);
    // Growth: within the first daemon's life, the later half's peak against the earlier half's.
    let first: Vec<u64> = samples
        .iter()
        .filter(|s| s.0 == samples[0].0)
        .map(|s| s.1)
        .collect();
    let (early, late) = first.split_at(first.len() / 2);
    let early_max = early.iter().copied().max().unwrap_or(0);
    let late_max = late.iter().copied().max().unwrap_or(0);
    let refusals = |s: Option<&DaemonStats>| s.map(|s| s.refusals.clone()).unwrap_or_default();
    let mut refused = refusals(before);
    for (k, v) in refusals(Some(after)) {
        *refused.entry(k).or_default() += v;
    }
    let bad_frames = before.map_or(0, |s| s.bad_frames) + after.bad_frames;
    let devices = before
        .map_or(0, |s| s.devices.len())
        .max(after.devices.len());
    let g = |c: &AtomicU64| c.load(SeqCst);
    let figures = serde_json::json!({
        "seconds": secs,
        "connections_opened": g(&f.connections),
        "held_connections": g(&f.held),
        "silent_connections": g(&f.silent),
        "invented_registrations": g(&f.invented_devices),
        "churn_agents": g(&f.churn_agents),
        "churn_commands_run_once": g(&f.churn_commands),
        "bad_frames_sent": g(&f.bad_frames_sent),
        "bad_frames_counted": bad_frames,
        "refusals": refused,
        "device_schedulers_max": devices,
        "rss_kib_early_max": early_max,
        "rss_kib_late_max": late_max,
        "hwm_kib": hwm,
        "rounds_served": g(&f.rounds_served),
        "rounds_while_daemon_down": g(&f.rounds_skipped),
        "low_preemptions": Preemptible::stats(be).preemptions,
        "commands_run_once": be.hal().completed() + lc.hal().completed(),
        "app_starts": g(&f.app_starts),
        "app_start_max_us": g(&f.app_start_max_us),
    });
    eprintln!("{figures:#}");
    if let Ok(path) = std::env::var("XPREEMPT_SOAK_REPORT") {
        std::fs::write(PathBuf::from(path), format!("{figures:#}\n")).unwrap();
    }
    assert!(hwm < 256 * 1024, "the daemon's memory peaked at {hwm} KiB");
    assert!(
        late_max <= early_max + early_max / 2 + 16 * 1024,
        "the daemon's memory grew: {early_max} KiB early, {late_max} KiB late"
    );
    assert!(devices <= 16, "{devices} device schedulers");
    assert!(
        refused.get("device").copied().unwrap_or(0) > 0,
        "{refused:?}"
    );
    assert!(
        g(&f.rounds_served) >= secs,
        "{} rounds served",
        g(&f.rounds_served)
    );
    assert!(g(&f.churn_agents) > 0 && g(&f.app_starts) > 5);
}
