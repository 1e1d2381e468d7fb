//! The hardware priority of the process's work. Under MPS, stream priorities order the blocks of
//! different processes (they reach across MPS clients, `crates/backends/cuda/README.md`; running
//! blocks are not preempted, waiting ones of a higher stream go first), so a process
//! above logical priority 0 creates its streams at a stream priority that grows with its logical
//! one. The legacy default stream, where PyTorch works unless told otherwise, has the lowest
//! priority and cannot get another. (Running its graphs on a private stream of the process's
//! priority changed nothing measurable on the PyTorch pair and trio on an H100,
//! docs/results/h100-pytorch.md, and was removed.)

use super::driver::{self, SUCCESS};
use super::settings::settings;

/// The stream priority of work at logical priority `logical` on a device whose priorities run
/// from `least` (the default, e.g. 0) to `greatest` (e.g. -5; lower is higher): at 0 and below
/// the application's `requested`; above 0 one stream level per two logical levels, so that
/// three processes at 0, 5 and 10 get three different levels (0, -3, -5).
pub fn stream_priority_for(logical: i32, requested: i32, least: i32, greatest: i32) -> i32 {
    if logical <= 0 || greatest >= least {
        return requested;
    }
    let steps = logical.saturating_add(1) / 2;
    least.saturating_sub(steps).max(greatest)
}

/// The stream priority of this process's work (None: the application's own, since the process
/// is not above priority 0 or the device has one level).
pub fn process_stream_priority() -> Option<i32> {
    let s = settings();
    if !super::streams::enabled() || s.priority <= 0 {
        return None;
    }
    let (mut least, mut greatest) = (0i32, 0i32);
    if driver::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) != SUCCESS {
        return None;
    }
    let p = stream_priority_for(s.priority, least, least, greatest);
    (p != least).then_some(p)
}

/// The stream priority for a stream the application asked `requested` for: the process's, if
/// it has one (it orders the process against others; its own streams' order gives way).
pub fn stream_priority(requested: i32) -> i32 {
    process_stream_priority().unwrap_or(requested)
}

#[cfg(test)]
mod tests {
    use super::stream_priority_for;

    #[test]
    fn logical_priorities_above_zero_climb_the_stream_priorities_two_by_two() {
        let p = |logical| stream_priority_for(logical, 0, 0, -5);
        assert_eq!(
            [p(-3), p(0), p(1), p(2), p(5), p(9), p(10), p(100)],
            [0, 0, -1, -1, -3, -5, -5, -5]
        );
        // The application's own request stands at 0 and below, and on a one-level device.
        assert_eq!(stream_priority_for(0, -2, 0, -5), -2);
        assert_eq!(stream_priority_for(10, 0, 0, 0), 0);
    }
}
