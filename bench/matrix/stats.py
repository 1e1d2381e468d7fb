"""Pooling, intervals and the summary of the workload matrix (standard library only).

Latencies are pooled over the rounds of a (scenario, mode, job); p50/p99 are nearest-rank
percentiles of the pooled list, and the 95 % interval of p99 is the percentile bootstrap's,
computed exactly rather than by resampling: the k-th smallest of n values drawn with replacement
is at most v[j] exactly when at least k draws fall at or below v[j], a binomial count.
"""

import math
from bisect import bisect_right


def percentile(sorted_values, q):
    """Nearest-rank percentile of an ascending list (q in [0, 100])."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def binom_tail(n, p, k):
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    # Sum the pmf from k upwards, starting at its log, until the terms stop mattering; for the
    # tail below the mean, 1 - P(X <= k - 1) summed downwards instead (fewer, larger terms).
    lp, lq = math.log(p), math.log1p(-p)

    def log_pmf(m):
        return math.lgamma(n + 1) - math.lgamma(m + 1) - math.lgamma(n - m + 1) + m * lp + (n - m) * lq

    mean = n * p
    if k > mean:
        m, term, total = k, math.exp(log_pmf(k)), 0.0
        while m <= n:
            total += term
            if term < total * 1e-17 or term == 0.0 and m > mean:
                break
            term *= (n - m) / (m + 1) * p / (1 - p)
            m += 1
        return min(1.0, total)
    m, term, total = k - 1, math.exp(log_pmf(k - 1)), 0.0
    while m >= 0:
        total += term
        if term < total * 1e-17 or term == 0.0 and m < mean:
            break
        term *= m / (n - m + 1) * (1 - p) / p
        m -= 1
    return max(0.0, 1.0 - total)


def bootstrap_interval(values, q=99.0, conf=0.95):
    """(low, high) of the percentile bootstrap of the nearest-rank q-th percentile; None when
    there are fewer than 2 values."""
    v = sorted(values)
    n = len(v)
    if n < 2:
        return None
    k = max(1, math.ceil(q / 100.0 * n))

    def cdf(j):  # P(resampled k-th smallest <= v[j]); counts ties with v[j] as at or below it
        return binom_tail(n, bisect_right(v, v[j]) / n, k)

    def first_at_least(alpha):
        lo, hi = 0, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if cdf(mid) >= alpha:
                hi = mid
            else:
                lo = mid + 1
        return v[lo]

    tail = (1.0 - conf) / 2
    return first_at_least(tail), first_at_least(1.0 - tail)


def work_at(marks_t, marks_w, t):
    """Cumulative work at time t, linearly interpolated between progress marks (clamped)."""
    if not marks_t:
        return None
    if t <= marks_t[0]:
        return marks_w[0]
    if t >= marks_t[-1]:
        return marks_w[-1]
    i = bisect_right(marks_t, t)
    t0, t1, w0, w1 = marks_t[i - 1], marks_t[i], marks_w[i - 1], marks_w[i]
    return w0 if t1 == t0 else w0 + (w1 - w0) * (t - t0) / (t1 - t0)


def window_rate(marks_t, marks_w, start, end):
    """(work per second inside [start, end], whether the marks cover the whole window)."""
    if not marks_t or end is None or start is None or end <= start:
        return None, False
    a, b = work_at(marks_t, marks_w, start), work_at(marks_t, marks_w, end)
    covered = marks_t[0] <= start and marks_t[-1] >= end
    return (b - a) / (end - start), covered


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None
