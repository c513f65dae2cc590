"""The run manifest: sha256 and size of every published model file.

``manifest.json``::

    {"files": {"model/saved_model.pb": {"sha256": "...", "size": 12345}, ...},
     "run_id": "...", "cluster": "...", "created": "2026-11-22T04:15:00Z"}

Keys under ``files`` are relative to ``s3://<bucket>/<run_prefix>/`` and always use ``/``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
from pathlib import Path

MODEL_DIR = "model"


class ManifestMismatch(ValueError):
    """A file is missing, has the wrong size or the wrong sha256; the message names it."""


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def model_files(model_dir: str | os.PathLike) -> dict[str, Path]:
    """``{"model/<rel>": local path}`` for every file of a SavedModel directory, sorted."""
    root = Path(model_dir)
    return {f"{MODEL_DIR}/{p.relative_to(root).as_posix()}": p
            for p in sorted(root.rglob("*")) if p.is_file()}


def build_manifest(files: dict[str, Path], run_id: str, cluster: str, created: str | None = None) -> dict:
    """Manifest document for ``files`` (as returned by :func:`model_files`)."""
    if not files:
        raise ValueError("refusing to build a manifest without files")
    created = created or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"files": {key: {"sha256": sha256_file(path), "size": path.stat().st_size}
                      for key, path in sorted(files.items())},
            "run_id": run_id, "cluster": cluster, "created": created}


def check_files(manifest: dict, root: str | os.PathLike) -> list[str]:
    """Check every manifest entry against ``root/<key>``; return the checked keys.

    Raises :class:`ManifestMismatch` naming the first missing or corrupted file.
    """
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ManifestMismatch("manifest lists no files")
    base = Path(root).resolve()
    for key, meta in sorted(files.items()):
        path = (base / key).resolve()
        if base not in path.parents:
            raise ManifestMismatch(f"{key}: path escapes the download directory")
        if not path.is_file():
            raise ManifestMismatch(f"{key}: missing")
        size = path.stat().st_size
        if size != meta.get("size"):
            raise ManifestMismatch(f"{key}: size {size} != manifest {meta.get('size')}")
        digest = sha256_file(path)
        if digest != meta.get("sha256"):
            raise ManifestMismatch(f"{key}: sha256 {digest} != manifest {meta.get('sha256')}")
    return sorted(files)
