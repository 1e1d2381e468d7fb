"""trace_spans.py on a small daemon timeline, finished and cut off. python3 -m unittest discover -s bench/matrix"""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_spans  # noqa: E402

EVENTS = [
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "q0 lc (11)"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "q1 be (12)"}},
    {"ph": "i", "name": "suspend", "pid": 0, "tid": 1, "ts": 10.0, "args": {"for": "q0", "for_priority": 10}},
    {"ph": "X", "name": "running", "pid": 0, "tid": 0, "ts": 10.0, "dur": 300.0},
    {"ph": "X", "name": "suspended", "pid": 0, "tid": 1, "ts": 10.0, "dur": 310.0},
    {"ph": "i", "name": "suspend", "pid": 0, "tid": 1, "ts": 900.0, "args": {"for": "q0", "for_priority": 10}},
    {"ph": "X", "name": "running", "pid": 0, "tid": 0, "ts": 900.0, "dur": 100.0},
    {"ph": "X", "name": "suspended", "pid": 0, "tid": 1, "ts": 900.0, "dur": 120.0},
    {"ph": "X", "name": "running", "pid": 0, "tid": 1, "ts": 320.0, "dur": 580.0},
]


class TraceSpans(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.remove, f.name)
        return f.name

    def test_spans_per_queue_and_state_and_who_each_suspension_was_for(self):
        s = trace_spans.summarize(EVENTS)
        self.assertEqual(s["q0 lc (11)"]["states"]["running"]["n"], 2)
        self.assertEqual(s["q0 lc (11)"]["states"]["running"]["p99_us"], 300.0)
        self.assertEqual(s["q0 lc (11)"]["states"]["running"]["p10_us"], 100.0)
        self.assertEqual(s["q1 be (12)"]["states"]["suspended"]["n"], 2)
        self.assertEqual(s["q1 be (12)"]["suspended_for"], {"q0 lc (11)": 2})
        self.assertEqual(s["q0 lc (11)"]["suspended_for"], {})

    def test_a_finished_and_a_cut_off_trace_read_the_same(self):
        body = "[\n" + "".join(json.dumps(e) + ",\n" for e in EVENTS)
        finished = trace_spans.load(self.write(body + "{}]\n"))
        cut = trace_spans.load(self.write(body))
        self.assertEqual(finished, cut)
        self.assertEqual(len(cut), len(EVENTS))

    def test_an_unreadable_trace_exits_non_zero(self):
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(trace_spans.main([self.write("[{\"ph\": ")]), 1)
            self.assertEqual(trace_spans.main([os.path.join(tempfile.gettempdir(), "no-such-trace.json")]), 1)


if __name__ == "__main__":
    unittest.main()
