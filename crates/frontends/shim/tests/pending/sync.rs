//! Synchronizations and queries account for commands the shim still holds.

use crate::harness::everywhere;

#[test]
fn stream_synchronize_waits_for_buffered_launches() {
    everywhere("stream-sync", |o| {
        o.log.assert_in_order(&[1, 2, 3]);
        let rounds: Vec<i64> = (0..30)
            .flat_map(|r| (0..4).map(move |j| 100 + 10 * r + j))
            .collect();
        o.log.assert_in_order(&rounds);
        o.log.assert_in_order(&[1000, 1001, 1010, 1011]);
    });
}

#[test]
fn stream_query_is_not_ready_while_a_launch_is_buffered() {
    everywhere("stream-query", |o| {
        o.log.assert_in_order(&[1, 2]);
        o.log
            .assert_ran((0..40).flat_map(|r| (0..3).map(move |j| 100 + 10 * r + j)));
    });
}

#[test]
fn context_synchronize_waits_for_every_streams_buffered_launches() {
    everywhere("ctx-sync", |o| {
        o.log.assert_in_order(&[1, 2]);
        o.log.assert_in_order(&[3, 4]);
        o.log
            .assert_ran((0..20).flat_map(|r| (0..6).map(move |j| 100 + 10 * r + j)));
    });
}

#[test]
fn event_query_and_synchronize_cover_launches_buffered_before_the_record() {
    everywhere("event-sync", |o| {
        o.log.assert_in_order(&[1, 2]);
        o.log
            .assert_ran((0..30).flat_map(|r| [100 + 10 * r, 101 + 10 * r]));
    });
}

#[test]
fn a_stream_waits_for_the_latest_record_of_an_event() {
    everywhere("wait-event", |o| {
        o.log.assert_in_order(&[1, 2, 3]);
        o.log.assert_before(3, 4);
        for r in 0..40 {
            o.log
                .assert_in_order(&[100 + 10 * r, 101 + 10 * r, 102 + 10 * r]);
        }
    });
}
