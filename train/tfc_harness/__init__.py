"""tfc_harness: runs one node of a tfcluster training run (ps, worker or chief).

On a node the rendered entry script calls :func:`main` with the node's settings dict
(:mod:`tfc_harness.settings`).  The controller imports :mod:`tfc_harness.data` (dataset upload) and
:mod:`tfc_harness.verify` (read a published run back and evaluate it).  Importing the package does not
import TensorFlow.

Modules: ``settings`` (validation), ``runner`` (process setup, role dispatch), ``server`` (ps/worker),
``chief`` (training loop), ``records`` (worker shard, tf.data), ``checkpoints`` (S3 mirror of
checkpoints), ``publish`` (SavedModel export and upload), ``manifest`` (sha256 list), ``evaluate``,
``verify``, ``data`` (datasets in S3), ``s3io`` (boto3 client, retrying transfers), ``status``
(status.json, progress lines), ``usermodel`` (loading ``models/<name>.py``).
"""

from __future__ import annotations


def main(settings: dict) -> int:
    """Run this node's role from its settings dict and return the process exit code."""
    from .runner import main as _main
    return _main(settings)


__all__ = ["main"]
