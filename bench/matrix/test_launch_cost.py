"""Tests of the launch-cost summary, no GPU: python3 -m unittest discover -s bench/matrix"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch_cost import commands_in_exit_report, summarize  # noqa: E402


class ExitReport(unittest.TestCase):
    def test_sums_the_commands_of_every_stream_queue(self):
        stderr = (
            "xpreempt-shim: legacy stream queue: 111747 commands, 0 launched from its buffer, ran dry 0 times\n"
            "something else: 5 commands\n"
            "xpreempt-shim: non-blocking stream queue: 2 commands, 0 launched from its buffer\n"
        )
        self.assertEqual(commands_in_exit_report(stderr), 111749)
        self.assertEqual(commands_in_exit_report(""), 0)


class Summary(unittest.TestCase):
    def test_each_mode_against_native_per_command(self):
        native = [230.0, 190.0, 200.0, 210.0, 200.0, 195.0, 205.0, 200.0, 200.0]
        s = summarize({"native": native, "xp": [202.0] * 10, "xp_other": []}, 1000.0)
        self.assertEqual(s["native"]["p50_ms"], 200.0)
        self.assertAlmostEqual(s["xp"]["x_native"], 1.01)
        self.assertAlmostEqual(s["xp"]["added_us_per_command"], 2.0)
        self.assertLessEqual(s["native"]["lo_ms"], s["native"]["p50_ms"])
        self.assertLessEqual(s["native"]["p50_ms"], s["native"]["hi_ms"])
        self.assertNotIn("xp_other", s)

    def test_without_native_or_a_count_no_ratio(self):
        s = summarize({"xp": [1.0, 2.0, 3.0]}, None)
        self.assertNotIn("x_native", s["xp"])
        s = summarize({"native": [1.0, 2.0], "xp": [2.0, 2.0]}, None)
        self.assertNotIn("added_us_per_command", s["xp"])


if __name__ == "__main__":
    unittest.main()
