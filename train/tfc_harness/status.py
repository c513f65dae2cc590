"""``<state_dir>/status.json`` (written atomically) and the chief's progress lines.

status.json keys: ``role``, ``phase``, ``step``, ``total``, ``loss``, ``examples_per_sec``, ``updated``
(unix time), ``peak_rss_mb`` (the writing process's peak resident memory so far, its VmHWM), plus
``accuracy`` once the chief has evaluated and ``error`` when the phase is ``failed``.
ps and workers report the phase ``serving``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path


def log_line(msg: str) -> None:
    """Print ``msg`` and its newline in one write: ``print`` writes them apart, and a line another thread
    prints in between (a checkpoint's upload, logged from its own thread) would join the two, where the
    fault tests match whole lines such as ``^checkpoint saved at step N$``."""
    sys.stdout.write(f"{msg}\n")
    sys.stdout.flush()


PHASES = ("starting", "training", "evaluating", "publishing", "done", "failed", "serving", "preempted")
STATUS_FILE = "status.json"


def write_status(state_dir: str | os.PathLike, *, role: str, phase: str, step: int = 0, total: int = 0,
                 loss: float | None = None, examples_per_sec: float | None = None,
                 **extra) -> Path:
    """Replace ``<state_dir>/status.json`` atomically (temp file in the same dir, then rename)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
    doc = {"role": role, "phase": phase, "step": int(step), "total": int(total),
           "loss": None if loss is None else round(float(loss), 6),
           "examples_per_sec": None if examples_per_sec is None else round(float(examples_per_sec), 1),
           "updated": time.time(), "peak_rss_mb": peak_rss_mb()}
    doc.update(extra)
    directory = Path(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / STATUS_FILE
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".status.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (``ru_maxrss``, KiB on Linux: /proc's VmHWM)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def read_status(state_dir: str | os.PathLike) -> dict | None:
    """The current status document, or None when none was written yet."""
    try:
        return json.loads((Path(state_dir) / STATUS_FILE).read_text())
    except FileNotFoundError:
        return None


def format_progress(step: int, total: int, loss: float, examples_per_sec: float, eta_s: float) -> str:
    """``step 120/600 loss 0.4213 examples/s 3150.2 eta 4s``"""
    return (f"step {step}/{total} loss {loss:.4f} examples/s {examples_per_sec:.1f} "
            f"eta {max(0, round(eta_s))}s")


class Progress:
    """Throughput/ETA bookkeeping for the chief; ``due()`` says when a line is owed (about once a second)."""

    def __init__(self, total: int, batch_size: int, start_step: int = 0, interval_s: float = 1.0,
                 clock=time.monotonic):
        self.total = total
        self.batch_size = batch_size
        self.start_step = start_step
        self.interval_s = interval_s
        self._clock = clock
        self.started = clock()
        self._last_line = self.started

    def elapsed(self) -> float:
        return self._clock() - self.started

    def examples_per_sec(self, step: int) -> float:
        elapsed = self.elapsed()
        return (step - self.start_step) * self.batch_size / elapsed if elapsed > 0 else 0.0

    def eta_s(self, step: int) -> float:
        done = step - self.start_step
        return (self.total - step) * self.elapsed() / done if done > 0 else 0.0

    def due(self) -> bool:
        now = self._clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            return True
        return False

    def line(self, step: int, loss: float) -> str:
        return format_progress(step, self.total, loss, self.examples_per_sec(step), self.eta_s(step))


class ChiefState:
    """What a loop-running task (the chief; every task of a synchronous strategy) is doing (phase, step,
    loss, throughput, and the figures of the data stream it reads, if any), shared with the watchdogs and the
    failure handler; :meth:`report` writes it to status.json with any extra fields (``accuracy``, ``error``...)."""

    def __init__(self, state_dir: str | os.PathLike, total: int, role: str = "chief", run_id: str = ""):
        self.state_dir, self.role = state_dir, role
        self.run_id = run_id    # in every report: a status.json left by an earlier run is told apart
        self.total = total
        self.phase = "starting"
        self.step = 0
        self.loss: float | None = None
        self.examples_per_sec: float | None = None
        self.feed = None    # this task's data stream when it reads files itself (its stats() go to status)
        self.notes: list[str] = []   # lines for the user (the controller prints each once)

    def report(self, phase: str | None = None, **extra) -> None:
        if phase:
            self.phase = phase
        if self.feed is not None:
            extra.setdefault("data", self.feed.stats())
        if self.notes:
            extra.setdefault("notes", list(self.notes))
        if self.run_id:
            extra.setdefault("run_id", self.run_id)
        write_status(self.state_dir, role=self.role, phase=self.phase, step=self.step, total=self.total,
                     loss=self.loss, examples_per_sec=self.examples_per_sec, **extra)
