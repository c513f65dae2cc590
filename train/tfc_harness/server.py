"""Tasks that only serve: TensorFlow's gRPC server until stopped, and a worker's data shard before it.

A ``parameter_server`` worker first fetches ``<dataset_prefix>/train.npz``, keeps rows
``index::num_workers`` and writes them to ``<state_dir>/data/train-shard.tfrecord`` before its server
starts, so a worker that accepts connections always has its data.  A serving task never exits by itself
(``join()``): the playbook stops it.
"""

from __future__ import annotations

from pathlib import Path

from . import data, records, s3io
from .settings import Settings
from .status import write_status


def prepare_worker_shard(settings: Settings, s3_client=None) -> Path:
    """Download the training split and write this worker's shard; returns the TFRecord path."""
    s3 = settings.s3
    s3_client = s3_client or s3io.client_from_settings(settings)
    x, y = data.load_split(s3_client, s3.bucket, s3.dataset_prefix, "train")
    x, y = data.shard_rows(x, y, settings.index, settings.num_workers)
    path = records.write_tfrecord(Path(settings.state_dir) / records.SHARD_PATH, x, y)
    print(f"worker {settings.index}: wrote {len(x)} of the training rows to {path}", flush=True)
    return path


def serve(settings: Settings) -> int:
    """Start the server from TF_CONFIG (already set by the runner), report ``serving`` and block forever."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc",
                                  start=True)
    address = settings.cluster_spec[settings.role][settings.index]
    write_status(settings.state_dir, role=settings.role, phase="serving", address=address)
    print(f"{settings.role} {settings.index}: serving on {address}", flush=True)
    server.join()
    return 0
