"""The end of a controller's harness process that imported TensorFlow (the module check and data step,
:mod:`tfc_harness.prepare`; the verifying evaluator, :mod:`tfc_harness.evaluate`): the caller waits for its
exit, so the interpreter's teardown of TensorFlow's modules (~0.45 s of CPU, measured on a 2-core machine) lies
on the path of every ``train``. ``tfc-warm`` ends a task it forked the same way; a task that ran the loop
ends sooner still (:func:`tfc_harness.runner.end_now`: its output flushed, no ``atexit``).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from typing import NoReturn


def exit_now(code: int | None) -> NoReturn:
    """End the process with ``code`` (None: 0) as the interpreter's own end does for what a caller reads: its
    non-daemon threads joined (an exception there, a Ctrl-C among them, reported as the interpreter reports
    it, and the end goes on), then the ``atexit`` handlers run, ``weakref.finalize`` callbacks among them, then
    Python's stdout and stderr flushed; then ``os._exit``: the modules are not torn down. The harness wrote
    and closed its outputs by now. Not done, as on a node: ``__del__`` of objects still alive, the flush of a
    file the user's module left open, and of native code's C stdio buffers."""
    try:
        try:
            threading._shutdown()    # noqa: SLF001 - as the interpreter's end: non-daemon threads first
        except BaseException:   # noqa: BLE001 - the interpreter reports it and goes on to atexit
            traceback.print_exc()
        atexit._run_exitfuncs()      # noqa: SLF001
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):   # a closed pipe or stream: nothing left to say
                pass
        os._exit((code or 0) & 0xFF)
