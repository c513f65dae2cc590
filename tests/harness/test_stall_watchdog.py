"""The chief's stall watchdog ends a process whose training makes no step, so its supervisor restarts it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "train"

SCRIPT = """
import sys, time, types
sys.path.insert(0, {train!r})
from tfc_harness.watchdogs import StallWatchdog
reports = []
state = types.SimpleNamespace(step=7, report=lambda *a, **k: reports.append(k))
StallWatchdog(state, {timeout}).__enter__()
{body}
print("still alive", flush=True)
"""


def run(body: str, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-c", SCRIPT.format(train=str(TRAIN), timeout=timeout, body=body)],
                         capture_output=True, text=True, timeout=60)
    return res, time.monotonic() - start


def test_no_progress_exits_with_code_4_naming_the_step():
    res, took = run("time.sleep(30)", 2)
    assert res.returncode == 4, res.stdout + res.stderr
    assert "no training progress for 2s at step 7" in res.stderr
    assert "still alive" not in res.stdout and took < 20


def test_progress_keeps_it_quiet():
    res, _ = run("for i in range(6):\n    time.sleep(0.5); state.step += 1", 2)
    assert res.returncode == 0 and "still alive" in res.stdout, res.stderr
