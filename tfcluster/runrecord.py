"""The record of a cluster's training run: ``.tfcluster/<cluster>/run.json``.

A run that did not finish keeps its id, so the next ``make train`` with the same model and batch size
resumes from its checkpoints; ``down`` refuses while the record says the only copy of a model might be
lost (see :func:`tfcluster.teardown.down_guard`).
"""

from __future__ import annotations

import json
import secrets
import time
from enum import StrEnum

from .paths import ClusterState


class RunState(StrEnum):
    STARTED = "started"              # training (or the controller was stopped while it trained)
    INTERRUPTED = "interrupted"      # Ctrl-C during train: tasks stopped, checkpoints in S3
    PREEMPTED = "preempted"          # a preemption notice: the step reached was checkpointed to S3 at once
    FAILED = "failed"
    UNPUBLISHED = "unpublished"      # trained, but S3 did not take the result: it is kept on the chief
    UNVERIFIED = "unverified"        # the chief published; the controller has not verified it yet
    VERIFIED = "verified"
    VERIFY_FAILED = "verify_failed"
    ABANDONED = "abandoned"          # its cluster was destroyed while the run was open


#: a model may exist only on the cluster, or not yet be checked: `down` refuses (without --force)
OPEN = (RunState.STARTED, RunState.UNVERIFIED, RunState.UNPUBLISHED)
#: states whose checkpoints the next `make train` resumes from (with the same model and batch size)
RESUMABLE = (RunState.STARTED, RunState.INTERRUPTED, RunState.PREEMPTED, RunState.FAILED,
             RunState.UNPUBLISHED)


def read(state: ClusterState) -> dict:
    """The record, or {} when there is none (or it cannot be read)."""
    try:
        return json.loads(state.run.read_text())
    except (OSError, ValueError):
        return {}


def write(state: ClusterState, run: dict) -> None:
    """Replace the record atomically, stamping the time."""
    run["updated"] = time.time()
    tmp = state.run.with_suffix(".tmp")
    tmp.write_text(json.dumps(run, indent=2) + "\n")
    tmp.replace(state.run)


def new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
