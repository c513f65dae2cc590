"""A task that crashes in native code (TensorFlow's C++, a library's) leaves every thread's Python stack in the
node's log: the entry script (train/entry.py.j2) enables Python's fault handler before the harness runs (a
chief's SIGSEGV at its first step, seen once in `make bench`, left only 'exit -11' in its log). The exit
status stays the signal's, which the supervisor reports and restarts on. The script runs as a task runs it:
as the program, or as ``__main__`` through runpy (a fork of the node's warm interpreter)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from harness_support import node_env, render_entry

#: a harness whose main crashes the process (the entry script imports tfc_harness from its harness folder)
CRASHING_HARNESS = '''
import os, signal

def crashing_here(settings):
    os.kill(os.getpid(), signal.SIGSEGV)

main = crashing_here
'''


@pytest.mark.parametrize("through_runpy", [False, True])
def test_a_crash_in_the_task_writes_the_python_stack_and_keeps_the_signal_status(tmp_path, through_runpy):
    harness = tmp_path / "harness"
    (harness / "tfc_harness").mkdir(parents=True)
    (harness / "tfc_harness" / "__init__.py").write_text(CRASHING_HARNESS)
    entry = tmp_path / "entry.py"
    entry.write_text(render_entry(harness, {}))
    program = ["-c", f"import runpy; runpy.run_path({str(entry)!r}, run_name='__main__')"] if through_runpy \
        else [str(entry)]
    res = subprocess.run([sys.executable, *program], capture_output=True, text=True, timeout=60, env=node_env(),
                         cwd=tmp_path)
    assert res.returncode == -signal.SIGSEGV, res.stderr
    assert "Fatal Python error: Segmentation fault" in res.stderr, res.stderr
    assert "in crashing_here" in res.stderr and "entry.py" in res.stderr, res.stderr
