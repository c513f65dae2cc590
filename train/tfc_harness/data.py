"""Data sets a model module builds itself: ``<dataset_prefix>/train.npz`` and ``test.npz``.

Each is an ``.npz`` with two arrays: ``x`` (float32, ``[N, ...]``) and ``y`` (``[N, ...]``: int64 for
integer labels such as class ids, float32 otherwise).  The controller calls ``make_dataset()`` for every
run and stores the result under a prefix named by its content (:func:`ensure_dataset`,
``datasets/<model>-<sha256 of the arrays, 12 hex>``): changed data gets a new prefix and is never replaced
by an old copy, unchanged data is not uploaded twice.  Each worker downloads ``train.npz`` and keeps rows
``index::num_workers`` (:func:`shard_rows`).  numpy and boto3 only: no TensorFlow import here.
"""

from __future__ import annotations

import hashlib
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
    if x.ndim < 2 or y.ndim < 1 or len(x) != len(y) or len(x) == 0:
        return f"x with shape {x.shape} and y with shape {y.shape}; need x [N, ...] and y [N, ...] with N > 0"
    for name, arr in (("y", y), ("x", x)):
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            return f"{name} with {arr.dtype} values; {name} must be numeric"
    if not np.all(np.isfinite(x)) or (np.issubdtype(y.dtype, np.floating) and not np.all(np.isfinite(y))):
        return "values that are NaN or infinite"
    return None


def label_dtype(y: np.ndarray):
    """int64 for integer (or boolean) labels, float32 for everything else."""
    return np.int64 if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_ else np.float32


def check_arrays(x, y, what: str = "dataset") -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x float32, y int64 or float32)``; raise ValueError when shapes or dtypes are unusable."""
    x, y = np.asarray(x), np.asarray(y)
    problem = array_problem(x, y)
    if problem:
        raise ValueError(f"{what}: {problem}")
    return x.astype(np.float32, copy=False), y.astype(label_dtype(y), copy=False)


def content_hash(splits: dict[str, tuple[np.ndarray, np.ndarray]]) -> str:
    """sha256 over every split's arrays (dtype, shape and bytes): the data set's identity."""
    digest = hashlib.sha256()
    for split in SPLITS:
        for arr in splits[split]:
            arr = np.ascontiguousarray(arr)
            digest.update(f"{split}:{arr.dtype.str}:{arr.shape};".encode())
            digest.update(arr.data)
    return digest.hexdigest()


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


def ensure_dataset(s3_client, bucket: str, base_prefix: str, module: ModuleType | str) -> dict:
    """Store ``module.make_dataset()`` under ``<base_prefix>-<hash12>/`` unless that content is there.

    ``module`` is a module object or a name/path :func:`tfc_harness.usermodel.load` understands.  Returns
    ``{"prefix", "sha256", "uploaded": bool, "rows": {"train": n, "test": n}, "splits"}`` (the checked
    arrays, for the caller's own checks).  A problem in the user's module raises
    :class:`tfc_harness.errors.ModelModuleError` naming it.
    """
    return store_splits(s3_client, bucket, base_prefix, splits_from_module(usermodel.load(module)))


def versions_prefix(base_prefix: str) -> str:
    """The key prefix every content-named data set of ``base_prefix`` starts with (``datasets/digits`` ->
    ``datasets/digits-``): what a node that reads this module's data sets needs access to."""
    return f"{base_prefix.strip('/')}-"


def store_splits(s3_client, bucket: str, base_prefix: str, splits: dict) -> dict:
    """Upload checked splits under ``<base_prefix>-<hash12>/`` unless that content is there (see
    :func:`ensure_dataset`, which returns the same)."""
    digest = content_hash(splits)
    prefix = versions_prefix(base_prefix) + digest[:12]
    keys = [split_key(prefix, s) for s in SPLITS]
    uploaded = not all(s3io.exists(s3_client, bucket, k) for k in keys)
    if uploaded:
        for split, key in zip(SPLITS, keys, strict=True):
            s3io.upload_bytes(s3_client, to_npz_bytes(*splits[split]), bucket, key)
    return {"prefix": prefix, "sha256": digest, "uploaded": uploaded, "splits": splits,
            "rows": {split: len(splits[split][0]) for split in SPLITS}}


def splits_from_module(module: ModuleType) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``module.make_dataset()``, checked: ``{"train": (x float32, y int64|float32), "test": (...)}``.

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
        checked[split] = (x.astype(np.float32, copy=False), y.astype(label_dtype(y), copy=False))
    if checked["train"][0].shape[1:] != checked["test"][0].shape[1:] or \
            checked["train"][1].shape[1:] != checked["test"][1].shape[1:]:
        raise usermodel.fail(module, "make_dataset", "returned train and test splits whose examples differ in "
                             f"shape (x {checked['train'][0].shape[1:]} vs {checked['test'][0].shape[1:]}, "
                             f"y {checked['train'][1].shape[1:]} vs {checked['test'][1].shape[1:]})")
    return checked
