"""scripts/check-history fails naming FILE:LINE when a history word is planted, and passes
clean text and a results page's commit field. Run: python3 -m unittest discover -s scripts -p 'test_*.py'"""

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "check-history")


def load():
    loader = importlib.machinery.SourceFileLoader("check_history", SCRIPT)
    spec = importlib.util.spec_from_loader("check_history", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


ch = load()


class Planted(unittest.TestCase):
    def repo(self, files):
        d = tempfile.mkdtemp(prefix="check-history-")
        subprocess.run(["git", "init", "-q", d], check=True)
        for path, text in files.items():
            full = os.path.join(d, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        subprocess.run(["git", "-C", d, "add", "-A"], check=True)
        return d

    def run_script(self, root):
        return subprocess.run(
            [sys.executable, SCRIPT, root], capture_output=True, text=True
        )

    def test_clean_tree_passes(self):
        d = self.repo({"src/lib.rs": "// Stops the queue at a block boundary.\nfn f() {}\n"})
        r = self.run_script(d)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_planted_words_fail_naming_file_and_line(self):
        planted = {
            # Spelt in two parts so that this file itself does not read as history.
            "src/lib.rs": "fn f() {}\n// measured in sess" + "ion 12\n",
            "README.md": "# x\n\nAs call 7 showed, it holds.\n",
            "docs/a.md": "Fixed by d7cc6b5 last week.\n",
            "scripts/run.sh": "#!/bin/sh\ncat /work/shared/notes.txt\n",
            "bench/x.sh": "#!/bin/sh\n\ncp a .carry/\n",
            "crates/m.rs": "// AQL packets (seed 002): 64 bytes\n",
        }
        d = self.repo(planted)
        r = self.run_script(d)
        self.assertEqual(r.returncode, 1)
        for where in ["src/lib.rs:2:", "README.md:3:", "docs/a.md:1:", "scripts/run.sh:2:", "bench/x.sh:3:", "crates/m.rs:1:"]:
            self.assertIn(where, r.stdout)

    def test_results_header_may_name_its_commit(self):
        self.assertEqual(ch.check_text("docs/results/x.md", "- commit: d7cc6b5\n"), [])
        self.assertEqual(ch.check_text("docs/results/x.md", "| commit | d7cc6b5 |\n"), [])
        self.assertEqual(len(ch.check_text("docs/results/x.md", "Since d7cc6b5 it holds.\n")), 1)

    def test_data_and_non_history_words_pass(self):
        self.assertEqual(ch.check_text("a.rs", "let x = 0xdeadbeef12; // 16-byte 0123456789abcdef\n"), [])
        self.assertEqual(ch.check_text("crates/bpf/src/t.rs", "call 1\n"), [])
        self.assertEqual(ch.check_text("a.md", "a session of the daemon; calls the driver\n"), [])
        self.assertEqual(ch.check_text("a.rs", 'assert!(w.contains("train-vs-infer (seed 42)"));\n'), [])


if __name__ == "__main__":
    unittest.main()
