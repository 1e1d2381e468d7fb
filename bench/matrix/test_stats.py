"""Tests of the matrix's statistics, no GPU: python3 -m unittest discover -s bench/matrix"""

import math
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stats import binom_tail, bootstrap_interval, percentile, window_rate, work_at  # noqa: E402


class Percentile(unittest.TestCase):
    def test_nearest_rank(self):
        v = list(range(1, 101))
        self.assertEqual(percentile(v, 50), 50)
        self.assertEqual(percentile(v, 99), 99)
        self.assertEqual(percentile(v, 100), 100)
        self.assertEqual(percentile([7], 99), 7)
        self.assertIsNone(percentile([], 99))


class BinomialTail(unittest.TestCase):
    def exact(self, n, p, k):
        return sum(math.comb(n, m) * p ** m * (1 - p) ** (n - m) for m in range(k, n + 1))

    def test_matches_the_sum_of_the_pmf_on_both_sides_of_the_mean(self):
        for n, p, k in [(10, 0.5, 5), (50, 0.9, 48), (50, 0.9, 40), (200, 0.99, 199), (200, 0.3, 10), (7, 0.2, 7)]:
            self.assertAlmostEqual(binom_tail(n, p, k), self.exact(n, p, k), places=9, msg=(n, p, k))

    def test_edges(self):
        self.assertEqual(binom_tail(10, 0.5, 0), 1.0)
        self.assertEqual(binom_tail(10, 0.5, 11), 0.0)
        self.assertEqual(binom_tail(10, 0.0, 1), 0.0)
        self.assertEqual(binom_tail(10, 1.0, 10), 1.0)

    def test_large_n_is_fast_and_sane(self):
        # 20 000 requests pooled over rounds: the tail around the 99th percentile
        self.assertAlmostEqual(binom_tail(20000, 0.99, 19800), 0.5, delta=0.03)
        self.assertLess(binom_tail(20000, 0.985, 19800), 1e-6)


class Bootstrap(unittest.TestCase):
    def monte_carlo(self, values, q, reps, rng):
        n = len(values)
        k = max(1, math.ceil(q / 100 * n))
        stats = sorted(sorted(rng.choices(values, k=n))[k - 1] for _ in range(reps))
        return stats[int(0.025 * reps)], stats[int(0.975 * reps)]

    def test_agrees_with_resampling(self):
        rng = random.Random(7)
        values = [rng.lognormvariate(0, 0.6) for _ in range(400)]
        lo, hi = bootstrap_interval(values)
        mlo, mhi = self.monte_carlo(values, 99, 4000, rng)
        v = sorted(values)
        # within two order statistics of a 4000-resample bootstrap
        self.assertLessEqual(abs(v.index(lo) - v.index(mlo)), 2, (lo, mlo))
        self.assertLessEqual(abs(v.index(hi) - v.index(mhi)), 2, (hi, mhi))
        self.assertLessEqual(lo, percentile(v, 99))
        self.assertGreaterEqual(hi, percentile(v, 99))

    def test_ties_and_small_samples(self):
        self.assertIsNone(bootstrap_interval([1.0]))
        self.assertEqual(bootstrap_interval([2.0] * 50), (2.0, 2.0))
        lo, hi = bootstrap_interval([1.0] * 98 + [5.0, 9.0])
        self.assertEqual(lo, 1.0)
        self.assertIn(hi, (5.0, 9.0))

    def test_a_long_tail_widens_the_interval(self):
        body = [1.0 + i / 1000 for i in range(990)]
        narrow = bootstrap_interval(body + [2.0] * 10)
        wide = bootstrap_interval(body + [2.0 + i for i in range(10)])
        self.assertGreater(wide[1] - wide[0], narrow[1] - narrow[0])


class Window(unittest.TestCase):
    def test_interpolates_inside_and_clamps_outside(self):
        t, w = [0.0, 1.0, 2.0, 4.0], [0, 10, 20, 20]
        self.assertEqual(work_at(t, w, 0.5), 5)
        self.assertEqual(work_at(t, w, -1), 0)
        self.assertEqual(work_at(t, w, 9), 20)
        rate, covered = window_rate(t, w, 0.5, 1.5)
        self.assertAlmostEqual(rate, 10.0)
        self.assertTrue(covered)
        rate, covered = window_rate(t, w, 1.0, 4.0)
        self.assertAlmostEqual(rate, 10 / 3)
        self.assertFalse(window_rate(t, w, 3.0, 5.0)[1])  # the job stopped before the window ended
        self.assertEqual(window_rate([], [], 0, 1), (None, False))
        self.assertEqual(window_rate(t, w, 2, 2), (None, False))


if __name__ == "__main__":
    unittest.main()
