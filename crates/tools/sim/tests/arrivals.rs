//! The scenario shorthands: `count = n` copies of a task, explicit arrival lists, and bursts.
//! Each is checked against the long form it stands for, and their limits are refused with the
//! field named.

use xpreempt_sim::report::{SimOptions, simulate};
use xpreempt_sim::runner::Mode;
use xpreempt_sim::scenario::Scenario;

const HEAD: &str = "name = \"short\"\nseed = 7\n";

fn task(name: &str, extra: &str, arrival: &str) -> String {
    format!(
        "[[tasks]]\nname = \"{name}\"\npriority = 1\nkernels = 2\n{extra}\n\
         kernel = {{ workgroups = 20, wg_us = 50.0, jitter = 0.2 }}\narrival = {{ {arrival} }}\n"
    )
}

fn parse(text: &str) -> Scenario {
    Scenario::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn parse_err(text: &str) -> String {
    match Scenario::parse(text) {
        Ok(s) => panic!("accepted:\n{text}\n{s:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_names(err: &str, words: &[&str]) {
    for w in words {
        assert!(err.contains(w), "`{w}` missing from: {err}");
    }
}

#[test]
fn count_makes_named_copies_that_run_like_tasks_written_out() {
    let hi = "[[tasks]]\nname = \"hi\"\npriority = 9\nkernels = 3\n\
              kernel = { workgroups = 80, wg_us = 40.0 }\narrival = { at_us = 300.0 }\n";
    let short = parse(&format!(
        "{HEAD}{}{hi}",
        task(
            "bg",
            "count = 3",
            "at_us = 0.0, count = 2, every_us = 900.0"
        )
    ));
    let names: Vec<&str> = short.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["bg-0", "bg-1", "bg-2", "hi"]);
    assert!(short.tasks.iter().all(|t| t.count == 1));
    let mut long = HEAD.to_string();
    for i in 0..3 {
        long += &task(
            &format!("bg-{i}"),
            "",
            "at_us = 0.0, count = 2, every_us = 900.0",
        );
    }
    long += hi;
    let long = parse(&long);
    assert_eq!(short, long);
    let modes = [Mode::None, Mode::Lv3];
    let (a, _) = simulate(&short, &modes, &SimOptions::default()).unwrap();
    let (b, _) = simulate(&long, &modes, &SimOptions::default()).unwrap();
    assert_eq!(a, b);
    // Three low queues and one high one, each with its own requests done.
    for m in &a.modes {
        assert!(m.exactly_once, "{}: {:?}", m.mode, m.problems);
        assert_eq!(m.tasks.len(), 4);
        assert_eq!(m.tasks[1].requests, 2);
    }
}

#[test]
fn poisson_copies_draw_their_own_gaps() {
    let s = parse(&format!(
        "{HEAD}{}",
        task(
            "p",
            "count = 2",
            "count = 5, every_us = 1000.0, poisson = true"
        )
    ));
    let of = |task: usize| -> Vec<u64> {
        let a = s.arrivals();
        a.iter().filter(|x| x.1 == task).map(|x| x.0).collect()
    };
    assert_eq!(of(0).len(), 5);
    assert_ne!(of(0), of(1));
}

#[test]
fn explicit_times_arrive_exactly_then_in_any_order() {
    let s = parse(&format!(
        "{HEAD}{}",
        task("t", "", "times_us = [150.0, 0.0, 100, 100]")
    ));
    let at: Vec<u64> = s.arrivals().iter().map(|a| a.0).collect();
    assert_eq!(at, [0, 100_000, 100_000, 150_000]);
    let (r, _) = simulate(&s, &[Mode::Lv2], &SimOptions::default()).unwrap();
    assert!(r.failures().is_empty(), "{:?}", r.failures());
    assert_eq!(r.modes[0].tasks[0].requests, 4);
}

#[test]
fn bursts_bring_several_requests_to_every_point() {
    let s = parse(&format!(
        "{HEAD}{}",
        task(
            "b",
            "",
            "at_us = 10.0, count = 2, every_us = 1000.0, burst = 3, burst_every_us = 5.0"
        )
    ));
    let at: Vec<u64> = s.arrivals().iter().map(|a| a.0).collect();
    assert_eq!(
        at,
        [10_000, 15_000, 20_000, 1_010_000, 1_015_000, 1_020_000]
    );
    let listed = parse(&format!(
        "{HEAD}{}",
        task("b", "", "times_us = [7.0], burst = 2")
    ));
    let at: Vec<u64> = listed.arrivals().iter().map(|a| a.0).collect();
    assert_eq!(at, [7_000, 7_000], "no burst_every_us: all at once");
    let (r, _) = simulate(&s, &[Mode::Lv1], &SimOptions::default()).unwrap();
    assert!(r.failures().is_empty(), "{:?}", r.failures());
    assert_eq!(r.modes[0].tasks[0].requests, 6);
}

#[test]
fn burst_one_leaves_a_poisson_series_as_it_was() {
    // The shipped multi-tenant scenario draws poisson gaps; spelling out the defaults must not
    // move a single arrival.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../scenarios/multi-tenant.toml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let before = parse(&text);
    let spelled = text.replace(
        "poisson = true }",
        "poisson = true, burst = 1, burst_every_us = 0.0 }",
    );
    assert_ne!(
        spelled, text,
        "the scenario has a poisson arrival to rewrite"
    );
    assert_eq!(parse(&spelled).arrivals(), before.arrivals());
}

#[test]
fn shorthand_limits_are_refused_with_the_field_named() {
    let one = |extra: &str, arrival: &str| format!("{HEAD}{}", task("a", extra, arrival));
    assert_names(
        &parse_err(&one("count = 0", "")),
        &["task `a`", "count must be at least 1"],
    );
    // Refused before four billion copies are made.
    let err = parse_err(&one("count = 4294967295", ""));
    assert_names(
        &err,
        &["count summed over tasks", "4294967295", "limit of 1024"],
    );
    let err = parse_err(&format!(
        "{}{}",
        one("count = 1000", ""),
        task("b", "count = 25", "")
    ));
    assert_names(&err, &["1025 tasks", "limit of 1024"]);
    let err = parse_err(&format!("{}{}", one("count = 2", ""), task("a-1", "", "")));
    assert_names(&err, &["task `a-1`", "name used twice"]);
    assert_names(
        &parse_err(&one("", "times_us = []")),
        &["task `a`", "times_us needs at least one time"],
    );
    for clash in [
        "count = 2",
        "at_us = 5.0",
        "every_us = 1.0",
        "poisson = true",
    ] {
        let err = parse_err(&one("", &format!("times_us = [1.0], {clash}")));
        assert_names(
            &err,
            &["task `a`", "leave out at_us, count, every_us and poisson"],
        );
    }
    for bad in ["nan", "inf", "-1.0"] {
        let err = parse_err(&one("", &format!("times_us = [1.0, {bad}]")));
        assert_names(&err, &["task `a` arrival.times_us[1]", "finite"]);
        let err = parse_err(&one("", &format!("burst = 2, burst_every_us = {bad}")));
        assert_names(&err, &["task `a` arrival.burst_every_us", "finite"]);
    }
    assert_names(
        &parse_err(&one("", "burst = 0")),
        &["arrival.burst must be at least 1"],
    );
    let err = parse_err(&one("", "times_us = [1e16]"));
    assert_names(&err, &["arrival.times_us[0]", "2^62 ns"]);
    let err = parse_err(&one(
        "",
        "times_us = [4e15], burst = 3, burst_every_us = 4e15",
    ));
    assert_names(
        &err,
        &[
            "the latest of times_us + (burst - 1) × burst_every_us",
            "2^62 ns",
        ],
    );
    let err = parse_err(&one(
        "",
        "count = 2, every_us = 4e15, burst = 2, burst_every_us = 4e15",
    ));
    assert_names(&err, &["(burst - 1) × burst_every_us", "2^62 ns"]);
    // Bursts count as requests: 1000 points × 1001 is past a million.
    let err = parse_err(&one("", "count = 1000, burst = 1001"));
    assert_names(&err, &["1001000 requests", "limit of 1000000"]);
    // Copies count too: 4 × 2 kernels × 2e6 requests.
    let err = parse_err(&one("count = 4", "count = 300000"));
    assert_names(&err, &["1200000 requests", "limit of 1000000"]);
}
