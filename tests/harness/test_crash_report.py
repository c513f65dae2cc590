"""A task that crashes in native code (TensorFlow's C++, a library's) leaves every thread's Python stack in the
node's log: the harness's main enables Python's fault handler first (a chief's SIGSEGV at its first step,
seen once in `make bench`, left only 'exit -11' in its log). The exit status stays the signal's, which the
supervisor reports and restarts on."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from harness_support import TRAIN_DIR, node_env


def test_a_crash_after_main_started_writes_the_python_stack_and_keeps_the_signal_status():
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(TRAIN_DIR)!r})
        from tfc_harness import runner
        assert runner.main({{}}) == 2       # invalid settings: returns, the handler enabled before the check
        def crashing_here():
            os.kill(os.getpid(), signal.SIGSEGV)
        crashing_here()
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=node_env())
    assert res.returncode == -signal.SIGSEGV, res.stderr
    assert "Fatal Python error: Segmentation fault" in res.stderr, res.stderr
    assert "in crashing_here" in res.stderr, res.stderr
