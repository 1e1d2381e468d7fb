//! Stream destroy, process exit and fork with work held by the shim; a device reset as the CUDA
//! runtime makes it; many threads at once; the error of a buffered launch.

use crate::harness::{everywhere, native, run, window1};

#[test]
fn a_destroyed_streams_buffered_launches_still_run() {
    everywhere("stream-destroy", |o| {
        o.log.assert_in_order(&[1, 2, 3]);
        for i in 0..20 {
            let base = 100 + 10 * i;
            o.log.assert_in_order(&[base, base + 1, base + 2]);
        }
    });
}

#[test]
fn buffered_launches_are_flushed_at_exit() {
    everywhere("exit-pending", |o| {
        o.log.assert_in_order(&(1..=10).collect::<Vec<_>>());
        o.log.assert_in_order(&(101..=110).collect::<Vec<_>>());
        o.log.assert_in_order(&(201..=205).collect::<Vec<_>>());
        let exit = o
            .log
            .position("exit ", "")
            .expect("the driver's exit handler ran");
        let last_submit = o
            .log
            .lines
            .iter()
            .rposition(|l| l.starts_with("submit "))
            .unwrap();
        assert!(
            last_submit < exit,
            "{}: work reached the driver after its exit handler",
            o.label
        );
    });
}

#[test]
fn a_forked_child_passes_through_and_launches_nothing_of_the_parents() {
    everywhere("fork-child", |o| {
        o.log.assert_in_order(&[1, 2, 3]);
        let child = o.log.lines_with("child ");
        for call in [
            "cuLaunchKernel",
            "cuStreamQuery",
            "cuStreamSynchronize",
            "cuCtxSynchronize",
        ] {
            assert!(
                child.iter().any(|l| l.split(' ').nth(1) == Some(call)),
                "{}: the child's {call} did not reach the driver: {child:?}",
                o.label
            );
        }
        let pids: std::collections::BTreeSet<&str> = o
            .log
            .lines_with("submit ")
            .iter()
            .filter_map(|l| l.split(' ').find(|f| f.starts_with("pid=")))
            .collect();
        assert_eq!(
            pids.len(),
            1,
            "{}: two processes submitted work: {pids:?}",
            o.label
        );
    });
}

#[test]
fn a_buffered_launch_the_driver_refuses_is_reported_at_the_next_synchronize() {
    for config in [native(), window1()] {
        let o = run("sticky-error", &config);
        let buffered: u32 = o
            .stdout
            .iter()
            .find_map(|l| l.strip_prefix("sticky buffered="))
            .and_then(|v| v.parse().ok())
            .expect("the scenario says how many refused launches were buffered");
        if config.queued {
            assert_eq!(
                buffered, 10,
                "{}: every refused launch waited behind a gate",
                o.label
            );
        } else {
            assert_eq!(buffered, 0);
        }
        // Every refused launch reached the driver once; the work after each still ran.
        assert_eq!(o.log.lines_with("refused ").len(), 10, "{}", o.label);
        for r in 1..=10 {
            o.log.assert_in_order(&[10 * r, 10 * r + 2]);
        }
    }
}

/// An application that checks with cuCtxSynchronize (cudaDeviceSynchronize) or polls
/// cuStreamQuery sees the error too (natively the launch call itself returned it).
#[test]
fn a_refused_buffered_launch_is_reported_by_a_context_synchronize_or_a_stream_query() {
    for config in [native(), window1()] {
        let o = run("sticky-elsewhere", &config);
        let buffered = o.stdout.iter().any(|l| l == "sticky buffered=4");
        assert_eq!(buffered, config.queued, "{}: {:?}", o.label, o.stdout);
        assert_eq!(o.log.lines_with("refused ").len(), 4, "{}", o.label);
    }
}

#[test]
fn many_threads_launching_at_once_keep_their_order() {
    everywhere("threads", |o| {
        for t in 1..=10 {
            let ids: Vec<i64> = (0..40).map(|i| 10000 * t + i).collect();
            o.log.assert_in_order(&ids);
        }
    });
}

/// cudaDeviceReset as the CUDA 13.0 runtime makes it: through libcuda's first version of
/// cuDevicePrimaryCtxReset (asked for at version 7000; found on the device, where the shim once
/// wrapped only `_v2`, so the reset went past it and a completion watcher later crashed inside
/// libcuda on an event of the reset context). The work queued before the reset runs before it,
/// and no event or stream of the reset context is used afterwards (a `violation` otherwise).
#[test]
fn a_device_reset_through_the_runtimes_entry_points_retires_the_queues_first() {
    everywhere("runtime-reset", |o| {
        o.log.assert_in_order(&[1, 2, 3, 4, 5, 6]);
        o.log.assert_ran([7]);
        o.log.assert_in_order(&[8, 9, 10, 11, 12, 13]);
        // The reset, and the last release.
        assert_eq!(o.log.lines_with("ctx-destroyed").len(), 2, "{}", o.label);
    });
}
