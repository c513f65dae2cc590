"""A serving task stopped by its supervisor (SIGINT) leaves at once with exit code 130 and says so, without
Python's and TensorFlow's teardown (tfc_harness.server)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tfc_harness import server

TRAIN = Path(__file__).resolve().parents[2] / "train"
CHILD = """
import shutil, signal, sys, threading, time
from tfc_harness import server
server._ON_STOP.append(lambda: shutil.rmtree(sys.argv[1]))     # as a worker's kept stream files
signal.signal(signal.SIGINT, server._leave_at_once)
threading.Thread(target=time.sleep, args=(600,)).start()   # a live non-daemon thread: a normal exit would wait
print("ready", flush=True)
while True:
    print("busy", file=sys.stderr)    # printing when the signal lands must not keep it from leaving
"""


def test_a_stopped_serving_task_leaves_at_once_with_130(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "0").write_bytes(b"a kept file")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(kept)], cwd=TRAIN, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
        took = time.monotonic() - sent
        out = proc.stdout.read()
    finally:
        proc.kill()
    assert code == server.STOPPED_EXIT_CODE == 130
    assert "stopped: leaving without TensorFlow's teardown" in out
    assert took < 10      # a thread sleeping 600 s would have held a normal exit
    assert not kept.exists()      # what it had to remove first is gone
