"""Every XPREEMPT_* variable the code names is in docs/settings.md, so no setting hides behind an
undocumented environment variable. Run: python3 -m unittest discover -s scripts -p 'test_*.py'"""

import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIABLE = re.compile(r'"(XPREEMPT_[A-Z0-9_]+)"|env!\("(XPREEMPT_[A-Z0-9_]+)"\)')


def named_in_code(root):
    """Variables the Rust sources name as string literals (what `std::env::var` and `env!` get)."""
    found = {}
    for top, _, files in os.walk(os.path.join(root, "crates")):
        for name in files:
            if name.endswith(".rs"):
                path = os.path.join(top, name)
                with open(path, encoding="utf-8") as f:
                    for m in VARIABLE.finditer(f.read()):
                        found.setdefault(m.group(1) or m.group(2), os.path.relpath(path, root))
    return found


def undocumented(variables, doc):
    """The variables the document does not name, each with where the code names it."""
    return {v: where for v, where in variables.items() if not re.search(rf"\b{v}\b", doc)}


class SettingsDoc(unittest.TestCase):
    def test_every_variable_the_code_names_is_documented(self):
        with open(os.path.join(ROOT, "docs", "settings.md"), encoding="utf-8") as f:
            doc = f.read()
        variables = named_in_code(ROOT)
        self.assertIn("XPREEMPT_GPU_WINDOW_US", variables, "the scan finds the shim's settings")
        self.assertEqual(undocumented(variables, doc), {}, "add these to docs/settings.md")

    def test_a_variable_missing_from_the_document_is_named(self):
        doc = "| `XPREEMPT_LEVEL` | ... |"
        found = undocumented({"XPREEMPT_LEVEL": "a.rs", "XPREEMPT_LEVELS": "b.rs"}, doc)
        self.assertEqual(found, {"XPREEMPT_LEVELS": "b.rs"})


if __name__ == "__main__":
    unittest.main()
