"""Watchdogs that end the chief from a side thread when the main thread cannot (it may be stuck in gRPC).

Each reports ``failed`` with a message in status.json, prints it to stderr and hard-exits with its own
code: :data:`TIMEOUT_EXIT_CODE` once ``max_runtime_s`` has passed, :data:`STALL_EXIT_CODE` when training
made no step for the stall timeout (the node's supervisor then restarts the chief, which resumes from the
newest checkpoint).  ``state`` is anything with ``phase``, ``step`` and ``report(phase, error=...)``
(:class:`tfc_harness.status.ChiefState`).
"""

from __future__ import annotations

import abc
import os
import sys
import threading
import time

TIMEOUT_EXIT_CODE = 3
STALL_EXIT_CODE = 4
DEFAULT_STALL_TIMEOUT_S = 90  # no training step for this long: the coordinator is stuck


def fail_hard(state, msg: str, code: int) -> None:
    """Report ``failed`` with ``msg``, print it and end the process now with ``code``."""
    try:
        state.report("failed", error=msg)
    finally:
        print(f"ERROR: {msg}", file=sys.stderr, flush=True)
        os._exit(code)


def start_runtime_watchdog(state, max_runtime_s: float, total_steps: int) -> threading.Timer:
    """After ``max_runtime_s`` report failure and exit with :data:`TIMEOUT_EXIT_CODE`; ``cancel()`` it."""
    def expire():
        fail_hard(state, f"chief: max_runtime_s={max_runtime_s:g} exceeded during phase {state.phase!r} at "
                  f"step {state.step}/{total_steps}; giving up", TIMEOUT_EXIT_CODE)

    timer = threading.Timer(max_runtime_s, expire)
    timer.daemon = True
    timer.start()
    return timer


class Periodic(abc.ABC):
    """Calls :meth:`tick` every ``interval_s`` in a daemon thread while a ``with`` block runs."""

    def __init__(self, interval_s: float, name: str):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def stopped(self) -> bool:
        return self._stop.is_set()

    @abc.abstractmethod
    def tick(self) -> None:
        """One look, every ``interval_s`` seconds, until stopped."""

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()


class StallWatchdog(Periodic):
    """Ends the chief with :data:`STALL_EXIT_CODE` when ``state.step`` does not move for ``timeout_s``.

    A ClusterCoordinator can hang for good while it recovers a worker whose link came back; exiting lets
    the node's supervisor restart the chief, which resumes from the newest checkpoint.
    """

    def __init__(self, state, timeout_s: float):
        super().__init__(1.0, "stall-watchdog")
        self.state, self.timeout_s = state, timeout_s
        self._last_step, self._since = state.step, time.monotonic()

    def tick(self) -> None:
        if self.state.step != self._last_step:
            self._last_step, self._since = self.state.step, time.monotonic()
        elif time.monotonic() - self._since > self.timeout_s and not self.stopped():
            fail_hard(self.state, f"chief: no training progress for {self.timeout_s:.0f}s at step {self._last_step}; "
                      "exiting so that the supervisor restarts the chief from the newest checkpoint",
                      STALL_EXIT_CODE)
