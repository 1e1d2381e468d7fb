"""The runner end to end with stand-in jobs (testdata/fake_job.py), no GPU: runs, failures, hangs,
daemons that cannot start, the summary, the plots. python3 -m unittest discover -s bench/matrix"""

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run as runner  # noqa: E402
from scenarios import WORKLOADS  # noqa: E402

FAKE = os.path.join(HERE, "testdata", "fake_job.py")
FAKES = {
    "fake-lc": {"program": FAKE, "base": ["lc"], "roles": ["LC"], "lc": True, "startup_s": 0.2},
    "fake-be": {"program": FAKE, "base": ["be"], "roles": ["BE"], "lc": False, "startup_s": 0.2},
}


def scenario_file(d, scenarios):
    path = os.path.join(d, "s.json")
    with open(path, "w") as f:
        json.dump({"jobs": {"lc": {"workload": "fake-lc", "args": ["--util", "0.2"]}, "be": {"workload": "fake-be"}},
                   "scenarios": scenarios}, f)
    return path


class Runner(unittest.TestCase):
    def setUp(self):
        WORKLOADS.update(FAKES)
        self.dir = tempfile.mkdtemp(prefix="matrix-test-")

    def tearDown(self):
        for k in FAKES:
            WORKLOADS.pop(k, None)
        shutil.rmtree(self.dir, ignore_errors=True)

    def main(self, scenarios, *extra):
        out = os.path.join(self.dir, "out")
        args = ["--scenarios", scenario_file(self.dir, scenarios), "--out", out, "--duration", "0.4",
                "--rounds", "2", "--startup-timeout", "10", "--stop-timeout", "1",
                "--xpreempt-bin", os.path.join(self.dir, "no-such-xpreempt")] + list(extra)
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            rc = runner.main(args)
        with open(os.path.join(out, "summary.json")) as f:
            return rc, out, json.load(f)

    def test_a_pair_runs_alone_and_together_and_is_summarized(self):
        rc, out, s = self.main([{"name": "pair", "modes": ["native"],
                                 "jobs": [{"job": "lc", "role": "LC", "priority": 10},
                                          {"job": "be", "role": "BE", "priority": 0}]}])
        self.assertEqual(rc, 0)
        self.assertEqual(len(os.listdir(os.path.join(out, "runs"))), 6)  # 2 rounds x (2 alone + native)
        native = next(m for m in s["scenarios"][0]["modes"] if m["mode"] == "native")
        lc, be = native["rows"]
        self.assertEqual((lc["runs_ok"], be["runs_ok"]), (2, 2))
        self.assertEqual(lc["correct"], "yes")
        self.assertEqual(be["correct"], "yes")
        self.assertAlmostEqual(lc["p99_x_alone"], 1.0, places=3)
        self.assertGreater(be["be_x_alone"], 0.5)
        self.assertEqual(native["be_goal"], round(0.9 * (1 - 0.2), 3))
        # the alone LC's rate is reused by every later run
        with open(os.path.join(out, "state.json")) as f:
            rates = json.load(f)["rates"]
        self.assertEqual(len(rates), 1)
        with open(os.path.join(out, "logs", "r2-pair-native-lc.log")) as f:
            log = f.readline()
        self.assertIn("--rate", log)
        self.assertIn("--start-after", log)
        ET.parse(os.path.join(out, "plots", "pair.svg"))
        with open(os.path.join(out, "summary.md")) as f:
            self.assertIn("| native | lc | LC/10 |", f.read())

    def test_failures_and_hangs_are_recorded_and_the_runner_goes_on(self):
        t0 = time.monotonic()
        rc, out, s = self.main([
            {"name": "dies", "modes": ["native"], "jobs": [
                {"job": "lc", "role": "LC", "priority": 10},
                {"workload": "fake-be", "args": ["--misbehave", "die"], "name": "be", "role": "BE", "priority": 0}]},
            {"name": "hangs", "modes": ["native"], "jobs": [
                {"job": "lc", "role": "LC", "priority": 10},
                {"workload": "fake-be", "args": ["--misbehave", "hang"], "name": "be", "role": "BE", "priority": 0}]},
            {"name": "ok", "modes": ["native", "xp"], "jobs": [
                {"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]},
        ])
        self.assertEqual(rc, 1)
        self.assertLess(time.monotonic() - t0, 60)
        by = {x["name"]: {m["mode"]: m for m in x["modes"]} for x in s["scenarios"]}
        dies = by["dies"]["native"]["rows"]
        self.assertEqual([r["runs_ok"] for r in dies], [0, 0])
        self.assertTrue(any("exited before ready" in f for r in dies for f in r["failures"]), dies)
        hang_be = by["hangs"]["native"]["rows"][1]
        self.assertEqual(hang_be["runs_ok"], 0)
        self.assertTrue(any("killed" in f or "no result" in f for f in hang_be["failures"]), hang_be)
        self.assertEqual(by["ok"]["native"]["rows"][0]["runs_ok"], 2, "runs after failures still happen")
        xp = by["ok"]["xp"]["rows"][0]
        self.assertEqual(xp["runs_ok"], 0)
        self.assertTrue(any("no xpreempt binary" in f for f in xp["failures"]), xp)

    def test_xpreempt_modes_run_every_job_under_xpreempt_run_beside_a_private_daemon(self):
        xp_log = os.path.join(self.dir, "xp.log")
        os.environ["FAKE_XP_LOG"] = xp_log
        try:
            rc, out, s = self.main([{"name": "pair", "modes": ["xp", "xp_mps"], "jobs": [
                {"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]}],
                "--rounds", "1", "--xpreempt-bin", os.path.join(HERE, "testdata", "fake_xpreempt.py"))
        finally:
            del os.environ["FAKE_XP_LOG"]
        self.assertEqual(rc, 0)
        with open(xp_log) as f:
            lines = f.read().splitlines()
        self.assertEqual(sorted(x.split(" socket=")[0] for x in lines), ["--priority 0", "--priority 0", "--priority 10", "--priority 10"])
        sockets = {x.split(" socket=")[1] for x in lines}
        self.assertEqual(len(sockets), 2, "one private daemon per mode")
        for sock in sockets:
            self.assertFalse(os.path.exists(sock), "the daemon was stopped")
            with open(sock + ".stopped") as f:
                self.assertEqual(f.read().endswith("--mps"), "xp_mps" in sock)
        modes = {m["mode"]: m for m in s["scenarios"][0]["modes"]}
        self.assertEqual(modes["xp_mps"]["rows"][1]["runs_ok"], 1)

    def test_trace_has_each_daemon_write_its_timeline_beside_the_logs(self):
        os.environ["FAKE_XP_LOG"] = os.path.join(self.dir, "xp.log")
        try:
            rc, out, _ = self.main([{"name": "pair", "modes": ["xp"], "jobs": [
                {"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]}],
                "--rounds", "1", "--trace", "--xpreempt-bin", os.path.join(HERE, "testdata", "fake_xpreempt.py"))
        finally:
            del os.environ["FAKE_XP_LOG"]
        self.assertEqual(rc, 0)
        stopped = [f for f in os.listdir(runner.short_dir(os.path.join(out, "ipc"))) if f.endswith(".stopped")]
        self.assertEqual(len(stopped), 1)
        with open(os.path.join(runner.short_dir(os.path.join(out, "ipc")), stopped[0])) as f:
            argv = f.read().split()
        self.assertEqual(argv[argv.index("--trace") + 1], os.path.join(out, "logs", "trace-r1-xp.json"))

    def test_a_mode_asked_for_that_no_scenario_runs_is_refused(self):
        sc = scenario_file(self.dir, [{"name": "pair", "modes": ["native"], "jobs": [
            {"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]}])
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            with self.assertRaises(SystemExit) as e:
                runner.main(["--scenarios", sc, "--dry-run", "--modes", "native,xp_mps"])
        self.assertIn("xp_mps: no selected scenario runs it", str(e.exception.code))
        # A variant runs wherever the mode it varies runs: xp_lv1 beside xp.
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()) as out:
            sc = scenario_file(self.dir, [{"name": "pair", "modes": ["xp"], "jobs": [
                {"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]}])
            self.assertEqual(runner.main(["--scenarios", sc, "--dry-run", "--modes", "xp,xp_lv1"]), 0)
        self.assertIn("xp_lv1", out.getvalue())

    def test_base_modes_run_the_other_build_in_the_same_rounds(self):
        base = os.path.join(self.dir, "base_xpreempt.py")
        shutil.copy(os.path.join(HERE, "testdata", "fake_xpreempt.py"), base)
        os.chmod(base, 0o755)
        os.environ["FAKE_XP_LOG"] = os.path.join(self.dir, "xp.log")
        os.environ["FAKE_XP_BIN_LOG"] = bin_log = os.path.join(self.dir, "bin.log")
        try:
            rc, _, s = self.main([{"name": "pair", "modes": ["xp_mps"], "jobs": [
                {"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]}],
                "--rounds", "2", "--modes", "xp_mps,xp_mps@base",
                "--xpreempt-bin", os.path.join(HERE, "testdata", "fake_xpreempt.py"), "--xpreempt-bin-base", base)
        finally:
            del os.environ["FAKE_XP_LOG"], os.environ["FAKE_XP_BIN_LOG"]
        self.assertEqual(rc, 0)
        with open(bin_log) as f:
            ran = [line.split() for line in f.read().splitlines()]
        # Two jobs per run, two rounds: each build ran every job of its own mode, and only those.
        self.assertEqual(sorted(b for b, sock in ran if "@base" in sock), ["base_xpreempt.py"] * 4)
        self.assertEqual(sorted(b for b, sock in ran if "@base" not in sock), ["fake_xpreempt.py"] * 4)
        modes = {m["mode"]: m for m in s["scenarios"][0]["modes"]}
        self.assertEqual(modes["xp_mps@base"]["rows"][1]["runs_ok"], 2)

    def test_sigterm_stops_jobs_and_daemon_and_still_writes_the_summary(self):
        out = os.path.join(self.dir, "out")
        path = scenario_file(self.dir, [{"name": "stuck", "modes": ["xp"], "jobs": [
            {"workload": "fake-be", "args": ["--misbehave", "hang-under-xp"], "name": "be", "role": "BE", "priority": 0}]}])
        code = ("import sys; sys.path.insert(0, %r); import scenarios, test_runner; "
                "scenarios.WORKLOADS.update(test_runner.FAKES); import run; sys.exit(run.main(sys.argv[1:]))" % HERE)
        env = {**os.environ, "FAKE_XP_LOG": os.path.join(self.dir, "xp.log")}
        proc = subprocess.Popen([sys.executable, "-c", code, "--scenarios", path, "--out", out, "--duration", "1",
                                 "--rounds", "1", "--stop-timeout", "30",
                                 "--xpreempt-bin", os.path.join(HERE, "testdata", "fake_xpreempt.py")],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(self.dir, "xp.log")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the BE has started under the stand-in xpreempt
        time.sleep(2.0)  # its window is over: the runner now waits for it to stop, which it never does
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        self.assertLess(time.monotonic() - t0, 15, "SIGTERM shortens the wait for jobs that ignore it")
        self.assertTrue(os.path.exists(os.path.join(out, "summary.md")))
        socks = [f for f in os.listdir(self.dir) if f.endswith(".sock")]
        ipc = os.path.join(out, "ipc")
        self.assertTrue(any(f.endswith(".sock.stopped") for f in os.listdir(ipc)), "the daemon was stopped")
        self.assertFalse(socks)
        with open(os.path.join(self.dir, "xp.log")) as f:
            self.assertTrue(f.read())
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        self.assertNotIn(out, ps, "a job outlived the runner")

    def test_resume_keeps_finished_runs_and_from_runs_rebuilds(self):
        sc = [{"name": "pair", "modes": ["native"], "jobs": [{"job": "lc", "role": "LC", "priority": 10},
                                                            {"job": "be", "role": "BE", "priority": 0}]}]
        _, out, _ = self.main(sc, "--rounds", "1")
        first = os.path.getmtime(os.path.join(out, "runs", "r1-pair-native.json"))
        rc, out, s = self.main(sc, "--resume")
        self.assertEqual(rc, 0)
        self.assertEqual(os.path.getmtime(os.path.join(out, "runs", "r1-pair-native.json")), first)
        self.assertTrue(os.path.exists(os.path.join(out, "runs", "r2-pair-native.json")))
        os.remove(os.path.join(out, "summary.json"))
        rc, out, s = self.main(sc, "--from-runs")
        self.assertEqual(rc, 0)
        self.assertEqual(s["scenarios"][0]["modes"][1]["rows"][0]["runs_ok"], 2)

    def test_deadline_stops_starting_runs(self):
        rc, out, _ = self.main([{"name": "pair", "modes": ["native"], "jobs": [
            {"job": "lc", "role": "LC", "priority": 10}, {"job": "be", "role": "BE", "priority": 0}]}],
            "--deadline-s", "0")
        self.assertEqual(os.listdir(os.path.join(out, "runs")), [])
        self.assertTrue(os.path.exists(os.path.join(out, "summary.md")))


if __name__ == "__main__":
    unittest.main()
