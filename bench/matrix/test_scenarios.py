"""Tests of scenario validation and the run plan, no GPU: python3 -m unittest discover -s bench/matrix"""

import copy
import os
import sys
import unittest
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from scenarios import DEFAULT_MODES, WORKLOADS, ScenarioError, estimate_s, load, plan, select, validate  # noqa: E402

MATRIX = os.path.join(HERE, "scenarios", "matrix.json")

GOOD = {
    "jobs": {"lc": {"workload": "cuda-lc", "args": ["--util", "0.3"]}, "be": {"workload": "cuda-be"}},
    "scenarios": [
        {"name": "pair", "jobs": [{"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]},
        {"name": "two", "modes": ["native", "xp"],
         "jobs": [{"job": "lc", "name": "a", "role": "LC", "priority": 10, "extra_args": ["--arrival-seed", "1"]},
                  {"job": "lc", "name": "b", "role": "LC", "priority": 10, "extra_args": ["--arrival-seed", "2"]}]},
        {"name": "two-be", "modes": ["native"], "reference": {"scenario": "two", "mode": "native"},
         "jobs": [{"job": "lc", "name": "a", "role": "LC", "priority": 10, "extra_args": ["--arrival-seed", "1"]},
                  {"job": "be", "role": "BE", "priority": 0}]},
    ],
}


class Validation(unittest.TestCase):
    def broken(self, edit, needle):
        data = copy.deepcopy(GOOD)
        edit(data)
        with self.assertRaises(ScenarioError) as cm:
            validate(data, where="t.json")
        self.assertIn(needle, str(cm.exception))
        self.assertIn("t.json", str(cm.exception))

    def test_the_good_file_resolves_templates(self):
        s = validate(copy.deepcopy(GOOD))
        self.assertEqual([x["name"] for x in s], ["pair", "two", "two-be"])
        self.assertEqual(s[0]["modes"], DEFAULT_MODES)
        a, b = s[1]["jobs"]
        self.assertEqual(a["args"], ["--util", "0.3", "--arrival-seed", "1"])
        self.assertEqual(a["key"], b["key"], "replicas differing only in arrivals share an alone run")
        self.assertNotEqual(a["key"], s[0]["jobs"][1]["key"])

    def test_errors_say_where_and_why(self):
        self.broken(lambda d: d["scenarios"][0].update(colour="red"), "unknown key(s) colour")
        self.broken(lambda d: d["jobs"]["lc"].update(workload="nope"), "unknown workload 'nope'")
        self.broken(lambda d: d["scenarios"][0]["jobs"][0].update(role="HIGH"), "role must be LC or BE")
        self.broken(lambda d: d["scenarios"][0]["jobs"][1].update(role="LC"), "cannot be LC")
        self.broken(lambda d: d["scenarios"][0]["jobs"][0].update(priority="10"), "priority must be an integer")
        self.broken(lambda d: d["scenarios"][0]["jobs"][0].update(job="zz"), "unknown job template 'zz'")
        self.broken(lambda d: d["scenarios"][0]["jobs"][0].update(workload="cuda-lc"), "either job")
        self.broken(lambda d: d["scenarios"][0]["jobs"][0].update(args=["--x"]), "takes extra_args")
        self.broken(lambda d: d["scenarios"][0]["jobs"][0].update(extra_args="--x 1"), "list of strings")
        self.broken(lambda d: d["scenarios"][0]["jobs"][1].update(job="lc"), "used twice in the scenario")
        self.broken(lambda d: d["scenarios"][1].update(name="pair"), "used twice")
        self.broken(lambda d: d["scenarios"][1].update(name="alone"), "reserved")
        self.broken(lambda d: d["scenarios"][1].update(name="a b"), "letters, digits")
        self.broken(lambda d: d["scenarios"][1].update(modes=["native", "turbo"]), "unknown mode 'turbo'")
        self.broken(lambda d: d["scenarios"][1].update(modes=["alone"]), "unknown mode 'alone'")
        self.broken(lambda d: d["scenarios"][1].update(modes=[]), "non-empty")
        self.broken(lambda d: d["scenarios"][1].update(jobs=[]), "non-empty")
        self.broken(lambda d: d["scenarios"][0].pop("jobs"), "missing jobs")
        self.broken(lambda d: d["scenarios"][2]["reference"].update(scenario="gone"), "no scenario 'gone'")
        self.broken(lambda d: d["scenarios"][2]["reference"].update(mode="mps"), "does not run mode 'mps'")
        self.broken(lambda d: d["scenarios"][2]["reference"].update(mode="same", scenario="two") or
                    d["scenarios"][2].update(modes=["mps"]), "lacks mode(s) mps")
        self.broken(lambda d: d["scenarios"][2]["jobs"][0].update(name="z"), "no LC job of the same name")
        self.broken(lambda d: d.update(scenarios=[]), "non-empty list")

    def test_select_by_name_and_group_brings_references(self):
        s = validate(copy.deepcopy(GOOD))
        self.assertEqual([x["name"] for x in select(s, "two-be")], ["two", "two-be"])
        with self.assertRaises(ScenarioError) as cm:
            select(s, "pair,bogus")
        self.assertIn("bogus", str(cm.exception))


class ShippedMatrix(unittest.TestCase):
    def test_it_loads_and_spans_what_issue_38_asks(self):
        scenarios = load(MATRIX)
        pairs = [s for s in scenarios if "pairs" in s["groups"]]
        self.assertGreaterEqual(len(pairs), 6)
        for s in pairs:
            self.assertEqual([j["role"] for j in s["jobs"]], ["LC", "BE"], s["name"])
            self.assertEqual(set(s["modes"]), set(DEFAULT_MODES), s["name"])
        workloads = {j["workload"] for s in pairs for j in s["jobs"]}
        for w in ("resnet50-graph", "gpt2-decode", "cuda-lc", "train", "cuda-be", "cuda-persistent"):
            self.assertIn(w, workloads)
        be_args = [" ".join(j["args"]) for s in pairs for j in s["jobs"] if j["workload"] == "cuda-be"]
        self.assertTrue(any("--block-us 20" in a for a in be_args), "a BE of short blocks")
        self.assertTrue(any("--kernel-ms 4 --block-us 100" in a for a in be_args), "a BE of >= 3 ms kernels")
        self.assertTrue(any("--streams 8" in a for a in be_args), "a BE of many streams")

    def test_the_issue_36_cases_are_there(self):
        by = {s["name"]: s for s in load(MATRIX)}
        self.assertEqual(by["two-lc-be"]["reference"], {"scenario": "two-lc", "mode": "native"})
        self.assertEqual([j["priority"] for j in by["three-prio"]["jobs"]], [10, 5, 0])
        self.assertEqual(by["three-prio"]["reference"]["scenario"], "top-mid")
        for name in ("overlap-solo", "streams-solo"):
            self.assertEqual(len(by[name]["jobs"]), 1)

    def test_default_selection_leaves_out_extra_and_fits_two_commands(self):
        scenarios = load(MATRIX)
        default = select(scenarios, None)
        self.assertFalse([s for s in default if "extra" in s["groups"]])
        # the commands of README.md, each inside one 10-minute command with its deadline
        for only, duration in (("r50-vit", 3.0), ("gpt2-vit", 3.0), ("cuda-pairs,levels", 2.0)):
            est = estimate_s(plan(select(scenarios, only), 3), duration)
            self.assertLess(est, 560, f"{only}: {est:.0f} s does not fit one 10-minute command")


class Plan(unittest.TestCase):
    def setUp(self):
        self.scenarios = validate(copy.deepcopy(GOOD))

    def test_every_round_holds_every_mode_and_alone_once_per_job(self):
        runs = plan(self.scenarios, 3)
        ids = [r["id"] for r in runs]
        self.assertEqual(len(ids), len(set(ids)))
        for rnd in (1, 2, 3):
            got = Counter((r["scenario"], r["mode"]) for r in runs if r["round"] == rnd)
            want = Counter({("pair", m): 1 for m in DEFAULT_MODES})
            want.update({("two", "native"): 1, ("two", "xp"): 1, ("two-be", "native"): 1})
            want[("alone", "alone")] = 2  # the LC (both replicas share it) and the BE
            self.assertEqual(got, want, rnd)
        rounds = [r["round"] for r in runs]
        self.assertEqual(rounds, sorted(rounds), "rounds do not overlap: round 2 starts after round 1 ends")

    def test_alone_first_in_round_one_and_modes_rotate_and_stay_grouped(self):
        runs = plan(self.scenarios, 3)
        self.assertEqual(runs[0]["mode"], "alone")
        firsts = [next(r["mode"] for r in runs if r["round"] == k) for k in (1, 2, 3)]
        self.assertEqual(len(set(firsts)), 3, firsts)
        for k in (1, 2, 3):
            seq = [r["mode"] for r in runs if r["round"] == k]
            groups = [m for i, m in enumerate(seq) if i == 0 or seq[i - 1] != m]
            self.assertEqual(len(groups), len(set(groups)), f"round {k}: a mode's runs are not contiguous: {seq}")

    def test_a_mode_may_run_one_role_under_xpreempt_and_the_other_natively(self):
        from procs import Env
        lc, be = {"role": "LC", "priority": 10}, {"role": "BE", "priority": 0}
        run = ["/xp", "run", "--priority"]
        self.assertEqual(Env("xp", "/i", "/l", "/xp", "t").prefix(be), run + ["0", "--"])
        only_lc = Env("xp_lc_only", "/i", "/l", "/xp", "t")
        self.assertEqual((only_lc.prefix(lc), only_lc.prefix(be)), (run + ["10", "--"], []))
        only_be = Env("xp_be_only", "/i", "/l", "/xp", "t")
        self.assertEqual((only_be.prefix(lc), only_be.prefix(be)), ([], run + ["0", "--"]))
        lc_pass = Env("xp_lc_pass", "/i", "/l", "/xp", "t")
        self.assertEqual((lc_pass.prefix(lc), lc_pass.prefix(be)), (run + ["10", "--pass-through", "--"], run + ["0", "--"]))
        both = Env("xp_pass", "/i", "/l", "/xp", "t")
        self.assertEqual((both.prefix(lc), both.prefix(be)), (run + ["10", "--pass-through", "--"], run + ["0", "--pass-through", "--"]))

    def test_mode_filter_and_estimate(self):
        runs = plan(self.scenarios, 1, modes=["native"])
        self.assertEqual({r["mode"] for r in runs}, {"alone", "native"})
        self.assertGreater(estimate_s(runs, 3.0), 3.0 * len(runs))

    def test_every_workload_is_runnable_by_the_plan(self):
        for name, w in WORKLOADS.items():
            self.assertIn("startup_s", w, name)
            prog = w["program"]
            if isinstance(prog, str):
                self.assertTrue(os.path.exists(os.path.join(HERE, "..", "..", prog)), prog)


if __name__ == "__main__":
    unittest.main()
