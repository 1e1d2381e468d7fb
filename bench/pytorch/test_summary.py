"""Tests of the pairs summary, no GPU or torch needed: python3 -m unittest discover -s bench/pytorch"""

import os
import re
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pairs import load_raw  # noqa: E402
from summary import ratio_interval, summarize  # noqa: E402

# A measured run of the PyTorch pair (H100, 2026-11-23): its raw files and the summary the device wrote.
RUN = os.path.join(HERE, "testdata")


class RatioInterval(unittest.TestCase):
    def test_an_interval_covers_the_true_ratio_and_is_none_without_data(self):
        values = [1.0 + (i % 97) / 10 for i in range(500)]
        lo, hi = ratio_interval(values, values)
        self.assertLess(lo, 1.0)
        self.assertGreater(hi, 1.0)
        lo, hi = ratio_interval([2 * v for v in values], values)
        self.assertTrue(1.6 < lo <= 2.0 <= hi < 2.5, (lo, hi))
        self.assertIsNone(ratio_interval([1.0], values))

    def test_a_long_tail_widens_the_interval(self):
        body = [1.0] * 480
        narrow = ratio_interval(body + [1.1] * 20, body + [1.1] * 20)
        wide = ratio_interval(body + [float(i) for i in range(1, 21)], body + [1.1] * 20)
        self.assertGreater(wide[1] - wide[0], 5 * (narrow[1] - narrow[0]))


class FromRaw(unittest.TestCase):
    def test_the_committed_raw_files_give_the_summary_the_device_wrote(self):
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(os.path.join(RUN, "raw.tgz")) as t:
                try:
                    t.extractall(tmp, filter="data")
                except TypeError:  # Python before 3.11.4: no extraction filters
                    t.extractall(tmp)
            alone, alone_runs, runs = load_raw(os.path.join(tmp, "raw"))
        rows = {(r["group"], r["mode"]): r for r in summarize(alone_runs + runs, alone)}
        with open(os.path.join(RUN, "summary.md")) as f:
            table = [line.split("|")[1:-1] for line in f if re.match(r"\| (pair|solo) \| ", line)]
        self.assertGreater(len(table), 5)
        for cells in table:
            cells = [c.strip() for c in cells]
            row = rows[(cells[0], cells[1])]
            # Columns of the device's table: p99/alone (5), train/alone (10).
            for col, key in ((5, "p99_x"), (10, "train_x")):
                if cells[col] != "–":
                    self.assertAlmostEqual(row[key], float(cells[col]), delta=0.0051, msg=(cells[:2], key))
            if "p99_x" in row and row["mode"].startswith("xp_"):
                lo, hi = row["p99_x_ci95"]
                self.assertLessEqual(lo, row["p99_x"])
                self.assertGreaterEqual(hi, row["p99_x"])


if __name__ == "__main__":
    unittest.main()
