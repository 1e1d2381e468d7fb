//! The RM hooks through the daemon: a process's shim reports its channel groups, the daemon runs
//! the device's eBPF program at each event and answers with the decision; the maps are live for
//! the operator; a process that goes away without freeing its groups has them destroyed.

mod common;

use common::*;
use std::time::Duration;
use xpreempt_bpf::rm::rm_queue_id;
use xpreempt_ipc::msg::{ClientMsg, DaemonMsg, RmGroupDecl, Role};
use xpreempt_ipc::operator::Operator as Conn;

fn bpf_daemon(name: &str, policy: &str) -> (std::path::PathBuf, xpreempt_daemon::Daemon) {
    let sock = socket(name);
    let mut c = xpreempt_daemon::Config::new(sock.clone());
    c.policy = xpreempt_daemon::PolicySpec::Bpf {
        object: xpreempt_bpf::built_object(policy).expect("clang built the example policies"),
        base: "hpf".into(),
    };
    let d = xpreempt_daemon::Daemon::start(c).unwrap();
    (sock, d)
}

fn group(tsg: u32) -> ClientMsg {
    ClientMsg::RmTaskInit {
        group: RmGroupDecl {
            device: 0,
            tsg,
            default_timeslice_us: 1024,
            default_priority: 0,
            hint_class: 0,
        },
    }
}

fn admitted(c: &mut Conn, tsg: u32) -> bool {
    match c
        .ask(&ClientMsg::RmSchedule {
            device: 0,
            tsg,
            channels: 8,
        })
        .unwrap()
    {
        DaemonMsg::RmAdmission { allow, ran, .. } => {
            assert!(ran);
            allow
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_daemon_decides_a_groups_timeslice_from_its_live_maps() {
    let (sock, _d) = bpf_daemon("rm-ts", "rm_timeslice");
    let pid = std::process::id();
    // The operator configures this process before it creates anything (device 0 is open).
    let mut op = Operator::connect(&sock);
    let set = op.ask(&ClientMsg::PolicyMapUpdate {
        map: "process_timeslice_us".into(),
        key: pid.to_le_bytes().to_vec(),
        value: Some(10_000u64.to_le_bytes().to_vec()),
    });
    assert_eq!(set, DaemonMsg::Done { changed: 1 });
    let mut shim = Conn::connect_as(&sock, Role::Rm, "rm-test").unwrap();
    let DaemonMsg::RmDecision(d) = shim.ask(&group(5)).unwrap() else {
        panic!("no decision")
    };
    assert_eq!((d.timeslice_us, d.ran, d.note), (Some(10_000), true, None));
    let given = op.ask(&ClientMsg::PolicyMaps);
    let DaemonMsg::PolicyMaps(maps) = given else {
        panic!()
    };
    let m = maps.iter().find(|m| m.map == "given_us").unwrap();
    let id = rm_queue_id(pid, 0, 5);
    assert_eq!(
        m.entries,
        vec![(id.to_le_bytes().to_vec(), 10_000u64.to_le_bytes().to_vec())]
    );
    // Freed: task_destroy cleans up.
    shim.tell(&ClientMsg::RmTaskDestroy { device: 0, tsg: 5 })
        .unwrap();
    let cleaned = within(Duration::from_secs(2), || {
        let DaemonMsg::PolicyMaps(maps) = op.ask(&ClientMsg::PolicyMaps) else {
            return false;
        };
        maps.iter()
            .find(|m| m.map == "given_us")
            .is_some_and(|m| m.entries.is_empty())
    });
    assert!(cleaned.is_some());
}

#[test]
fn admission_holds_one_group_per_device_and_a_departed_process_releases_its_slot() {
    let (sock, _d) = bpf_daemon("rm-admit", "rm_admission");
    let mut first = Conn::connect_as(&sock, Role::Rm, "first").unwrap();
    let mut second = Conn::connect_as(&sock, Role::Rm, "second").unwrap();
    assert!(matches!(
        first.ask(&group(1)).unwrap(),
        DaemonMsg::RmDecision(_)
    ));
    assert!(matches!(
        second.ask(&group(2)).unwrap(),
        DaemonMsg::RmDecision(_)
    ));
    assert!(admitted(&mut first, 1));
    first
        .tell(&ClientMsg::RmEnabled { device: 0, tsg: 1 })
        .unwrap();
    assert!(!admitted(&mut second, 2), "the device's slot is held");
    // The first process dies without freeing its group: its connection closes.
    drop(first);
    let released = within(Duration::from_secs(2), || admitted(&mut second, 2));
    assert!(released.is_some(), "the slot was not released");
}

#[test]
fn without_an_ebpf_program_the_driver_defaults_stand() {
    let sock = socket("rm-none");
    let _d = daemon(&sock);
    let mut shim = Conn::connect_as(&sock, Role::Rm, "plain").unwrap();
    let DaemonMsg::RmDecision(d) = shim.ask(&group(1)).unwrap() else {
        panic!()
    };
    assert_eq!((d.timeslice_us, d.ran), (None, false));
    assert!(d.note.unwrap().contains("no eBPF program"));
    assert!(admitted_or_default(&mut shim));
}

fn admitted_or_default(c: &mut Conn) -> bool {
    matches!(
        c.ask(&ClientMsg::RmSchedule {
            device: 0,
            tsg: 1,
            channels: 8
        })
        .unwrap(),
        DaemonMsg::RmAdmission {
            allow: true,
            ran: false,
            ..
        }
    )
}
