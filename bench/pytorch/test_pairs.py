"""The orchestrator's mode names: variants and the build each mode runs (no GPU).
python3 -m unittest discover -s bench/pytorch"""

import os
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pairs  # noqa: E402


class ModeNames(unittest.TestCase):
    def test_base_variants_run_the_other_build_and_keep_their_other_variants(self):
        args = types.SimpleNamespace(xpreempt_bin="new/xpreempt", xpreempt_bin_base="old/xpreempt")
        self.assertEqual(pairs.xp_bin(args, "xp_mps"), "new/xpreempt")
        self.assertEqual(pairs.xp_bin(args, "xp_mps+base"), "old/xpreempt")
        self.assertEqual(pairs.xp_bin(args, "xp_lv1+bewindow4+base"), "old/xpreempt")
        self.assertEqual(pairs.base_mode("xp_lv1+bewindow4+base"), "xp_lv1")
        self.assertEqual(pairs.variant_args("xp_lv1+bewindow4+base", "low"), ["--window", "4"])
        self.assertEqual(pairs.variant_args("xp_lv1+base", "high"), [])

    def test_an_unknown_variant_is_refused(self):
        with self.assertRaises(ValueError):
            pairs.variant_args("xp_mps+basement")


if __name__ == "__main__":
    unittest.main()
