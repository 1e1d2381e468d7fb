#!/usr/bin/env python3
"""A stand-in for the xpreempt binary in the runner's tests: `daemon --socket S [--mps]` creates S
and waits for SIGTERM (then removes S and writes S.stopped); `run --priority P [...] -- CMD` records
its priority in $FAKE_XP_LOG (and, where $FAKE_XP_BIN_LOG is set, its own name and socket there)
and execs CMD."""
import os
import signal
import sys
import time

args = sys.argv[1:]
if args[0] == "daemon":
    sock = args[args.index("--socket") + 1]
    open(sock, "w").close()
    done = []
    signal.signal(signal.SIGTERM, lambda *_: done.append(1))
    while not done:
        time.sleep(0.02)
    os.remove(sock)
    open(sock + ".stopped", "w").write(" ".join(args))
elif args[0] == "run":
    cut = args.index("--")
    with open(os.environ["FAKE_XP_LOG"], "a") as f:
        f.write(" ".join(args[1:cut]) + " socket=" + os.environ.get("XPREEMPT_SOCKET", "") + "\n")
    if os.environ.get("FAKE_XP_BIN_LOG"):
        with open(os.environ["FAKE_XP_BIN_LOG"], "a") as f:
            f.write(os.path.basename(sys.argv[0]) + " " + os.environ.get("XPREEMPT_SOCKET", "") + "\n")
    os.execvp(args[cut + 1], args[cut + 1:])
