use super::*;
use crate::policy::{self, Hpf};
use proptest::prelude::*;
use xpreempt_types::{Hints, Nanos, OpKind, Priority, QueueId};

fn hpf() -> Scheduler {
    Scheduler::new(Box::new(Hpf))
}

fn create(s: &mut Scheduler, id: u32, prio: Priority) {
    s.handle(0, SchedEvent::Created(QueueInfo::new(QueueId(id), prio)))
        .unwrap();
}

fn ready(s: &mut Scheduler, now: Nanos, id: u32) -> Vec<Action> {
    s.handle(
        now,
        SchedEvent::Ready {
            queue: QueueId(id),
            pending: 1,
        },
    )
    .unwrap()
    .to_vec()
}

#[test]
fn hpf_suspends_the_low_queue_in_one_step_and_resumes_it_when_the_high_one_idles() {
    let mut s = hpf();
    create(&mut s, 3, 3);
    create(&mut s, 12, 12);
    assert_eq!(
        ready(&mut s, 10, 3),
        vec![],
        "q12 is idle and above q3, so it stays allowed"
    );
    assert_eq!(ready(&mut s, 20, 12), vec![Action::Suspend(QueueId(3))]);
    assert!(s.is_allowed(QueueId(12)) && !s.is_allowed(QueueId(3)));
    assert_eq!(
        s.stats().inversions,
        1,
        "q12 waiting behind q3 was seen as an inversion"
    );
    let actions = s
        .handle(30, SchedEvent::Idle(QueueId(12)))
        .unwrap()
        .to_vec();
    assert_eq!(actions, vec![Action::Resume(QueueId(3))]);
    assert_eq!(s.stats().preemptions, 1);
    assert_eq!(s.stats().resumes, 1);
}

#[test]
fn a_higher_idle_queue_stays_allowed_so_its_first_submit_launches_at_once() {
    let mut s = hpf();
    create(&mut s, 0, 1);
    create(&mut s, 1, 9);
    ready(&mut s, 0, 0);
    assert!(s.is_allowed(QueueId(1)));
}

#[test]
fn aging_serves_a_starving_queue_within_the_bound() {
    let aging = Aging::new(1_000_000, 1, 100).unwrap();
    let mut s = hpf().with_aging(aging);
    create(&mut s, 0, 0);
    create(&mut s, 1, 5);
    ready(&mut s, 0, 1);
    ready(&mut s, 0, 0);
    assert!(!s.is_allowed(QueueId(0)));
    let bound = aging.bound_ns(5).unwrap();
    let mut served_at = None;
    while let Some(t) = s.next_wake() {
        if t > 10 * bound {
            break;
        }
        s.handle(t, SchedEvent::Timer).unwrap();
        if s.is_allowed(QueueId(0)) {
            served_at = Some(t);
            break;
        }
    }
    let served_at = served_at.expect("the low queue was never served");
    assert!(
        served_at <= bound,
        "served at {served_at} ns, bound {bound} ns"
    );
    // Once it has run for an interval its boost is spent and the high queue takes over again.
    let t = served_at + aging.interval_ns();
    s.handle(t, SchedEvent::Timer).unwrap();
    assert!(s.is_allowed(QueueId(1)) && !s.is_allowed(QueueId(0)));
}

#[test]
fn without_aging_the_low_queue_waits_forever() {
    let mut s = hpf();
    create(&mut s, 0, 0);
    create(&mut s, 1, 5);
    ready(&mut s, 0, 1);
    ready(&mut s, 0, 0);
    assert_eq!(s.next_wake(), None);
    s.handle(1_000_000_000, SchedEvent::Timer).unwrap();
    assert!(!s.is_allowed(QueueId(0)));
}

#[test]
fn interleave_limits_how_many_run_alongside() {
    let mut s = Scheduler::new(policy::by_name("lcbe").unwrap());
    let mut info = QueueInfo::new(QueueId(0), 5);
    info.interleave = Some(1);
    s.handle(0, SchedEvent::Created(info)).unwrap();
    for id in 1..4 {
        create(&mut s, id, 7);
    }
    for id in 0..4 {
        ready(&mut s, 0, id);
    }
    // Priorities 7,7,7 come first; q0 would have three others alongside but allows one.
    assert_eq!(
        (0..4).map(|i| s.is_allowed(QueueId(i))).collect::<Vec<_>>(),
        vec![false, true, true, true]
    );
}

struct DenyQueue(u32);
impl Hooks for DenyQueue {
    fn admit(&mut self, queue: QueueId, _: usize, _: usize) -> bool {
        queue.0 != self.0
    }
    fn task_init(&mut self, info: &mut QueueInfo) {
        info.priority += 100;
    }
}

#[test]
fn hooks_set_priority_and_refuse_admission() {
    let mut s = hpf().with_hooks(Box::new(DenyQueue(1)));
    create(&mut s, 0, 1);
    create(&mut s, 1, 2);
    assert_eq!(s.queue_info(QueueId(0)).unwrap().priority, 101);
    let actions = ready(&mut s, 0, 1);
    assert!(actions.contains(&Action::Refuse(QueueId(1))));
    assert!(!s.is_allowed(QueueId(1)));
    assert_eq!(s.stats().refusals, 1);
}

/// Promotes a queue to priority 50 once it has submitted 3 commands.
#[derive(Default)]
struct PromoteBusy(std::collections::BTreeMap<QueueId, u32>);
impl Hooks for PromoteBusy {
    fn work_submit(&mut self, queue: QueueId, _: Work, _: Nanos) {
        *self.0.entry(queue).or_default() += 1;
    }
    fn reclassify(&mut self, declared: &QueueInfo) -> Option<QueueInfo> {
        (self.0.get(&declared.id).is_some_and(|&n| n >= 3)).then(|| QueueInfo {
            priority: 50,
            ..declared.clone()
        })
    }
}

#[test]
fn hooks_reclassify_a_queue_when_it_becomes_ready_again() {
    let mut s = hpf().with_hooks(Box::new(PromoteBusy::default()));
    create(&mut s, 0, 1);
    create(&mut s, 1, 9);
    ready(&mut s, 0, 0);
    assert_eq!(s.queue_info(QueueId(0)).unwrap().priority, 1);
    for seq in 0..3 {
        s.hooks_mut().unwrap().work_submit(
            QueueId(0),
            Work::Submitted {
                kind: OpKind::Kernel,
                seq,
            },
            0,
        );
    }
    ready(&mut s, 1, 0);
    assert_eq!(
        s.queue_info(QueueId(0)).unwrap().priority,
        1,
        "only an idle queue is reclassified"
    );
    s.handle(2, SchedEvent::Idle(QueueId(0))).unwrap();
    ready(&mut s, 3, 0);
    assert_eq!(s.queue_info(QueueId(0)).unwrap().priority, 50);
    ready(&mut s, 4, 1);
    assert!(s.is_allowed(QueueId(0)) && !s.is_allowed(QueueId(1)));
}

#[test]
fn a_refused_queue_neither_competes_nor_stays_refused_once_idle() {
    let mut s = hpf().with_hooks(Box::new(DenyQueue(1)));
    create(&mut s, 0, 1);
    create(&mut s, 1, 2);
    ready(&mut s, 0, 0);
    ready(&mut s, 1, 1);
    // q1 (priority 102 after task_init) is refused: it must not push q0 aside.
    assert!(s.is_allowed(QueueId(0)), "a refused queue took the device");
    // Asking again changes nothing while the hook still refuses, and does not make it active.
    let actions = s
        .handle(2, SchedEvent::Admission(QueueId(1)))
        .unwrap()
        .to_vec();
    assert_eq!(actions, vec![Action::Refuse(QueueId(1))]);
    assert_eq!(s.stats().refusals, 2);
    let actions = s.handle(3, SchedEvent::Idle(QueueId(1))).unwrap().to_vec();
    assert!(actions.contains(&Action::Admit(QueueId(1))), "{actions:?}");
}

#[test]
fn a_queue_yields_a_confined_higher_queues_units_before_it_runs_and_takes_them_back_after() {
    let units = xpreempt_types::ComputeUnits::range(0, 16);
    let mut s = hpf();
    let mut low = QueueInfo::new(QueueId(0), 3);
    low.confinable = true;
    let mut high = QueueInfo::new(QueueId(1), 12);
    high.compute_units = Some(units.clone());
    for info in [low, high, QueueInfo::new(QueueId(2), 12)] {
        s.handle(0, SchedEvent::Created(info)).unwrap();
    }
    ready(&mut s, 0, 0);
    assert_eq!(ready(&mut s, 10, 1), vec![Action::Confine(QueueId(0))]);
    assert_eq!(s.yielded_units(QueueId(0)), Some(&units));
    // A higher queue on every unit stops it; it runs off the 16 units again once that one idles.
    assert_eq!(ready(&mut s, 20, 2), vec![Action::Suspend(QueueId(0))]);
    let back = s.handle(30, SchedEvent::Idle(QueueId(2))).unwrap().to_vec();
    assert_eq!(back, vec![Action::Resume(QueueId(0))]);
    let all = s.handle(40, SchedEvent::Idle(QueueId(1))).unwrap().to_vec();
    assert_eq!(all, vec![Action::Confine(QueueId(0))]);
    assert_eq!(s.yielded_units(QueueId(0)), None);
    assert_eq!(
        s.preemption_ranks(),
        None,
        "a queue that may yield is not stopped by rank"
    );
    // One that failed to move is stopped from then on.
    s.confine_failed(QueueId(0)).unwrap();
    assert_eq!(ready(&mut s, 50, 1), vec![Action::Suspend(QueueId(0))]);
}

/// A queue whose hardware refuses to move it: the answer that confines it does not resume it,
/// and the next one stops it.
#[test]
fn a_queue_that_cannot_be_confined_is_stopped_instead() {
    struct Stuck(Vec<&'static str>);
    impl QueueControl for Stuck {
        fn suspend(
            &mut self,
            _: Nanos,
        ) -> Result<Option<QueueReport>, crate::xqueue::QueueOpError> {
            self.0.push("suspend");
            Ok(None)
        }
        fn resume(&mut self, _: Nanos) -> Result<Option<QueueReport>, crate::xqueue::QueueOpError> {
            self.0.push("resume");
            Ok(None)
        }
        fn set_refused(&mut self, _: bool) {}
    }
    let driver = || {
        let mut d = Driver::new(hpf());
        let mut low = QueueInfo::new(QueueId(0), 3);
        low.confinable = true;
        let mut high = QueueInfo::new(QueueId(1), 12);
        high.compute_units = Some(xpreempt_types::ComputeUnits::range(0, 16));
        for info in [low, high, QueueInfo::new(QueueId(2), 20)] {
            d.register(info, Stuck(vec![]), &|| 0).unwrap();
        }
        d
    };
    let ready = |generation| QueueReport::Ready {
        pending: 1,
        generation,
    };
    let calls = |d: &Driver<Stuck>| d.queue(QueueId(0)).unwrap().0.clone();
    // Running when the confined queue comes: stopped, since it could not yield.
    let mut d = driver();
    d.report(QueueId(0), ready(1), &|| 1).unwrap();
    d.report(QueueId(1), ready(1), &|| 2).unwrap();
    assert_eq!(calls(&d), vec!["suspend"]);
    assert!(!d.scheduler().is_allowed(QueueId(0)));
    // Stopped for the queue on every unit; when that one idles it would yield and resume, but
    // the confine fails: the resume is held, nothing else is asked of it, and it stays stopped.
    let mut d = driver();
    d.report(QueueId(2), ready(1), &|| 1).unwrap();
    d.report(QueueId(1), ready(1), &|| 2).unwrap();
    d.report(QueueId(2), QueueReport::Idle { generation: 2 }, &|| 3)
        .unwrap();
    assert_eq!(calls(&d), vec!["suspend"]);
    assert!(!d.scheduler().is_allowed(QueueId(0)));
}

#[test]
fn a_failed_resume_is_asked_for_again() {
    let mut s = hpf();
    create(&mut s, 0, 1);
    create(&mut s, 1, 9);
    ready(&mut s, 0, 0);
    ready(&mut s, 1, 1);
    let actions = s.handle(2, SchedEvent::Idle(QueueId(1))).unwrap().to_vec();
    assert_eq!(actions, vec![Action::Resume(QueueId(0))]);
    s.resume_failed(QueueId(0), 2).unwrap();
    assert!(!s.is_allowed(QueueId(0)));
    let retry = s.next_wake().expect("a retry is scheduled");
    assert_eq!(retry, 2 + RESUME_RETRY_NS);
    let actions = s.handle(retry, SchedEvent::Timer).unwrap().to_vec();
    assert_eq!(actions, vec![Action::Resume(QueueId(0))]);
}

#[test]
fn bad_events_are_errors_not_panics() {
    let mut s = hpf();
    assert_eq!(
        s.handle(0, SchedEvent::Idle(QueueId(7))).unwrap_err(),
        SchedError::UnknownQueue(QueueId(7))
    );
    create(&mut s, 1, 0);
    assert_eq!(
        s.handle(0, SchedEvent::Created(QueueInfo::new(QueueId(1), 0)))
            .unwrap_err(),
        SchedError::DuplicateQueue(QueueId(1))
    );
    let hints = Hints {
        utilization_share: Some(0.0),
        ..Hints::default()
    };
    let err = s
        .handle(
            0,
            SchedEvent::Hints {
                queue: QueueId(1),
                hints,
            },
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "queue q1: utilization share 0 is out of range: it must be in (0, 1]"
    );
}

#[derive(Clone, Debug)]
enum Ev {
    Ready(u32),
    Idle(u32),
    Tick(Nanos),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0..5u32).prop_map(Ev::Ready),
        (0..5u32).prop_map(Ev::Idle),
        (1..3_000_000u64).prop_map(Ev::Tick),
    ]
}

/// Applies `e` to the first `n` queues; false where it names a queue beyond them.
fn apply(s: &mut Scheduler, now: &mut Nanos, e: Ev, n: u32) -> bool {
    match e {
        Ev::Ready(q) if q < n => {
            ready(s, *now, q);
        }
        Ev::Idle(q) if q < n => {
            s.handle(*now, SchedEvent::Idle(QueueId(q))).unwrap();
        }
        Ev::Tick(dt) => {
            *now += dt;
            s.handle(*now, SchedEvent::Timer).unwrap();
        }
        _ => return false,
    }
    true
}

proptest! {
    /// Under HPF with distinct priorities, an allowed active queue never has a lower priority than
    /// a waiting one (ties excluded by construction), and idle-above-top queues stay allowed.
    #[test]
    fn hpf_respects_priority(prios in proptest::collection::vec(-50i32..50, 5), events in proptest::collection::vec(ev(), 1..60)) {
        let mut prios = prios;
        prios.sort_unstable();
        prios.dedup();
        let n = prios.len() as u32;
        let mut s = hpf();
        for (i, &p) in prios.iter().enumerate() { create(&mut s, i as u32, p); }
        let mut now = 0;
        for e in events {
            if !apply(&mut s, &mut now, e, n) {
                continue;
            }
            let views = s.views();
            let top = views.iter().filter(|v| v.is_active()).map(|v| v.logical_priority).max();
            for v in views {
                let allowed = s.is_allowed(v.id);
                match top {
                    Some(top) => prop_assert_eq!(allowed, v.logical_priority >= top, "queue {} prio {} top {}", v.id, v.logical_priority, top),
                    None => prop_assert!(allowed),
                }
            }
        }
    }

    /// With aging, every queue that has work is allowed within its bound, whatever else is busy.
    #[test]
    fn aging_prevents_starvation(prios in proptest::collection::vec(0i32..20, 2..5), interval in 1_000u64..1_000_000) {
        let aging = Aging::new(interval, 1, 1_000).unwrap();
        let mut s = hpf().with_aging(aging);
        for (i, &p) in prios.iter().enumerate() { create(&mut s, i as u32, p); }
        for i in 0..prios.len() { ready(&mut s, 0, i as u32); }
        let spread = prios.iter().max().unwrap() - prios.iter().min().unwrap();
        // Each queue waits at most for the others' boosts to run out plus its own climb.
        let bound = aging.bound_ns(spread).unwrap() + prios.len() as u64 * 2 * interval;
        let mut last_served = vec![0u64; prios.len()];
        let mut now = 0;
        while now < 20 * bound {
            let Some(next) = s.next_wake() else {
                // No timer: nobody waits, so everyone runs (aged level with the others).
                for i in 0..prios.len() {
                    prop_assert!(s.is_allowed(QueueId(i as u32)), "queue {} waits without a timer", i);
                }
                break;
            };
            now = next;
            s.handle(now, SchedEvent::Timer).unwrap();
            for (i, last) in last_served.iter_mut().enumerate() {
                if s.is_allowed(QueueId(i as u32)) { *last = now; }
                prop_assert!(now - *last <= bound, "queue {} unserved for {} ns (bound {})", i, now - *last, bound);
            }
        }
    }
}

proptest! {
    /// The fast path's contract (`Policy::preemption_rank`), checked against what the scheduler
    /// decides under HPF (with ties and aging) and LC/BE: an active queue of higher rank stops
    /// every strictly lower one, and a queue with no active queue above it runs (equals together).
    #[test]
    fn preemption_ranks_agree_with_the_decisions(
        prios in proptest::collection::vec(-3i32..3, 2..6),
        events in proptest::collection::vec(ev(), 1..60),
        lcbe: bool,
        aged: bool,
    ) {
        let n = prios.len() as u32;
        let policy: Box<dyn policy::Policy> =
            if lcbe { Box::new(policy::LcBe::default()) } else { Box::new(Hpf) };
        let mut s = Scheduler::new(policy);
        if aged {
            s = s.with_aging(Aging::new(500_000, 1, 10).unwrap());
        }
        for (i, &p) in prios.iter().enumerate() { create(&mut s, i as u32, p); }
        let mut now = 0;
        for e in events {
            if !apply(&mut s, &mut now, e, n) {
                continue;
            }
            let ranks = s.preemption_ranks().expect("both policies have a preemptive order");
            prop_assert_eq!(ranks.len(), prios.len());
            for y in &ranks {
                prop_assert_eq!(y.allowed, s.is_allowed(y.id));
                let higher_active = ranks.iter().any(|x| x.id != y.id && x.active && x.rank > y.rank);
                if higher_active {
                    prop_assert!(!y.allowed, "{:?} runs under a higher active queue: {:?}", y, ranks);
                } else {
                    prop_assert!(y.allowed, "{:?} has no active queue above it but is stopped: {:?}", y, ranks);
                }
            }
        }
    }
}

#[test]
fn no_ranks_where_the_scheduler_alone_may_decide() {
    let mut s = Scheduler::new(policy::by_name("fifo").unwrap());
    create(&mut s, 0, 1);
    assert!(
        s.preemption_ranks().is_none(),
        "fifo has no preemptive order"
    );
    let mut s = hpf();
    create(&mut s, 0, 1);
    assert_eq!(s.preemption_ranks().unwrap()[0].rank, 1);
    let mut info = QueueInfo::new(QueueId(1), 5);
    info.interleave = Some(0);
    s.handle(0, SchedEvent::Created(info)).unwrap();
    assert!(
        s.preemption_ranks().is_none(),
        "an interleave limit may leave a queue out"
    );
}

#[test]
fn an_inherited_priority_lifts_a_queue_until_it_is_returned() {
    let mut s = hpf();
    create(&mut s, 0, 1);
    create(&mut s, 1, 5);
    ready(&mut s, 0, 0);
    ready(&mut s, 1, 1);
    assert!(!s.is_allowed(QueueId(0)));
    let inherit = |p| SchedEvent::Inherit {
        queue: QueueId(0),
        priority: p,
    };
    s.handle(2, inherit(Some(9))).unwrap();
    assert!(s.is_allowed(QueueId(0)) && !s.is_allowed(QueueId(1)));
    assert_eq!(s.views()[0].effective_priority, 9);
    assert_eq!(s.views()[0].logical_priority, 1);
    s.handle(3, inherit(Some(5))).unwrap();
    assert!(
        s.is_allowed(QueueId(0)) && s.is_allowed(QueueId(1)),
        "equal: together"
    );
    s.handle(4, inherit(None)).unwrap();
    assert!(!s.is_allowed(QueueId(0)) && s.is_allowed(QueueId(1)));
}

proptest! {
    /// The priority rule under HPF, for any priorities (ties included), activity and compute
    /// units: a queue runs exactly when no queue with work ranks strictly above it on units it
    /// may share, or when it can yield units and every such queue is confined to some (unless
    /// that leaves it none): then it runs off exactly their units, and otherwise on all of its
    /// own. So nothing is stopped without a strictly higher active queue, every active queue at
    /// the top runs, and a queue on disjoint units is never stopped.
    #[test]
    fn hpf_stops_a_queue_only_for_a_strictly_higher_one_it_shares_units_with(
        prios in proptest::collection::vec(0i32..4, 2..6),
        units in proptest::collection::vec(proptest::option::of(0u32..3), 6),
        confinable in proptest::collection::vec(any::<bool>(), 6),
        events in proptest::collection::vec(ev(), 1..60),
    ) {
        use xpreempt_types::ComputeUnits;
        let n = prios.len() as u32;
        let mut s = hpf();
        let mask = |u: Option<u32>| u.map(|k| ComputeUnits::range(k * 10, 10));
        for (i, &p) in prios.iter().enumerate() {
            let mut info = QueueInfo::new(QueueId(i as u32), p);
            info.compute_units = mask(units[i]);
            info.confinable = confinable[i];
            s.handle(0, SchedEvent::Created(info)).unwrap();
        }
        let mut now = 0;
        for e in events {
            if !apply(&mut s, &mut now, e, n) {
                continue;
            }
            let views = s.views().to_vec();
            for v in &views {
                let holders: Vec<_> = views.iter().filter(|h| {
                    h.is_active()
                        && h.effective_priority > v.effective_priority
                        && xpreempt_types::may_share(v.compute_units.as_ref(), h.compute_units.as_ref())
                }).collect();
                let avoid = holders.iter().try_fold(None, |acc: Option<ComputeUnits>, h| {
                    let u = h.compute_units.as_ref()?;
                    Some(Some(acc.map_or_else(|| u.clone(), |a| a.union(u))))
                }).flatten();
                let yields = avoid.filter(|a| {
                    confinable[v.id.0 as usize]
                        && v.compute_units.as_ref().is_none_or(|own| !own.without(a).is_empty())
                });
                let allowed = holders.is_empty() || yields.is_some();
                prop_assert_eq!(s.is_allowed(v.id), allowed, "{:?} among {:?}", v, views);
                if allowed {
                    prop_assert_eq!(s.yielded_units(v.id), yields.as_ref(), "{:?} among {:?}", v, views);
                }
            }
        }
    }
}
