"""A controller's harness process ends as the interpreter's own end would for everything it owes its caller
(its non-daemon threads joined before the atexit handlers and weakref finalizers run, buffered output
flushed, the exit code), without tearing its modules down (tfc_harness.ending: the module check's and the
verifying evaluator's end)."""

from __future__ import annotations

import ast
import os
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
        print("torn down")     # only the interpreter's teardown of this module gets here

HELD = Held()
kept = Held.__new__(Held)
done = []
weakref.finalize(kept, print, "finalized")
atexit.register(lambda: print(f"atexit ran, the thread done: {bool(done)}"))
threading.Thread(target=lambda: (time.sleep(0.3), done.append(1))).start()
sys.stdout.write("buffered, ")     # a pipe, no PYTHONUNBUFFERED: block-buffered, none of it flushed yet
sys.stderr.write("an error line")  # line-buffered: not flushed without a newline
if sys.argv[1] == "ending":
    ending.exit_now(258)
sys.exit(258)                      # the OS keeps the low 8 bits: 2
"""


def _run(how: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-c", CHILD, how], cwd=TRAIN, capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("how", ["ending", "interpreter"])
def test_the_process_owes_its_caller_the_same_whichever_way_it_ends(how):
    res = _run(how)
    assert res.returncode == 2, res
    lines = res.stdout.splitlines()
    # atexit after the thread's join, the finalizers after it (registered first), all of it flushed at the end
    assert lines[:2] == ["buffered, atexit ran, the thread done: True", "finalized"], res.stdout
    assert res.stderr == "an error line", res.stderr
    # the difference: the interpreter tears the module down (its objects' __del__ run), exit_now does not
    assert lines[2:] == ([] if how == "ending" else ["torn down", "torn down"]), res.stdout


def test_none_is_exit_status_0_as_for_the_interpreter():
    res = subprocess.run([sys.executable, "-c", "from tfc_harness import ending; ending.exit_now(None)"],
                         cwd=TRAIN, capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stderr) == (0, ""), res


@pytest.mark.parametrize("module", ["prepare", "evaluate"])
def test_the_check_and_the_evaluator_end_through_it(module):
    tree = ast.parse((TRAIN / "tfc_harness" / f"{module}.py").read_text())
    (main_block,) = [node for node in tree.body if isinstance(node, ast.If)
                     and ast.unparse(node.test) == "__name__ == '__main__'"]
    assert [ast.unparse(s) for s in main_block.body] == ["ending.exit_now(main())"]
