//! Latency distributions per task and per priority tier, and what each mode cost the GPU.

use xpreempt_sim::report::{Distribution, SimOptions, simulate};
use xpreempt_sim::runner::Mode;
use xpreempt_sim::scenario::Scenario;

#[test]
fn percentiles_are_nearest_rank() {
    let v: Vec<u64> = (1..=100).map(|i| i * 1_000).collect();
    let d = Distribution::of(&v).unwrap();
    assert_eq!((d.p50, d.p90, d.p99, d.max), (50.0, 90.0, 99.0, 100.0));
    let one = Distribution::of(&[2_500]).unwrap();
    assert_eq!((one.p50, one.p99, one.max), (2.5, 2.5, 2.5));
    assert_eq!(Distribution::of(&[]), None);
}

#[test]
fn tiers_pool_the_requests_of_every_task_at_one_priority() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../scenarios/oversubscribed.toml"),
    )
    .unwrap();
    let s = Scenario::parse(&text).unwrap();
    let (report, runs) = simulate(&s, &[Mode::None, Mode::Lv3], &SimOptions::default()).unwrap();
    for (m, r) in report.modes.iter().zip(&runs) {
        let prios: Vec<i32> = m.tiers.iter().map(|t| t.priority).collect();
        assert_eq!(prios, [10, 1]);
        assert_eq!((m.tiers[0].tasks, m.tiers[1].tasks), (4, 36));
        assert_eq!(m.tiers[0].requests + m.tiers[1].requests, 40);
        let top = m.tiers[0].latency_pct_us.unwrap();
        let worst = m
            .tasks
            .iter()
            .filter(|t| t.priority == 10)
            .filter_map(|t| t.max_latency_us);
        assert_eq!(Some(top.max), worst.reduce(f64::max));
        // 40 queues on 32 HQD slots: each is mapped, and the HWS unmaps some to rotate.
        let hws = (m.runlists, m.maps, m.unmaps);
        assert!(hws.0 > 1 && hws.1 >= 40 && hws.2 > 0, "{}: {hws:?}", m.mode);
        assert_eq!(m.kernels, 200);
        let busy = m.gpu_utilization;
        assert!(busy > 0.0 && busy <= 1.0, "{busy}");
        assert!(r.cu_busy_ns > 0);
    }
}
