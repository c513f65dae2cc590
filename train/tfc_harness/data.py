"""Datasets in object storage: ``<dataset_prefix>/train.npz`` and ``test.npz``.

Each is an ``.npz`` with two arrays: ``x`` (float32, ``[N, ...]``) and ``y`` (int64, ``[N]``).  The
controller creates them once from the model module (:func:`ensure_dataset`); each worker downloads
``train.npz`` and keeps rows ``index::num_workers`` (:func:`shard_rows`).  numpy and boto3 only: no
TensorFlow import here.
"""

from __future__ import annotations

import io
from types import ModuleType

import numpy as np

from . import s3io, usermodel

SPLITS = ("train", "test")


def split_key(dataset_prefix: str, split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return s3io.join_key(dataset_prefix, f"{split}.npz")


def array_problem(x: np.ndarray, y: np.ndarray) -> str | None:
    """What makes ``(x, y)`` unusable as a split, or None: shapes, then the dtypes of y and x."""
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y) or len(x) == 0:
        return f"x with shape {x.shape} and y with shape {y.shape}; need x [N, ...] and y [N] with N > 0"
    if not np.issubdtype(y.dtype, np.integer):
        return (f"y with {y.dtype} values; y must hold integer class ids (the harness trains classifiers: "
                "regression targets are not supported)")
    if not np.issubdtype(x.dtype, np.floating):
        return f"x with {x.dtype} values; x must be floating point"
    return None


def check_arrays(x, y, what: str = "dataset") -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x float32, y int64)``; raise ValueError when shapes or dtypes are unusable."""
    x, y = np.asarray(x), np.asarray(y)
    problem = array_problem(x, y)
    if problem:
        raise ValueError(f"{what}: {problem}")
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


def to_npz_bytes(x, y) -> bytes:
    x, y = check_arrays(x, y)
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    return buf.getvalue()


def from_npz_bytes(data: bytes, what: str = "npz") -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        if "x" not in npz.files or "y" not in npz.files:
            raise ValueError(f"{what}: needs arrays 'x' and 'y' (has {npz.files})")
        return check_arrays(npz["x"], npz["y"], what)


def load_split(s3_client, bucket: str, dataset_prefix: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Download and parse one split."""
    key = split_key(dataset_prefix, split)
    return from_npz_bytes(s3io.get_bytes(s3_client, bucket, key), f"s3://{bucket}/{key}")


def shard_rows(x: np.ndarray, y: np.ndarray, index: int, num_workers: int):
    """Rows ``index::num_workers``: worker ``index``'s share (disjoint, together everything)."""
    if num_workers < 1 or not 0 <= index < num_workers:
        raise ValueError(f"worker index {index} out of range for {num_workers} worker(s)")
    if len(x) < num_workers:
        raise ValueError(f"{len(x)} training rows cannot be shared by {num_workers} workers")
    return x[index::num_workers], y[index::num_workers]


def ensure_dataset(s3_client, bucket: str, dataset_prefix: str, model_module: str | ModuleType) -> dict:
    """Upload ``train.npz``/``test.npz`` from ``model_module.make_dataset()`` unless both exist.

    ``model_module`` is a module object or a name/path understood by :func:`tfc_harness.usermodel.load`.
    Returns ``{"uploaded": bool, "keys": [...], "rows": {"train": n, "test": n} (when uploaded)}``.
    A problem in the user's module raises :class:`tfc_harness.errors.ModelModuleError` naming it.
    """
    keys = [split_key(dataset_prefix, s) for s in SPLITS]
    if all(s3io.exists(s3_client, bucket, k) for k in keys):
        return {"uploaded": False, "keys": keys}
    splits = splits_from_module(usermodel.load(model_module))
    for split, key in zip(SPLITS, keys, strict=True):
        s3io.upload_bytes(s3_client, to_npz_bytes(*splits[split]), bucket, key)
    return {"uploaded": True, "keys": keys, "rows": {split: len(splits[split][0]) for split in SPLITS}}


def splits_from_module(module: ModuleType) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``module.make_dataset()``, checked: ``{"train": (x float32, y int64), "test": (...)}``.

    Raises :class:`tfc_harness.usermodel.ModelModuleError` naming the module, ``make_dataset()`` and
    what is wrong with which split.
    """
    splits = usermodel.call(module, "make_dataset")
    if not isinstance(splits, dict) or set(SPLITS) - set(splits):
        got = sorted(splits) if isinstance(splits, dict) else type(splits).__name__
        raise usermodel.fail(module, "make_dataset", f"returned {got}; it must return "
                             "{'train': (x, y), 'test': (x, y)}")
    checked = {}
    for split in SPLITS:
        pair = splits[split]
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise usermodel.fail(module, "make_dataset", f"returned {type(pair).__name__} for the {split!r} "
                                 "split; each split must be a pair (x, y)")
        x, y = np.asarray(pair[0]), np.asarray(pair[1])
        problem = array_problem(x, y)
        if problem:
            raise usermodel.fail(module, "make_dataset", f"returned {problem} (in the {split!r} split)")
        checked[split] = (x.astype(np.float32, copy=False), y.astype(np.int64, copy=False))
    return checked
