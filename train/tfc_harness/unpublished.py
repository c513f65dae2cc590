"""``<state_dir>/unpublished.json``: this node holds training state that S3 does not have.

Written when a checkpoint upload or the publishing fails, removed once the run is published; the
controller's ``down`` refuses to destroy a node that has it (unless forced).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

UNPUBLISHED = "unpublished.json"


def mark(state_dir: str | os.PathLike, run_id: str, step: int, reason: str, checkpoint_dir: str | os.PathLike) -> None:
    """Record ``{"run_id", "step", "reason", "checkpoints"}`` atomically."""
    path = Path(state_dir) / UNPUBLISHED
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"run_id": run_id, "step": step, "reason": reason, "checkpoints": str(checkpoint_dir)}))
    os.replace(tmp, path)


def clear(state_dir: str | os.PathLike) -> None:
    (Path(state_dir) / UNPUBLISHED).unlink(missing_ok=True)
