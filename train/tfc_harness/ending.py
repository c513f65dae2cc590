"""The end of a controller's harness process that imported TensorFlow (the module check and data step,
:mod:`tfc_harness.prepare`; the verifying evaluator, :mod:`tfc_harness.evaluate`): the caller waits for its
exit, so the interpreter's teardown of TensorFlow's modules (~0.45 s of CPU, measured on a 2-core machine) lies
on the path of every ``train``. A node's task ends the same way (``tfc-warm``, :func:`tfc_harness.runner.end_now`).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` as the interpreter's own end does (its non-daemon threads joined, the
    ``atexit`` handlers run, ``weakref.finalize`` callbacks among them, stdout and stderr flushed), then
    ``os._exit``: the modules are not torn down. The harness wrote and closed its outputs by now; a file that
    the user's module left open and unflushed at the end would not be flushed (nor is it on a node)."""
    try:
        threading._shutdown()    # noqa: SLF001 - as the interpreter's end: non-daemon threads are joined first
        atexit._run_exitfuncs()  # noqa: SLF001
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):   # a closed pipe or stream: nothing left to say
                pass
        os._exit(code & 0xFF)
