"""The chief's checkpoint files: kept locally and mirrored to ``s3://<bucket>/<checkpoint_prefix>/``.

A checkpoint numbered N is the local files ``ckpt-N.*`` (``.index`` plus one or more ``.data-*``), as
``tf.train.Checkpoint.write`` leaves them (its ``.index`` is written last: a checkpoint is complete once it
exists).  In S3 they sit flat under the prefix, the ``.index`` uploaded last, so a checkpoint counts as
complete once its ``.index`` key exists.  Pure boto3; TensorFlow is only used by the chief around these
helpers (:class:`tfc_harness.saver.Saver`).
"""

from __future__ import annotations

import re
from pathlib import Path

from . import s3io

PREFIX = "ckpt"
KEEP = 3
_INDEX = re.compile(rf"^{PREFIX}-(\d+)\.index$")


def local_prefix(local_dir: str | Path, step: int) -> Path:
    """The path checkpoint ``step`` is written to and restored from in ``local_dir`` (its files' common prefix)."""
    return Path(local_dir) / f"{PREFIX}-{step}"


def checkpoint_files(local_dir: str | Path, step: int) -> list[Path]:
    """Local files of checkpoint ``step``, data files first and the ``.index`` last."""
    files = sorted(Path(local_dir).glob(f"{PREFIX}-{step}.*"))
    if not any(f.suffix == ".index" for f in files):
        raise FileNotFoundError(f"no {PREFIX}-{step}.index in {local_dir}")
    return sorted(files, key=lambda f: (f.suffix == ".index", f.name))


def local_steps(local_dir: str | Path) -> list[int]:
    """Steps of the complete checkpoints in ``local_dir``, ascending."""
    found = (_INDEX.match(path.name) for path in Path(local_dir).glob(f"{PREFIX}-*.index"))
    return sorted(int(match.group(1)) for match in found if match)


def prune_local(local_dir: str | Path, keep: int = KEEP) -> None:
    """Remove all but the newest ``keep`` complete checkpoints from ``local_dir`` (a checkpoint still being
    written, its ``.index`` not there yet, is left). The ``.index`` goes first: a removal cut short leaves
    data files no step counts, never an ``.index`` without its data."""
    for step in local_steps(local_dir)[:-keep]:
        for path in reversed(checkpoint_files(local_dir, step)):
            path.unlink(missing_ok=True)


def saved_steps(s3_client, bucket: str, prefix: str, **retries) -> list[int]:
    """Steps of the complete checkpoints under ``prefix``, ascending (``retries``: ``tries``, ``log`` as
    :func:`tfc_harness.s3io.with_retries` takes them)."""
    steps = []
    for key in s3io.list_keys(s3_client, bucket, prefix, **retries):
        match = _INDEX.match(key.rsplit("/", 1)[-1])
        if match:
            steps.append(int(match.group(1)))
    return sorted(steps)


def upload(s3_client, bucket: str, prefix: str, local_dir: str | Path, step: int, keep: int = KEEP) -> None:
    """Upload checkpoint ``step``; then drop all but the newest ``keep`` checkpoints from S3."""
    for path in checkpoint_files(local_dir, step):
        s3io.upload_file(s3_client, path, bucket, s3io.join_key(prefix, path.name))
    old = saved_steps(s3_client, bucket, prefix)[:-keep]
    if old:
        stale = re.compile(rf"^{PREFIX}-({'|'.join(map(str, old))})\.")
        s3io.delete_keys(s3_client, bucket, [k for k in s3io.list_keys(s3_client, bucket, prefix)
                                             if stale.match(k.rsplit("/", 1)[-1])])


def download_latest(s3_client, bucket: str, prefix: str, local_dir: str | Path) -> tuple[int, Path] | None:
    """Fetch the newest complete checkpoint; ``(step, local path prefix for restore)`` or None."""
    steps = saved_steps(s3_client, bucket, prefix)
    if not steps:
        return None
    step = steps[-1]
    wanted = f"{PREFIX}-{step}."
    for key in s3io.list_keys(s3_client, bucket, prefix):
        name = key.rsplit("/", 1)[-1]
        if name.startswith(wanted):
            s3io.download_file(s3_client, bucket, key, Path(local_dir) / name)
    return step, local_prefix(local_dir, step)
