"""A controller's harness process ends as the interpreter's own end would for everything it owes its caller
(its non-daemon threads joined, atexit handlers and weakref finalizers run, buffered output flushed, the exit
code), without tearing its modules down (tfc_harness.ending; the module check and the verifying evaluator)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "train"
CHILD = """
import atexit, sys, threading, time, weakref
from tfc_harness import ending

class Held:
    def __del__(self):
        print("torn down", flush=True)     # only the interpreter's teardown of this module gets here

HELD = Held()
kept = Held.__new__(Held)
weakref.finalize(kept, print, "finalized", flush=True)
atexit.register(print, "atexit ran", flush=True)
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
sys.stdout.write("buffered, ")     # a pipe: block-buffered, not flushed yet
sys.stderr.write("an error line")
if sys.argv[1] == "ending":
    ending.exit_now(258)           # an exit code above 255 is taken modulo 256, as the OS does
sys.exit(258 % 256)
"""


def _run(how: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, how], cwd=TRAIN, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("how", ["ending", "interpreter"])
def test_the_process_owes_its_caller_the_same_whichever_way_it_ends(how):
    res = _run(how)
    assert res.returncode == 2, res
    assert res.stdout.startswith("buffered, "), res.stdout
    for line in ("thread done", "finalized", "atexit ran"):
        assert line in res.stdout.splitlines() or f"buffered, {line}" in res.stdout.splitlines(), res.stdout
    assert res.stderr == "an error line", res.stderr
    # the difference: the interpreter tears the module down (its objects' __del__ run), exit_now does not
    assert ("torn down" in res.stdout) == (how == "interpreter"), res.stdout
