//! `xpreempt policy`: load, show and map get/set/dump against a private state directory.

use std::path::PathBuf;
use std::process::{Command, Output};

struct State(PathBuf);

impl State {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("xpreempt-cli-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        State(dir)
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_xpreempt"))
            .args(args)
            .env("XPREEMPT_STATE_DIR", &self.0)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("run xpreempt")
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }
}

impl Drop for State {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn object(name: &str) -> String {
    xpreempt_bpf::built_object(name)
        .unwrap_or_else(|e| panic!("{e}"))
        .display()
        .to_string()
}

#[test]
fn load_show_and_configure_maps() {
    let s = State::new("maps");
    let out = s.ok(&["policy", "load", &object("fixed_priority")]);
    assert!(
        out.contains("installed fixed_priority (1 hooks, 2 maps)"),
        "{out}"
    );
    let show: serde_json::Value =
        serde_json::from_str(&s.ok(&["--json", "policy", "show"])).unwrap();
    assert_eq!(show["name"], "fixed_priority");
    assert_eq!(show["hooks"][0]["hook"], "task_init");
    assert_eq!(show["maps"].as_array().unwrap().len(), 2);

    s.ok(&["policy", "map", "set", "priorities", "7", "-3"]);
    assert_eq!(s.ok(&["policy", "map", "get", "priorities", "7"]), "-3\n");
    let dump: serde_json::Value =
        serde_json::from_str(&s.ok(&["--json", "policy", "map", "dump", "priorities"])).unwrap();
    assert_eq!(dump["entries"][0]["key"], "7");
    assert_eq!(dump["entries"][0]["value_hex"], "fdffffff");

    // Reloading the same object keeps the configuration (same map definitions).
    s.ok(&["policy", "load", &object("fixed_priority")]);
    assert_eq!(s.ok(&["policy", "map", "get", "priorities", "7"]), "-3\n");
}

#[test]
fn a_rejected_object_leaves_the_installed_policy() {
    let s = State::new("reject");
    s.ok(&["policy", "load", &object("lcbe")]);
    for (bad, why) in [
        ("bad_loop", "loops are not allowed"),
        ("bad_oob", "out-of-bounds access"),
        ("bad_section", "is not a hook"),
    ] {
        let o = s.run(&["policy", "load", &object(bad)]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(why) && err.contains("previous policy stays"),
            "{bad}: {err}"
        );
    }
    assert!(s.ok(&["policy", "show"]).starts_with("policy lcbe"));
}

#[test]
fn bad_map_input_is_refused_clearly() {
    let s = State::new("input");
    let o = s.run(&["policy", "show"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no policy is installed"));
    s.ok(&["policy", "load", &object("lcbe")]);
    let err = |args: &[&str]| {
        let o = s.run(args);
        assert!(!o.status.success(), "{args:?} must fail");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(
        err(&["policy", "map", "get", "nope", "1"])
            .contains("pinned: task_stats_map, task_type_map")
    );
    assert!(err(&["policy", "map", "get", "task_type_map", "1"]).contains("no such key"));
    assert!(err(&["policy", "map", "set", "task_type_map", "1", "x"]).contains("not an integer"));
    assert!(
        err(&["policy", "map", "set", "task_stats_map", "1", "1,2"]).contains("wants 24 bytes")
    );
}

#[test]
fn concurrent_map_set_processes_lose_no_update() {
    const N: u32 = 40;
    let s = State::new("concurrent");
    s.ok(&["policy", "load", &object("fixed_priority")]);
    std::thread::scope(|scope| {
        for t in 0..2 {
            let s = &s;
            scope.spawn(move || {
                for i in 0..N {
                    let key = (t * N + i).to_string();
                    s.ok(&["policy", "map", "set", "priorities", &key, "5"]);
                }
            });
        }
    });
    let dump: serde_json::Value =
        serde_json::from_str(&s.ok(&["--json", "policy", "map", "dump", "priorities"])).unwrap();
    assert_eq!(
        dump["entries"].as_array().unwrap().len(),
        2 * N as usize,
        "every `map set` of both writers landed"
    );
}

#[test]
fn a_state_directory_others_may_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let s = State::new("unsafe");
    s.ok(&["policy", "load", &object("fixed_priority")]);
    std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = s.run(&["policy", "map", "set", "priorities", "1", "2"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("refusing the state directory") && err.contains("mode 777"),
        "{err}"
    );
}

#[test]
fn sim_runs_the_model_under_an_ebpf_policy_with_pinned_maps() {
    let s = State::new("sim");
    s.ok(&["policy", "load", &object("lcbe")]);
    s.ok(&["policy", "map", "set", "task_type_map", "1", "1"]);
    s.ok(&["policy", "map", "set", "task_type_map", "0", "0"]);
    let infer_lv3 = |args: &[&str]| {
        let v: serde_json::Value = serde_json::from_str(&s.ok(args)).unwrap();
        let lv3 = v["modes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mode"] == "lv3")
            .unwrap()
            .clone();
        lv3["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "infer")
            .unwrap()["latency_us"]
            .as_f64()
            .unwrap()
    };
    let lcbe = object("lcbe");
    let hpf = infer_lv3(&["--json", "sim", "--policy", "hpf"]);
    let program = infer_lv3(&["--json", "sim", "--policy", &lcbe, "--base-policy", "lcbe"]);
    let plain_lcbe = infer_lv3(&["--json", "sim", "--policy", "lcbe"]);
    assert!(
        (program - hpf).abs() <= hpf * 0.05,
        "program {program} vs hpf {hpf}"
    );
    assert!(
        plain_lcbe > hpf * 1.05,
        "without the pinned classification LC/BE cannot match HPF"
    );

    let o = s.run(&["sim", "--policy", &object("bad_oob")]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("out-of-bounds access"));
}
