//! Priority inheritance between one process's streams, under a real daemon: a stream's queue that
//! the operator lowered is suspended for a third process of a priority between the two; a launch on
//! the legacy stream, which CUDA orders after the lowered stream's buffered kernel, waits for that
//! kernel on behalf of the process's priority. The lowered queue inherits it and runs: the launch
//! returns while the third process still holds the device.

use crate::harness::{Proc, native};
use crate::suspended::{PATIENCE, held, private_daemon, under_daemon};
use std::time::{Duration, Instant};
use xpreempt_ipc::msg::Target;
use xpreempt_ipc::operator::Operator;

/// Long enough for a resume through the daemon on a loaded machine; a launch that waits for the
/// holder never returns before the test lets the holder go.
const LAUNCH_LIMIT: Duration = Duration::from_secs(20);

#[test]
fn an_ordering_wait_lends_its_priority_to_the_stream_it_waits_for() {
    let (daemon, socket) = private_daemon("inherit");
    let mut low = Proc::spawn("inherit", &under_daemon(&socket, 5), &[]);
    low.expect("@ready");
    let mut op = Operator::connect(&socket).expect("the operator connects");
    let pid = low.child.id();
    let rows = op.list().expect("list");
    let mine: Vec<_> = rows.iter().filter(|r| r.process == pid).collect();
    assert_eq!(mine.len(), 1, "one queue, stream b's: {rows:#?}");
    let b = mine[0].queue;
    assert_eq!(
        op.set_priority(Target::Queue(b), 1).expect("set-priority"),
        1
    );

    let mut holder = Proc::spawn("hold", &under_daemon(&socket, 3), &[]);
    holder.expect("@holding");
    let t = Instant::now();
    while !held(&op.list().expect("list"), pid) {
        assert!(
            t.elapsed() < PATIENCE,
            "stream b's queue was never suspended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    low.send("go");
    // The holder has not been let go: only inheritance can resume stream b's queue now.
    low.expect_within("@launched", LAUNCH_LIMIT);
    holder.send("release");
    holder.finish();
    low.send("finish");
    let o = low.finish();
    assert!(o.buffered >= 1, "{}: nothing was buffered", o.label);
    o.log.assert_before(42, 43);
    drop(daemon);
}

/// The same conversation with the simulated driver alone: the application's checks are CUDA's.
#[test]
fn the_inheritance_scenario_holds_on_the_driver_alone() {
    let mut low = Proc::spawn("inherit", &native(), &[]);
    low.expect("@ready");
    low.send("go");
    low.expect("@launched");
    low.send("finish");
    low.finish().log.assert_before(42, 43);
}
