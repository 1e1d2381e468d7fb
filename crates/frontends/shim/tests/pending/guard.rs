//! Lv2 for guard-built kernels of an unmodified application (`XPREEMPT_LEVEL=2`): the simulated
//! driver models their blocks (each checks the flag word when it begins, skips itself when its
//! completion word holds the launch's epoch, and counts its runs), and the application launches
//! them with the guard header's placeholders. Checked: the shim fills in the guard parameters of
//! marked kernels only (never natively, at Lv1 or for a kernel without a marker); a suspension
//! stops a kernel between blocks and the resume relaunches exactly its missing blocks; every
//! block runs once and the stream's order holds under random suspensions; a copy behind a guarded
//! kernel makes the suspension drain instead; an unload forgets which handles are guarded.

use crate::harness::{
    Config, GuardRuns, Log, Outcome, Proc, chaos, defaults, lv2, lv3, native, pass_through, run,
    window1,
};
use crate::suspended::{hold_off, private_daemon, release, under_daemon};

const ROUNDS: i64 = 12;
const BLOCKS: u64 = 8;

/// The ids of `guard-basic`, in stream order, and which are guard-built with a marker.
fn basic_ids() -> Vec<(i64, Kind)> {
    let mut v = Vec::new();
    for r in 1..=ROUNDS {
        let id = 1000 * r;
        v.extend([
            (id + 1, Kind::Marked),
            (id + 2, Kind::Plain),
            (id + 3, Kind::Marked),
            (id + 4, Kind::Marked),
            (id + 5, Kind::Unmarked),
        ]);
    }
    v
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Marked,
    Unmarked,
    Plain,
}

fn guard_runs<'a>(log: &'a Log, id: i64, label: &str) -> &'a GuardRuns {
    log.guarded
        .get(&id)
        .unwrap_or_else(|| panic!("{label}: guarded kernel {id} never ran"))
}

/// Every block of every guard-built kernel ran once over its runs; one epoch per kernel.
fn assert_each_block_once(o: &Outcome, ids: &[(i64, Kind)]) {
    for &(id, kind) in ids {
        if kind == Kind::Plain {
            continue;
        }
        let r = guard_runs(&o.log, id, &o.label);
        assert_eq!(
            r.ran,
            BLOCKS,
            "{}: kernel {id} ran {} blocks over its runs {r:?} (log {})",
            o.label,
            r.ran,
            o.log.path.display()
        );
        assert_eq!(r.epochs.len(), 1, "{}: kernel {id}: {r:?}", o.label);
    }
}

/// (guarded launches, relaunches, stops ahead) from the program's `@guard` line.
fn counters(o: &Outcome) -> (u64, u64, u64) {
    let c = all_counters(o);
    (c[0], c[1], c[2])
}

/// The `@guard` line's counters, the stand-in timeslice's lowerings last.
fn all_counters(o: &Outcome) -> [u64; 4] {
    let line = o
        .stdout
        .iter()
        .find_map(|l| l.strip_prefix("@guard "))
        .unwrap_or_else(|| panic!("{}: no @guard line in {:?}", o.label, o.stdout));
    let get = |name: &str| -> u64 {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    [
        get("guarded="),
        get("relaunched="),
        get("stopped_ahead="),
        get("lv3_lowered="),
    ]
}

#[test]
fn guarded_kernels_run_every_block_once_in_order_at_every_level() {
    let ids = basic_ids();
    let order: Vec<i64> = ids.iter().map(|&(id, _)| id).collect();
    let configs: Vec<(Config, bool)> = vec![
        (native(), false),
        (pass_through(), false),
        (defaults(), false),
        (lv2(pass_through()), false),
        (lv2(defaults()), true),
        (lv2(window1()), true),
        (lv2(chaos(1)), true),
        (lv2(chaos(2)), true),
        (lv2(chaos(3)), true),
        (lv3(defaults()), true),
    ];
    let (mut stopped_midway, mut relaunched) = (0, 0);
    for (config, filled) in &configs {
        let o = run("guard-basic", config);
        assert_each_block_once(&o, &ids);
        o.log.assert_in_order(&order);
        let (guarded, re, _) = counters(&o);
        for &(id, kind) in &ids {
            if kind == Kind::Plain {
                continue;
            }
            let r = guard_runs(&o.log, id, &o.label);
            if kind == Kind::Unmarked || !filled {
                assert_eq!(
                    (r.with_guard, r.runs),
                    (0, 1),
                    "{}: kernel {id} ({kind:?}) got guard values or ran again: {r:?}",
                    o.label
                );
            }
        }
        let with_guard: usize = ids
            .iter()
            .filter(|&&(_, k)| k == Kind::Marked)
            .map(|&(id, _)| guard_runs(&o.log, id, &o.label).with_guard)
            .sum();
        if *filled {
            assert!(
                guarded > 0 && with_guard > 0,
                "{}: no guarded kernel got its guard values",
                o.label
            );
        } else {
            assert_eq!((guarded, re, with_guard), (0, 0, 0), "{}", o.label);
        }
        if config.name.starts_with("chaos") {
            stopped_midway += ids
                .iter()
                .map(|&(id, _)| o.log.guarded.get(&id).map_or(0, |r| r.stopped_midway))
                .sum::<usize>();
            relaunched += re;
        }
    }
    assert!(
        stopped_midway > 0 && relaunched > 0,
        "random suspensions never stopped a guarded kernel between its blocks ({stopped_midway} \
         stopped, {relaunched} relaunched): the relaunch was not tested"
    );
}

/// Level 3 adds to Lv2: with the process's timeslice available (a stand-in here), a suspension
/// both lowers the slice and stops guard-built kernels between their blocks, and the resume
/// relaunches exactly their missing blocks; plain kernels keep Lv1's window underneath.
#[test]
fn level_three_keeps_stopping_guarded_kernels_between_blocks() {
    let ids = basic_ids();
    let order: Vec<i64> = ids.iter().map(|&(id, _)| id).collect();
    let (mut lowered, mut relaunched, mut stopped_midway) = (0, 0, 0);
    for seed in 1..=3 {
        let o = run("guard-basic", &lv3(chaos(seed)));
        assert_each_block_once(&o, &ids);
        o.log.assert_in_order(&order);
        let [guarded, re, _, low] = all_counters(&o);
        assert!(
            guarded > 0,
            "{}: no guarded kernel got its guard values",
            o.label
        );
        lowered += low;
        relaunched += re;
        stopped_midway += ids
            .iter()
            .map(|&(id, _)| o.log.guarded.get(&id).map_or(0, |r| r.stopped_midway))
            .sum::<usize>();
    }
    assert!(
        lowered > 0,
        "no suspension lowered the timeslice: Lv3 was not used"
    );
    assert!(
        stopped_midway > 0 && relaunched > 0,
        "at level 3 no guarded kernel was stopped between its blocks ({stopped_midway} stopped, \
         {relaunched} relaunched): Lv2 is off under Lv3"
    );
}

#[test]
fn an_unload_forgets_which_kernel_handles_are_guarded() {
    for config in [native(), lv2(defaults())] {
        let o = run("guard-unload", &config);
        let r = guard_runs(&o.log, 301, &o.label);
        let want = usize::from(config.queued);
        assert_eq!(
            (r.with_guard, counters(&o).0),
            (want, want as u64),
            "{}: {r:?}",
            o.label
        );
        o.log.assert_in_order(&[301, 302]);
    }
}

/// A daemon; a low-priority process at Lv2 with a long guarded kernel running; a high-priority
/// holder takes the device while the low process checks what it sees; then the holder lets go.
fn suspended_mid_kernel(tail: bool) -> Outcome {
    let (daemon, socket) = private_daemon(&format!("guard-daemon-{tail}"));
    let tail_env = [("GUARD_TAIL", if tail { "1" } else { "0" })];
    let mut low = Proc::spawn("guard-suspend", &lv2(under_daemon(&socket, 0)), &tail_env);
    low.expect("@running");
    let (holder, _op) = hold_off(&socket, &low);
    low.send("check");
    low.expect("@checked");
    let o = release(holder, low);
    drop(daemon);
    o
}

#[test]
fn a_suspension_stops_a_guarded_kernel_between_blocks_and_the_resume_runs_the_rest() {
    let o = suspended_mid_kernel(false);
    let r = guard_runs(&o.log, 201, &o.label);
    assert_eq!(r.stopped, 1, "{}: {r:?}", o.label);
    assert_eq!(
        r.stopped_midway, 1,
        "{}: stopped before any block: {r:?}",
        o.label
    );
    assert!(r.runs >= 2 && r.with_guard == r.runs, "{}: {r:?}", o.label);
    assert_eq!(r.ran, BLOCKS, "{}: {r:?}", o.label);
    assert_eq!(r.epochs.len(), 1, "{}: {r:?}", o.label);
    assert!(counters(&o).1 >= 1, "{}: no relaunch counted", o.label);
    // The daemon's suspension set the flag before it took the stream's lock.
    assert_eq!(counters(&o).2, 1, "{}: the stop did not go ahead", o.label);
    // The plain kernel launched while it was stopped runs after all of its blocks.
    o.log.assert_before(201, 202);
}

#[test]
fn a_copy_behind_a_guarded_kernel_makes_its_suspension_drain() {
    let o = suspended_mid_kernel(true);
    let r = guard_runs(&o.log, 201, &o.label);
    assert_eq!(
        (r.stopped, r.runs, r.ran),
        (0, 1, BLOCKS),
        "{}: {r:?}",
        o.label
    );
    assert_eq!(
        r.with_guard, 1,
        "{}: the kernel got no guard values",
        o.label
    );
    assert_eq!(
        counters(&o).2,
        0,
        "{}: a stop went ahead of a copy behind the kernel",
        o.label
    );
}

#[test]
fn the_guard_scenarios_hold_on_the_driver_alone() {
    let mut p = Proc::spawn("guard-suspend", &native(), &[]);
    p.expect("@running");
    p.send("check");
    p.expect("@checked");
    p.send("finish");
    let o = p.finish();
    let r = guard_runs(&o.log, 201, &o.label);
    assert_eq!((r.stopped, r.runs, r.ran, r.with_guard), (0, 1, BLOCKS, 0));
}
