//! Global mode with agents in this process: the daemon suspends a low queue of one agent for a
//! high queue of another, nothing is lost, the daemon's death lets the low queue run at once,
//! and the agents come back to a restarted daemon.

mod common;

use common::*;
use std::time::Duration;
use xpreempt_core::HwQueue;
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_core::xqueue::threaded::Preemptible;

#[test]
fn a_high_queue_in_one_agent_suspends_a_low_queue_in_another_and_nothing_is_lost() {
    let sock = socket("basic");
    let _d = daemon(&sock);
    let dev = Device::new();
    let (a, b) = (agent(&sock, "low"), agent(&sock, "high"));
    assert!(a.is_remote() && b.is_remote());
    let low = queue(&a, &dev, 1);
    let high = queue(&b, &dev, 10);
    // 20 ms of low work: still running when the high queue comes 5 ms later, even on a busy
    // machine (with 8 ms it had drained now and then, and was never preempted).
    for _ in 0..40 {
        low.submit(kernel(2, 500_000)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(5));
    for _ in 0..5 {
        high.submit(kernel(1, 100_000)).unwrap();
    }
    assert!(
        within(Duration::from_secs(2), || Preemptible::stats(&*low)
            .preemptions
            > 0)
        .is_some(),
        "the daemon never suspended the low queue"
    );
    high.wait_all().unwrap();
    assert!(
        within(Duration::from_secs(2), || !low.is_suspended()).is_some(),
        "the low queue was not resumed after the high one went idle"
    );
    low.wait_all().unwrap();
    assert_eq!(low.hal().completed(), 40);
    assert_eq!(high.hal().completed(), 5);
    for s in 0..40 {
        assert_eq!(dev.dev.block_runs(low.hal(), s), vec![1, 1], "command {s}");
    }
    assert!(Preemptible::stats(&*low).preemptions >= 1);
    let mut op = Operator::connect(&sock);
    assert_eq!(op.list().len(), 2);
    // Idle reaches the daemon from the completion watchers, shortly after wait_all returns.
    let all_idle = within(Duration::from_secs(2), || {
        op.list().iter().all(|r| r.state == QueueState::Idle)
    });
    assert!(all_idle.is_some(), "{:?}", op.list());
}

#[test]
fn when_the_daemon_is_killed_agents_resume_their_queues_run_locally_and_come_back() {
    let sock = socket("death");
    let d = DaemonProcess::start(&sock, &[]);
    let dev = Device::new();
    let (a, b) = (agent(&sock, "low"), agent(&sock, "high"));
    let low = queue(&a, &dev, 1);
    let high = queue(&b, &dev, 10);
    for _ in 0..10 {
        high.submit(kernel(1, 100_000_000)).unwrap();
    }
    for _ in 0..10 {
        low.submit(kernel(1, 1_000_000)).unwrap();
    }
    assert!(within(Duration::from_secs(2), || low.is_suspended()).is_some());
    drop(d); // killed
    let resumed = within(Duration::from_secs(1), || !low.is_suspended());
    assert!(
        resumed.is_some(),
        "the low queue stayed suspended after the daemon died"
    );
    assert!(
        !a.is_remote(),
        "the agent did not notice the daemon's death"
    );
    let d2 = DaemonProcess::start(&sock, &[]);
    assert!(
        within(Duration::from_secs(3), || a.is_remote() && b.is_remote()).is_some(),
        "agents did not reconnect"
    );
    assert!(
        within(Duration::from_secs(2), || low.is_suspended()).is_some(),
        "the restarted daemon did not take over the decision"
    );
    drop(d2);
}

#[test]
fn prometheus_metrics_show_devices_and_queues() {
    use std::io::{Read, Write};
    let sock = socket("metrics");
    let mut c = xpreempt_daemon::Config::new(sock.clone());
    c.metrics = Some("127.0.0.1:0".parse().unwrap());
    let d = xpreempt_daemon::Daemon::start(c).unwrap();
    let dev = Device::new();
    let a = agent(&sock, "metered");
    let q = queue(&a, &dev, 4);
    q.submit(kernel(1, 1_000)).unwrap();
    q.wait_all().unwrap();
    let mut conn = std::net::TcpStream::connect(d.metrics_addr().unwrap()).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    for needle in [
        "# TYPE xpreempt_preemptions_total counter",
        "xpreempt_queues{device=\"0\",policy=\"hpf\"} 1",
        "xpreempt_queue_priority{device=\"0\",queue=\"0\"",
        "process=\"metered\"} 4",
        "xpreempt_clients 1",
    ] {
        assert!(body.contains(needle), "missing {needle:?} in\n{body}");
    }
}

/// The daemon runs the LC/BE example program; an operator reads its live maps (the submissions it
/// counted from `work_submit`) and sets a queue's class.
#[test]
fn an_operator_reads_and_edits_the_live_maps_of_the_daemons_ebpf_program() {
    let sock = socket("bpf");
    let mut c = xpreempt_daemon::Config::new(sock.clone());
    c.policy = xpreempt_daemon::PolicySpec::Bpf {
        object: xpreempt_bpf::built_object("lcbe").expect("clang built the example policies"),
        base: "hpf".into(),
    };
    let _d = xpreempt_daemon::Daemon::start(c).unwrap();
    let dev = Device::new();
    let a = agent(&sock, "classified");
    let q = queue(&a, &dev, 0);
    for _ in 0..5 {
        q.submit(kernel(1, 10_000)).unwrap();
    }
    q.wait_all().unwrap();
    let mut op = xpreempt_ipc::operator::Operator::connect(&sock).unwrap();
    let key = 0u64.to_le_bytes().to_vec();
    let counted = within(Duration::from_secs(2), || {
        op.policy_maps().unwrap().iter().any(|m| {
            m.map == "task_stats_map"
                && m.entries
                    .iter()
                    .any(|(k, v)| *k == key && v[..8] == 5u64.to_le_bytes())
        })
    });
    assert!(counted.is_some(), "{:?}", op.policy_maps());
    assert_eq!(
        op.policy_map_update(
            "task_type_map",
            key.clone(),
            Some(1u32.to_le_bytes().to_vec())
        )
        .unwrap(),
        1
    );
    let maps = op.policy_maps().unwrap();
    let types = maps.iter().find(|m| m.map == "task_type_map").unwrap();
    assert_eq!(types.entries, vec![(key, 1u32.to_le_bytes().to_vec())]);
    let bad = op.policy_map_update("no_such_map", vec![0; 8], None);
    assert!(bad.unwrap_err().to_string().contains("no map named"));
}
