"""The data of ``examples/``: scikit-learn's diabetes (CSV) and breast cancer (TFRecord) sets as shards.

``tfcluster example-data`` (``make example-data``) writes both into the configured store's bucket:

    examples/diabetes/train/part-0000{0..5}.csv   examples/diabetes/test/part-0000{0,1}.csv
    examples/cancer/train-0000{0..5}-of-00006.tfrecord   examples/cancer/test-0000{0,1}-of-00002.tfrecord

Deterministic: a fixed split (seed 42, 80/20; stratified for the classifier) and fixed shard sizes, in
proportions 6:5:4:3:2:1 (train) and 2:1 (test), uneven so that assigning files to workers by size
matters. The features are standardised with the training split's mean and standard deviation when
written (so a model needs no Normalization layer to adapt); the diabetes target is kept in its own units.
Idempotent: an object whose bytes are already there is left alone (and reported unchanged), and keys
under a dataset's prefix that are not among its shards (left by another layout) are deleted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from botocore.exceptions import ClientError
from tfc_harness import s3io

SEED = 42
TEST_FRACTION = 0.2
TRAIN_SHARES = (6, 5, 4, 3, 2, 1)
TEST_SHARES = (2, 1)
PREFIX = "examples"
DIABETES_LABEL = "target"


@dataclass(frozen=True)
class Shard:
    split: str
    key: str
    body: bytes
    rows: int


def shard_bounds(n: int, shares: tuple[int, ...]) -> list[tuple[int, int]]:
    """Consecutive [start, stop) row ranges in the proportions of ``shares`` (each at least one row)."""
    cuts = np.round(np.cumsum((0, *shares)) / sum(shares) * n).astype(int)
    if np.any(np.diff(cuts) < 1):
        raise ValueError(f"{n} rows cannot make {len(shares)} non-empty shards")
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both splits scaled with the training split's per-column mean and standard deviation."""
    mean, std = train.mean(axis=0), train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return (train - mean) / std, (test - mean) / std


def split(x: np.ndarray, y: np.ndarray, stratify: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The fixed train/test split, features standardised, as float32."""
    from sklearn.model_selection import train_test_split

    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, random_state=SEED, stratify=y if stratify else None)
    x_train, x_test = standardise(x_train, x_test)
    return {"train": (x_train.astype(np.float32), y_train), "test": (x_test.astype(np.float32), y_test)}


def shards(splits: dict, key_of: Callable[[str, int, int], str], encode: Callable) -> list[Shard]:
    """Every split cut into its shards; ``key_of(split, index, count)`` names them, ``encode(x, y)`` writes."""
    out = []
    for name, (x, y) in splits.items():
        bounds = shard_bounds(len(x), TRAIN_SHARES if name == "train" else TEST_SHARES)
        for i, (a, b) in enumerate(bounds):
            out.append(Shard(name, key_of(name, i, len(bounds)), encode(x[a:b], y[a:b]), b - a))
    return out


# -- diabetes: regression, CSV -------------------------------------------------------------------------
def csv_bytes(columns: list[str], x: np.ndarray, y: np.ndarray) -> bytes:
    """A header line, then one line per row: the features, then the label (each the shortest text that reads
    back as the same float32)."""
    lines = [",".join(columns)]
    for features, label in zip(x, y, strict=True):
        lines.append(",".join(str(v) for v in (*features.astype(np.float32), np.float32(label))))
    return ("\n".join(lines) + "\n").encode()


def diabetes_shards(prefix: str = PREFIX) -> list[Shard]:
    """442 patients, 10 features (age, sex, bmi, bp, s1..s6), target: disease progression after a year."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    columns = [*data.feature_names, DIABETES_LABEL]
    return shards(split(data.data, data.target, stratify=False),
                  lambda name, i, n: f"{prefix}/diabetes/{name}/part-{i:05d}.csv",
                  lambda x, y: csv_bytes(columns, x, y))


# -- breast cancer: binary classification, TFRecord ---------------------------------------------------
def tfrecord_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    """TFRecord file content: one tf.train.Example per row, float feature "x" [30] and int64 label "y"."""
    import tempfile

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/shard.tfrecord"
        with tf.io.TFRecordWriter(path) as writer:
            for features, label in zip(x, y, strict=True):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=features.tolist())),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                }))
                writer.write(example.SerializeToString(deterministic=True))
        with open(path, "rb") as f:
            return f.read()


def cancer_shards(prefix: str = PREFIX) -> list[Shard]:
    """569 tumours, 30 features; y: scikit-learn's coding, 1 benign, 0 malignant."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    return shards(split(data.data, data.target, stratify=True),
                  lambda name, i, n: f"{prefix}/cancer/{name}-{i:05d}-of-{n:05d}.tfrecord",
                  tfrecord_bytes)


DATASETS = {"diabetes": diabetes_shards, "cancer": cancer_shards}


# -- writing ------------------------------------------------------------------------------------------
def stored_md5(s3, bucket: str, key: str) -> str | None:
    """The object's ETag (the MD5 of a single-part upload's bytes), or None when there is no object (or S3
    answers 403 for a missing key, as it does to callers without s3:ListBucket: then the put decides)."""
    try:
        head = s3io.with_retries(lambda: s3.head_object(Bucket=bucket, Key=key), f"look up s3://{bucket}/{key}")
    except s3io.TransferError as exc:
        cause = exc.__cause__
        code = cause.response.get("Error", {}).get("Code") if isinstance(cause, ClientError) else None
        if code in ("404", "NoSuchKey", "403"):
            return None
        raise
    return head.get("ETag", "").strip('"')


def write_shards(s3, bucket: str, folder: str, items: list[Shard]) -> dict[str, int]:
    """Put each shard unless its bytes are there already; delete other keys under ``folder``.
    Returns counts of written, unchanged and deleted objects."""
    counts = {"written": 0, "unchanged": 0, "deleted": 0}
    for shard in items:
        if stored_md5(s3, bucket, shard.key) == hashlib.md5(shard.body, usedforsecurity=False).hexdigest():
            counts["unchanged"] += 1
            continue
        s3io.upload_bytes(s3, shard.body, bucket, shard.key)
        counts["written"] += 1
    stale = sorted(set(s3io.list_keys(s3, bucket, folder)) - {s.key for s in items})
    if stale:
        s3io.delete_keys(s3, bucket, stale)
    counts["deleted"] = len(stale)
    return counts


def write_all(s3, bucket: str, prefix: str = PREFIX, log=print) -> dict[str, dict[str, int]]:
    """Write every example dataset to ``s3://bucket/prefix/<name>/``; log one line per dataset."""
    summary = {}
    for name, make in DATASETS.items():
        items = make(prefix)
        counts = summary[name] = write_shards(s3, bucket, f"{prefix}/{name}", items)
        rows = {part: sum(s.rows for s in items if s.split == part) for part in ("train", "test")}
        log(f"{name}: s3://{bucket}/{prefix}/{name}/: {len(items)} shards ({rows['train']} train rows, "
            f"{rows['test']} test rows): {describe(counts)}")
    return summary


def describe(counts: dict[str, int]) -> str:
    if not counts["written"] and not counts["deleted"]:
        return "unchanged (identical content already there)"
    parts = [f"{counts['written']} written", f"{counts['unchanged']} unchanged"]
    if counts["deleted"]:
        parts.append(f"{counts['deleted']} stale deleted")
    return ", ".join(parts)


def write_for(spec) -> dict[str, dict[str, int]]:
    """``tfcluster example-data``: the configured store (started if local) and bucket."""
    from . import cluster, store

    cluster.prepare_storage(spec)
    return write_all(store.client(spec), spec.storage.bucket, log=cluster.say)
