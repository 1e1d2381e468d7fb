"""Tests of the summary and the Pareto SVG on hand-made run records, no GPU:
python3 -m unittest discover -s bench/matrix"""

import os
import sys
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import markdown, summarize  # noqa: E402
from scenarios import validate  # noqa: E402
from svg import nice_ticks, pareto_front, pareto_svg  # noqa: E402

SCEN = validate({
    "jobs": {"lc": {"workload": "cuda-lc"}, "be": {"workload": "cuda-be"}},
    "scenarios": [
        {"name": "solo-lc", "modes": ["native"], "jobs": [{"job": "lc", "role": "LC", "priority": 10}]},
        {"name": "pair", "modes": ["native", "xp"], "reference": {"scenario": "solo-lc", "mode": "native"},
         "jobs": [{"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]},
    ]})
LC_KEY, BE_KEY = SCEN[1]["jobs"][0]["key"], SCEN[1]["jobs"][1]["key"]


def lc(lat, digest="d", **kw):
    return {"key": LC_KEY, "role": "LC", "status": "ok", "latencies_ms": lat, "services_ms": [x / 2 for x in lat],
            "digest": digest, "u_gpu": 0.25, "u": 0.3, **kw}


def be(tput, digest="c", exact=True, **kw):
    return {"key": BE_KEY, "role": "BE", "status": "ok", "throughput": tput, "unit": "kernels", "digest": digest,
            "exact": exact, "covered": True, **kw}


def runs():
    base = [float(i % 100 + 1) for i in range(1000)]  # p99 = 99
    out = []
    for r in (1, 2, 3):
        out.append({"id": f"r{r}-a1", "round": r, "scenario": "alone", "mode": "alone", "jobs": {LC_KEY: lc(base)}})
        out.append({"id": f"r{r}-a2", "round": r, "scenario": "alone", "mode": "alone", "jobs": {BE_KEY: be(100.0)}})
        out.append({"id": f"r{r}-s", "round": r, "scenario": "solo-lc", "mode": "native", "jobs": {"lc": lc(base)}})
        out.append({"id": f"r{r}-n", "round": r, "scenario": "pair", "mode": "native",
                    "jobs": {"lc": lc([x * 3 for x in base]), "be": be(90.0)}})
        xp_be = be(50.0 + r, digest="other" if r == 3 else "c")
        out.append({"id": f"r{r}-x", "round": r, "scenario": "pair", "mode": "xp",
                    "jobs": {"lc": lc([x * 1.1 for x in base]), "be": xp_be}})
    # a failed round of xp: counted in runs, not in the statistics
    out.append({"id": "r4-x", "round": 4, "scenario": "pair", "mode": "xp", "status": "failed", "error": "boom",
                "jobs": {"lc": {"key": LC_KEY, "status": "failed", "error": "boom"}, "be": {"key": BE_KEY, "status": "failed", "error": "boom"}}})
    return out


class Summary(unittest.TestCase):
    def setUp(self):
        self.s = summarize(runs(), SCEN)
        pair = next(x for x in self.s["scenarios"] if x["name"] == "pair")
        self.modes = {m["mode"]: m for m in pair["modes"]}

    def test_ratios_pooled_over_rounds(self):
        n_lc, n_be = self.modes["native"]["rows"]
        self.assertEqual(n_lc["count"], 3000)
        self.assertAlmostEqual(n_lc["p99_x_alone"], 3.0)
        self.assertAlmostEqual(n_lc["service_p99_x_alone"], 3.0)
        lo, hi = n_lc["p99_x_alone_ci"]
        self.assertLessEqual(lo, 3.0)
        self.assertGreaterEqual(hi, 3.0)
        self.assertAlmostEqual(n_be["be_x_alone"], 0.9)
        self.assertEqual(n_lc["u_alone"], 0.25, "u from the GPU time when the LC reports it")
        self.assertEqual(self.modes["native"]["be_goal"], round(0.9 * 0.75, 3))

    def test_failed_runs_count_but_do_not_pool(self):
        x_lc, x_be = self.modes["xp"]["rows"]
        self.assertEqual((x_lc["runs_ok"], x_lc["runs"]), (3, 4))
        self.assertIn("boom", x_lc["failures"])
        self.assertAlmostEqual(x_be["be_x_alone"], 0.52)
        self.assertEqual(x_be["be_x_alone_range"], [0.51, 0.53])

    def test_outputs_are_compared_with_alone(self):
        self.assertEqual(self.modes["native"]["rows"][1]["correct"], "yes")
        self.assertIn("differs from alone", self.modes["xp"]["rows"][1]["correct"])
        bad = runs()
        bad[3]["jobs"]["be"]["exact"] = False
        s = summarize(bad, SCEN)
        native = next(m for m in s["scenarios"][1]["modes"] if m["mode"] == "native")
        self.assertIn("not exact", native["rows"][1]["correct"])

    def test_alone_runs_that_disagree_are_said_so(self):
        bad = runs()
        bad[1]["jobs"][BE_KEY]["digest"] = "x"
        s = summarize(bad, SCEN)
        native = next(m for m in s["scenarios"][1]["modes"] if m["mode"] == "native")
        self.assertEqual(native["rows"][1]["correct"], "n/a: alone runs differ")

    def test_reference_ratio(self):
        row = self.modes["native"]["rows"][0]
        self.assertAlmostEqual(row["p99_x_ref"], 3.0)
        self.assertAlmostEqual(row["service_p99_x_ref"], 3.0)
        self.assertEqual(row["ref"], "solo-lc/native")
        self.assertIn("| 3.00, service 3.00 (solo-lc/native) |", markdown(self.s, {}))

    def test_markdown_has_a_row_per_mode_and_job(self):
        md = markdown(self.s, {"date": "d", "rounds": 3})
        self.assertIn("| xp | lc | LC/10 |", md)
        self.assertIn("| native | be | BE/0 |", md)
        self.assertIn("3.00 (solo-lc/native)", md)
        self.assertIn("Failures: boom", md)


    def test_a_p99_of_few_requests_is_marked_as_their_maximum(self):
        self.assertNotIn("(max of", markdown(self.s, {}))
        few = [r for r in runs() if r["scenario"] != "pair" or r["mode"] != "xp"]
        for r in (1, 2, 3):
            few.append({"id": f"r{r}-x", "round": r, "scenario": "pair", "mode": "xp",
                        "jobs": {"lc": lc([1.0 + r, 2.0, 3.0]), "be": be(50.0)}})
        md = markdown(summarize(few, SCEN), {})
        self.assertIn("| xp | lc | LC/10 | 3.00 | 4.00 (max of 9) |", md)


class DoNoHarm(unittest.TestCase):
    """The goal's two checks, on a pair where a baseline beats xp and the LC gains nothing."""

    SCEN = validate({
        "jobs": {"lc": {"workload": "cuda-lc"}, "be": {"workload": "cuda-be"}},
        "scenarios": [{"name": "pair", "modes": ["native", "mps_prio", "xp", "xp_mps"],
                       "jobs": [{"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]}]})

    def harm(self, native_lc):
        base = [float(i % 100 + 1) for i in range(1000)]
        by_mode = {"native": (native_lc, 100.0), "mps_prio": (1.5, 90.0), "xp": (2.0, 50.0), "xp_mps": (1.2, 96.0)}
        out = []
        for r in (1, 2, 3):
            out.append({"id": f"r{r}-a1", "round": r, "scenario": "alone", "mode": "alone", "jobs": {LC_KEY: lc(base)}})
            out.append({"id": f"r{r}-a2", "round": r, "scenario": "alone", "mode": "alone", "jobs": {BE_KEY: be(100.0)}})
            for mode, (x, tput) in by_mode.items():
                out.append({"id": f"r{r}-{mode}", "round": r, "scenario": "pair", "mode": mode,
                            "jobs": {"lc": lc([v * x for v in base]), "be": be(tput)}})
        summary = summarize(out, self.SCEN)
        return summary["scenarios"][0]["harm"], markdown(summary, {})

    def test_a_baseline_better_on_both_axes_is_named(self):
        h, md = self.harm(native_lc=3.0)
        self.assertEqual(h["beaten_by"], {"xp": ["mps_prio"], "xp_mps": []})
        self.assertFalse(h["gains_nothing"])
        self.assertIn("xp: beaten on both axes by mps_prio", md)
        self.assertIn("xp_mps: no baseline better on both axes", md)

    def test_where_the_lc_gains_nothing_the_be_must_keep_native_s_share(self):
        h, md = self.harm(native_lc=1.02)
        self.assertTrue(h["gains_nothing"])
        self.assertAlmostEqual(h["be_floor"], 0.95)
        self.assertEqual(h["be_floor_met"], {"xp": False, "xp_mps": True})
        self.assertIn("BE ≥ 0.95 × native = 0.95: xp missed; xp_mps met", md)


class Svg(unittest.TestCase):
    def test_the_plot_is_xml_with_a_point_per_mode(self):
        text = pareto_svg("pair <&>", [("native", 3.0, 0.9, (2.5, 3.5)), ("xp", 1.1, 0.52, None), ("mps", 4.0, 0.5, None),
                                       ("broken", None, 0.4, None)])
        root = ET.fromstring(text)
        ns = "{http://www.w3.org/2000/svg}"
        self.assertEqual(root.tag, ns + "svg")
        labels = [t.text for t in root.iter(ns + "text")]
        self.assertIn("pair <&>", labels)
        self.assertTrue(any(x.startswith("native (3.00, 0.90)") for x in labels if x))
        self.assertFalse(any(x.startswith("broken") for x in labels if x))
        # front points are squares (on the plot and in the legend): native and xp; mps is beaten
        # by native on both axes
        squares = [r for r in root.iter(ns + "rect") if r.get("width") == "10"]
        self.assertEqual(len(squares), 4)

    def test_front_and_ticks(self):
        self.assertEqual(sorted(pareto_front([("a", 1, 1), ("b", 2, 2), ("c", 3, 1.5)])), ["a", "b"])
        t = nice_ticks(0, 7.3)
        self.assertEqual(t[0], 0)
        self.assertGreaterEqual(t[-1], 7.3)
        self.assertTrue(all(b > a for a, b in zip(t, t[1:])))


if __name__ == "__main__":
    unittest.main()
