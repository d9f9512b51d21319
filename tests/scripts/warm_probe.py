"""What a started process sees, as JSON on stdout (tests/test_warm_start.py):
run afresh and from a warm process, both must print the same."""

import json
import os
import signal
import sys
import time

import numpy as np

action = sys.argv[1] if len(sys.argv) > 1 else ""
if action == "term-handler":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
try:
    stdin = sys.stdin.read()
except OSError as e:
    stdin = f"error {e}"
print(json.dumps({
    "argv": sys.argv, "name": __name__, "file": __file__, "cwd": os.getcwd(),
    "path0": sys.path[0], "probe": os.environ.get("PROBE"),
    "gone": os.environ.get("GONE"), "stdin": stdin,
    "session_leader": os.getsid(0) == os.getpid(),
    "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "sigterm": signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL,)
    or action == "term-handler",
    "sigchld": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
    "sigpipe_ignored": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
    "random": np.random.random(), "main_module": sys.modules["__main__"].__name__,
}), flush=True)
if action == "raise":
    raise ValueError("the probe's own error")
if action in ("sleep", "term-handler"):
    print("sleeping", flush=True)
    time.sleep(60)
sys.exit(int(action) if action.isdigit() else 0)
