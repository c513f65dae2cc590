"""Preemption: a spot or preemptible VM's notice makes the run checkpoint at once, not at the next interval.

The node's supervisor (``tfc-supervise``) watches the provider's notice (AWS's spot ``instance-action``, GCP's
``preempted`` flag, in the instance metadata) and its own SIGTERM (the VM shutting down), and passes it to the
task as SIGUSR1; the task takes SIGTERM the same way (a shutdown signals every process).  :func:`listen`
turns either into :data:`NOTICE`.  The controller's stop of a chief after a Ctrl-C sends the same SIGUSR1
first (``tfc-supervise stop --save``): the step reached is saved, and the next train resumes there.

- A task that runs the training loop asks :meth:`Notices.agree` after each chunk of steps; under a
  synchronous strategy the tasks agree first (the strategy's ``agree``: one all-reduce of the flag, of the
  next chunk's steps and of whether a checkpoint is due, per call), so that every task saves the same step.
  The loop then saves that step, uploads it and ends with :data:`PREEMPTED_EXIT_CODE`; the next
  ``make train`` (on replacement nodes: ``make up`` first) resumes it.
- A task that only serves (a parameter server, a worker under ``parameter_server``) cannot save: it writes a
  marker ``<run_prefix>/preemption/<role>-<index>`` to S3, which the chief polls (:class:`Notices`).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

from . import s3io
from .status import log_line

PREEMPTED_EXIT_CODE = 5
MARKERS = "preemption"
POLL_S = 2.0

NOTICE = threading.Event()


log = log_line    # one write a line: threads log beside each other (status.log_line)


def listen() -> None:
    """SIGUSR1 (the supervisor's notice) and SIGTERM (a shutdown) set :data:`NOTICE` instead of ending the
    process; the loop or the serving task acts on it."""
    def handler(signum, _frame):
        if not NOTICE.is_set():
            print(f"notice ({signal.Signals(signum).name}; a preemption, or a stop that saves first): saving "
                  "the step reached at once", file=sys.stderr, flush=True)
        NOTICE.set()

    signal.signal(signal.SIGUSR1, handler)
    signal.signal(signal.SIGTERM, handler)


class Preempted(Exception):
    """Training stopped at ``step`` on a notice, after saving that step."""

    def __init__(self, step: int, who: str):
        super().__init__(f"preempted at step {step} ({who}); the checkpoint of step {step} is saved")
        self.step, self.who = step, who


def marker_prefix(settings) -> str:
    return f"{settings.s3.run_prefix}/{MARKERS}/"


def mark(client, settings) -> None:
    """A serving task's notice, for the chief to see (best effort: the node may be gone in seconds)."""
    key = f"{marker_prefix(settings)}{settings.role}-{settings.index}"
    try:
        client.put_object(Bucket=settings.s3.bucket, Key=key,
                          Body=json.dumps({"role": settings.role, "index": settings.index, "time": time.time()}))
        log(f"{settings.role} {settings.index}: preemption notice written to s3://{settings.s3.bucket}/{key}")
    except Exception as exc:  # noqa: BLE001 - the notice must not end the task before its VM does
        print(f"warning: could not write the preemption notice to S3: {exc}", file=sys.stderr, flush=True)


def clear(client, settings) -> None:
    """Forget the notices of an earlier attempt of this run (the chief, before it trains), retried as every S3
    request of the harness is (:func:`tfc_harness.s3io.with_retries`): a throttled listing here failed the
    chief's start, and its restart failed the same way, under a store failing 15 % of requests."""
    bucket = settings.s3.bucket
    keys = list(s3io.list_keys(client, bucket, marker_prefix(settings), log=log))
    if keys:
        s3io.delete_keys(client, bucket, keys, log=log)


class Notices:
    """What the loop asks after each chunk: this task's own notice, another task's marker in S3 (polled
    in the background when ``client`` is given) and, through ``agree``, the other training tasks'."""

    def __init__(self, settings, client=None, agree=None):
        self.settings, self.client = settings, client
        self._agree = agree or (lambda stop, chunk, due: (stop, chunk, due))
        self.who = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="preemption-notices")

    def __enter__(self):
        if self.client is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _poll(self) -> None:
        s3 = self.settings.s3
        while not self._stop.wait(POLL_S) and not NOTICE.is_set():
            try:
                listed = self.client.list_objects_v2(Bucket=s3.bucket, Prefix=marker_prefix(self.settings))
            except Exception:  # noqa: BLE001 - S3 hiccups: look again at the next poll
                continue
            keys = [o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", [])]
            if keys:
                self.who = ", ".join(keys)
                NOTICE.set()

    def agree(self, chunk: int, due: bool) -> tuple[int, bool] | None:
        """The steps of the next call and whether a checkpoint is due (this task's ``chunk`` and ``due``, or what
        the training tasks agreed), or None when they stop now: this task's notice, another's marker, or under
        a synchronous strategy any task's."""
        stop, agreed, due = self._agree(NOTICE.is_set(), chunk, due)
        if not stop:
            return agreed, due
        self.who = self.who or (f"{self.settings.role} {self.settings.index}" if NOTICE.is_set() else "a peer")
        return None
