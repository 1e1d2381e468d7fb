//! The orderings CUDA defines between streams and for synchronous calls hold for launches the
//! shim buffered.

use crate::harness::{Proc, everywhere, native, run, window1};

#[test]
fn the_legacy_stream_and_blocking_streams_wait_for_each_others_buffered_launches() {
    everywhere("legacy-blocking", |o| {
        o.log.assert_in_order(&[10, 11, 12]);
        o.log.assert_in_order(&[20, 21, 22]);
        o.log.assert_in_order(&[30, 31, 32]);
        for r in 0..25 {
            let base = 100 + 10 * r;
            o.log.assert_in_order(&[base, base + 1, base + 2, base + 3]);
        }
    });
}

#[test]
fn the_legacy_stream_follows_blocking_streams_while_the_scheduler_takes_turns() {
    everywhere("rotation", |o| {
        for r in 0..40 {
            let base = 100 + 10 * r;
            for i in 0..4 {
                o.log.assert_before(base + i, base + 5);
                if r < 39 {
                    o.log.assert_before(base + 5, base + 10 + i);
                }
            }
        }
    });
}

#[test]
fn non_blocking_streams_are_exempt_from_the_legacy_streams_synchronization() {
    everywhere("nonblocking-exempt", |o| {
        // Kernel 3 (legacy) ran while gated kernel 1 of the non-blocking stream still ran.
        let (gated, legacy) = (o.log.kernel(1), o.log.kernel(3));
        assert!(
            legacy.end < gated.end,
            "{}: the legacy stream waited",
            o.label
        );
        let (gated, other) = (o.log.kernel(4), o.log.kernel(6));
        assert!(
            other.end < gated.end,
            "{}: the non-blocking stream waited",
            o.label
        );
        o.log.assert_in_order(&[1, 2]);
        o.log.assert_in_order(&[4, 5]);
    });
}

#[test]
fn per_thread_default_streams_have_queues_and_follow_the_legacy_stream() {
    everywhere("per-thread", |o| {
        o.log.assert_in_order(&[1, 2, 3]);
        o.log.assert_in_order(&[4, 5, 6]);
        o.log.assert_before(7, 8);
    });
}

#[test]
fn synchronous_copies_and_sets_come_after_buffered_launches() {
    everywhere("sync-memory", |o| {
        o.log.assert_in_order(&[1, 2, 3, 4, 5, 6, 7, 8]);
        o.log.assert_in_order(&[9, 10]);
    });
}

#[test]
fn memory_is_freed_after_the_buffered_launches_that_use_it() {
    everywhere("free-memory", |o| {
        o.log.assert_in_order(&[1, 2]);
        o.log.assert_in_order(&[3, 4]);
        // The driver's frees came after both kernels reached it.
        let free = o.log.position("free ", "").unwrap_or(usize::MAX);
        for id in ["id=2", "id=4"] {
            let submit = o.log.position("submit ", id).unwrap();
            assert!(submit < free, "{}: a free overtook kernel {id}", o.label);
        }
    });
}

#[test]
fn modules_and_libraries_are_unloaded_after_their_buffered_launches() {
    everywhere("unload", |o| {
        o.log.assert_in_order(&[1, 2, 3, 4]);
        assert_eq!(o.log.lines_with("unload ").len(), 2, "{}", o.label);
    });
}

#[test]
fn a_context_is_destroyed_reset_or_released_after_its_buffered_launches() {
    everywhere("ctx-teardown", |o| {
        o.log.assert_in_order(&[1, 2]);
        o.log.assert_in_order(&[3, 4]);
        o.log.assert_in_order(&[5, 6]);
        o.log.assert_in_order(&[8, 9]);
        o.log.assert_ran([7]);
        assert_eq!(o.log.lines_with("ctx-destroyed").len(), 3, "{}", o.label);
    });
}

/// A launch on the legacy stream does not wait for its own stream's buffer (its queue keeps the
/// order): here a gated kernel ahead of the buffer waits for the application, which opens the
/// gate only after that launch.
#[test]
fn a_launch_on_the_legacy_stream_does_not_wait_for_its_own_buffered_launches() {
    run("gate-own-legacy", &native());
    let env = [("APP_TIMEOUT_S", "5"), ("XPREEMPT_SHIM_LOG", "1")];
    let o = Proc::spawn("gate-own-legacy", &window1(), &env).finish();
    o.log.assert_in_order(&[1, 2, 3]);
    // The exit report says who waited (the final synchronize only), and how the queue's window
    // was fed.
    assert!(
        !o.stderr
            .lines()
            .any(|l| l.contains("cuLaunchKernel (") && l.contains("waits for buffered commands")),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr.lines().any(|l| l
            .contains("legacy stream queue: 3 commands, 2 launched from its buffer")
            && l.contains("launches: 1 by the application (mean ")
            && l.contains(", 2 from the buffer (mean ")),
        "{}",
        o.stderr
    );
}

/// An asynchronous set (and a device-to-device copy) is a command of its stream's queue: it goes
/// behind the stream's buffered launches without the host waiting for them, in every mode.
#[test]
fn an_asynchronous_set_is_buffered_behind_its_streams_launches_without_waiting() {
    everywhere("gate-set-async", |_| {});
}

/// Known limitation (tests/sim/app/gate.c): the shim orders a call after buffered commands by
/// blocking the host until they reach the driver; when a command in flight before them waits for
/// a host action the application takes only after that call, neither side moves (natively the
/// call returns at once). Here a window of one command keeps kernel 2 buffered behind gated
/// kernel 1, and a legacy-stream launch or an event record on the stream comes before the
/// application opens the gate.
#[test]
#[ignore = "known limitation: a call ordered after buffered commands blocks the host until they reach the driver, so a kernel in flight before them that waits for a later host action deadlocks"]
fn a_call_ordered_after_buffered_work_does_not_block_the_host() {
    for scenario in ["gate-legacy", "gate-record"] {
        run(scenario, &native());
        Proc::spawn(scenario, &window1(), &[("APP_TIMEOUT_S", "5")]).finish();
    }
}
