"""The worker's local training shard as a TFRecord file, and the tf.data pipeline that reads it.

Why a relative path: the chief builds the input pipeline once and ``create_per_worker_dataset`` runs the
same graph on every worker, so the file name baked into it must be the same everywhere while each worker
reads its own shard.  Every harness process works in its ``state_dir`` (see :mod:`tfc_harness.runner`),
so :data:`SHARD_PATH` resolves to ``<state_dir>/data/train-shard.tfrecord`` on each node, also when
several nodes share one host with different state dirs (as in the tests).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

SHARD_PATH = "data/train-shard.tfrecord"  # relative to the process's working directory (= state_dir)
SHUFFLE_BUFFER = 10_000


def _label_feature(yi: np.ndarray):
    import tensorflow as tf

    flat = np.ravel(yi)
    if np.issubdtype(flat.dtype, np.integer):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=flat.tolist()))
    return tf.train.Feature(float_list=tf.train.FloatList(value=flat.astype(np.float32).tolist()))


def write_tfrecord(path: str | os.PathLike, x: np.ndarray, y: np.ndarray) -> Path:
    """Write ``(x, y)`` rows as ``tf.train.Example`` records (both flattened; y int64 or float); temp file,
    then rename."""
    import tensorflow as tf

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with tf.io.TFRecordWriter(str(tmp)) as writer:
        for xi, yi in zip(x, y, strict=True):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(xi).tolist())),
                "y": _label_feature(np.asarray(yi)),
            }))
            writer.write(example.SerializeToString())
    os.replace(tmp, target)
    return target


def make_dataset_fn(example_shape: tuple[int, ...], batch_size: int, path: str = SHARD_PATH,
                    label_shape: tuple[int, ...] = (), label_dtype: str = "int64"):
    """A ``dataset_fn`` for ``ClusterCoordinator.create_per_worker_dataset``: shuffled, repeated, batched."""
    import tensorflow as tf

    spec = {"x": tf.io.FixedLenFeature([math.prod(example_shape)], tf.float32),
            "y": tf.io.FixedLenFeature([math.prod(label_shape)], tf.as_dtype(label_dtype))}

    def parse(record):
        row = tf.io.parse_single_example(record, spec)
        return tf.reshape(row["x"], example_shape), tf.reshape(row["y"], label_shape)

    def dataset_fn():
        return (tf.data.TFRecordDataset(path)
                .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
                .cache()
                .shuffle(SHUFFLE_BUFFER)
                .repeat()
                .batch(batch_size, drop_remainder=True)
                .prefetch(tf.data.AUTOTUNE))

    return dataset_fn
