"""Exporting the trained model and publishing a run under ``s3://<bucket>/<run_prefix>/``.

Layout (written in this order; readers trust a run only once ``_SUCCESS`` exists)::

    model/...        every file of the SavedModel
    manifest.json    sha256 and size of each model file (:mod:`tfc_harness.manifest`), plus the
                     dataset_prefix whose test split evaluates it
    metrics.json     test_accuracy, test_loss, steps, examples_per_sec, train_seconds, workers,
                     restored_from_step (required), peer_failures, peer_rejoins
    _SUCCESS         empty marker, last
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import manifest, s3io

SUCCESS = "_SUCCESS"
MANIFEST = "manifest.json"
METRICS = "metrics.json"
METRICS_KEYS = ("test_accuracy", "test_loss", "steps", "examples_per_sec", "train_seconds", "workers",
                "restored_from_step")


def export_saved_model(model, example_shape: tuple[int, ...], from_logits: bool, path: str | os.PathLike):
    """Write ``model`` as a SavedModel whose ``serving_default`` maps ``x`` to ``probabilities``."""
    import keras
    import tensorflow as tf

    def serve(x):
        out = model(x, training=False)
        return {"probabilities": tf.nn.softmax(out) if from_logits else out}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve,
                         input_signature=[tf.TensorSpec([None, *example_shape], tf.float32, name="x")])
    archive.write_out(str(path), verbose=False)
    return Path(path)


def published(s3_client, bucket: str, run_prefix: str) -> bool:
    return s3io.exists(s3_client, bucket, s3io.join_key(run_prefix, SUCCESS))


def publish_run(s3_client, bucket: str, run_prefix: str, model_dir: str | os.PathLike, metrics: dict,
                run_id: str, cluster: str, dataset_prefix: str | None = None, log=print) -> dict:
    """Upload model files, manifest.json, metrics.json and then ``_SUCCESS``; returns the manifest.

    ``dataset_prefix`` is recorded in the manifest so that a verifier can find the test split.
    """
    missing = [k for k in METRICS_KEYS if k not in metrics]
    if missing:
        raise ValueError(f"metrics lack {missing}")
    files = manifest.model_files(model_dir)
    doc = manifest.build_manifest(files, run_id=run_id, cluster=cluster)
    if dataset_prefix:
        doc["dataset_prefix"] = dataset_prefix
    for key, path in files.items():
        s3io.upload_file(s3_client, path, bucket, s3io.join_key(run_prefix, key))
    s3io.upload_bytes(s3_client, json.dumps(doc, indent=2, sort_keys=True).encode(), bucket,
                      s3io.join_key(run_prefix, MANIFEST))
    s3io.upload_bytes(s3_client, json.dumps(metrics, indent=2, sort_keys=True).encode(), bucket,
                      s3io.join_key(run_prefix, METRICS))
    s3io.upload_bytes(s3_client, b"", bucket, s3io.join_key(run_prefix, SUCCESS))
    log(f"published {len(files)} model files to s3://{bucket}/{run_prefix}/ ({SUCCESS} written)")
    return doc
