"""The checker of the invariants test (check_invariants.py) on histories
whose verdict is known: it passes what a token bucket can do, and catches
what it cannot, so that a passing load test means something.

    python3 tests/integration/test_checker.py
"""

import math
import os
import random
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_invariants as ci  # noqa: E402

CAPACITY, RATE = 10, 4.0   # a token every 250 ms


def bucket_history(seed, calls=2000):
    """Admissions of a model bucket (exact, in integer microseconds) under
    random arrivals and costs: a history that must pass."""
    rnd = random.Random(seed)
    tokens, ts, t, out = float(CAPACITY), 0, 1_000_000, []
    for _ in range(calls):
        t += rnd.randint(0, 40_000)
        tokens = min(CAPACITY, tokens + (t - ts) * RATE / 1e6)
        ts = t
        cost = rnd.randint(1, 3)
        if tokens >= cost:
            tokens -= cost
            out.append((t, cost))
    return out


class Windows(unittest.TestCase):

    def test_a_real_bucket_passes_and_its_tightest_window_meets_the_bound(self):
        for seed in range(5):
            h = bucket_history(seed)
            v = ci.check_windows(h, [], CAPACITY, RATE)
            self.assertTrue(v.ok, v.message)
            self.assertAlmostEqual(v.worst[0], 0.0, delta=3)   # at most a cost below
            self.assertEqual(v.admitted_cost, sum(c for _, c in h))

    def test_a_burst_of_capacity_then_the_refill_is_exactly_allowed(self):
        h = [(0, 10), (250_000, 1), (500_000, 1)]
        v = ci.check_windows(h, [], CAPACITY, RATE)
        self.assertTrue(v.ok, v.message)
        self.assertEqual(v.worst[0], 0.0)   # [0, 0] and [0, 500000] both meet the bound

    def test_one_token_too_many_is_caught(self):
        h = [(0, 10), (249_999, 1)]        # a microsecond before the token exists
        v = ci.check_windows(h, [], CAPACITY, RATE)
        self.assertFalse(v.ok)
        self.assertIn("window [0, 249999] us", v.message)
        self.assertIn("admitted cost 11", v.message)

    def test_a_double_spend_in_a_long_history_is_caught(self):
        h = bucket_history(7)
        t, cost = h[len(h) // 2]
        h.insert(len(h) // 2, (t, cost))   # the same admission twice
        self.assertFalse(ci.check_windows(h, [], CAPACITY, RATE).ok)

    def test_admissions_at_the_same_microsecond_are_counted_together(self):
        h = [(5, 4), (5, 4), (5, 3)]
        v = ci.check_windows(h, [], CAPACITY, RATE)
        self.assertFalse(v.ok)
        self.assertIn("window [5, 5] us", v.message)

    def test_a_call_of_unknown_outcome_covers_the_windows_it_meets(self):
        h = [(0, 10), (100_000, 2)]
        over = ci.check_windows(h, [], CAPACITY, RATE)
        self.assertFalse(over.ok)
        # A timed-out call of cost 2 whose interval meets the window: the
        # excess may be its doing, not the limiter's.
        meets = ci.check_windows(h, [(90_000, 95_000, 2, "ETIMEDOUT")], CAPACITY, RATE)
        self.assertTrue(meets.ok, meets.message)
        unbounded = ci.check_windows(h, [(50_000, math.inf, 2, "ETIMEDOUT")], CAPACITY, RATE)
        self.assertTrue(unbounded.ok, unbounded.message)
        # One that ended before the window, or is too small, does not.
        before = ci.check_windows(h, [(-20, -10, 5, "ETIMEDOUT")], CAPACITY, RATE)
        self.assertFalse(before.ok)
        small = ci.check_windows(h, [(90_000, 95_000, 1, "ETIMEDOUT")], CAPACITY, RATE)
        self.assertFalse(small.ok)
        self.assertIn("plus 1 possibly admitted", small.message)

    def test_nothing_admitted_holds(self):
        v = ci.check_windows([], [], CAPACITY, RATE)
        self.assertTrue(v.ok)
        self.assertEqual((v.windows, v.message), (0, "nothing was admitted"))


class Exact(unittest.TestCase):

    def test_exactly_the_capacity(self):
        self.assertEqual(ci.check_exact([(1, 3), (2, 7)], [], 10)[:3], (True, 10, 0))

    def test_one_short_or_one_over_fails(self):
        self.assertFalse(ci.check_exact([(1, 9)], [], 10)[0])
        self.assertFalse(ci.check_exact([(1, 11)], [], 10)[0])

    def test_unknown_outcomes_may_make_up_the_difference_but_not_an_excess(self):
        self.assertTrue(ci.check_exact([(1, 8)], [(0, 5, 2, "ETIMEDOUT")], 10)[0])
        self.assertFalse(ci.check_exact([(1, 7)], [(0, 5, 2, "ETIMEDOUT")], 10)[0])
        self.assertFalse(ci.check_exact([(1, 11)], [(0, 5, 2, "ETIMEDOUT")], 10)[0])


class Parse(unittest.TestCase):

    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_merges_logs(self):
        a = self.write("A 10 2\nP 5 9 1 ETIMEDOUT\nS c threads=4 decisions=3 errors=0\n")
        b = self.write("A 7 3\nP 8 inf 2 EIO\nS lua threads=1 decisions=2 errors=0\n")
        logs = ci.parse([a, b])
        self.assertEqual(logs.admitted, [(10, 2), (7, 3)])
        self.assertEqual(logs.possible, [(5, 9, 1, "ETIMEDOUT"), (8, math.inf, 2, "EIO")])
        self.assertEqual(logs.summaries["lua"], {"threads": 1, "decisions": 2, "errors": 0})

    def test_a_malformed_line_is_named(self):
        bad = self.write("A 10 2\nA 11\n")
        with self.assertRaisesRegex(ValueError, r"\.log:2: malformed line 'A 11\\n'"):
            ci.parse([bad])


if __name__ == "__main__":
    unittest.main()
