"""tfc_harness: runs one node of a tfcluster training run (ps, worker or chief).

On a node the rendered entry script calls :func:`main` with the node's settings dict
(:mod:`tfc_harness.settings`).  The controller imports :mod:`tfc_harness.data` (dataset upload) and
:mod:`tfc_harness.verify` (read a published run back and evaluate it).  Importing the package does not
import TensorFlow.

Modules, one job each: ``runner`` (process setup, dispatch to the node's strategy), ``settings``
(pydantic model), ``strategies`` (shape table, ``Strategy`` interface, registry; no TensorFlow import),
``parameter_server`` (that strategy), ``server`` (serving tasks, a worker's shard), ``chief`` (sequences
the node that runs the loop), ``loop`` (train/report/checkpoint), ``steps`` (one replica's step), ``saver``
(restore/save checkpoints), ``traced`` (functions traced once for a set of variables), ``peers`` (start
barrier, peer monitor), ``watchdogs`` (runtime and stall), ``unpublished`` (marker), ``records`` (worker
shard, tf.data), ``checkpoints`` (local checkpoints kept, mirrored to S3), ``publish`` (SavedModel export
and upload), ``manifest`` (sha256 list), ``evaluate``, ``verify``,
``data`` (datasets in S3), ``s3io`` (boto3 client, retrying transfers), ``status`` (status.json, progress
lines), ``usermodel`` (loading and calling ``models/<name>.py``), ``errors`` (``HarnessError``,
``ModelModuleError``: one-line messages for the operator).
"""

from __future__ import annotations


def main(settings: dict) -> int:
    """Run this node's role from its settings dict and return the process exit code."""
    from .runner import main as _main
    return _main(settings)


__all__ = ["main"]
