"""Exporting the trained model and publishing a run under ``s3://<bucket>/<run_prefix>/``.

Layout (written in this order; readers trust a run only once ``_SUCCESS`` exists)::

    model/...        every file of the SavedModel
    manifest.json    sha256 and size of each model file (:mod:`tfc_harness.manifest`)
    metrics.json     test_loss and test_<metric> for each of the module's metrics, headline (the key of
                     the first metric, else test_loss), test_examples, steps, examples_per_sec,
                     examples_per_sec_after_first_call (the loop less its first call, which traces the
                     step function; null when that call was the whole loop), train_seconds, workers,
                     restored_from_step (required), peer_failures, peer_rejoins,
                     data (what the run trained and was evaluated on: the arrays' prefix, named by their
                     sha256, or every file with its ETag, the format, label column and CSV header)
    _SUCCESS         empty marker, last

The SavedModel's ``serving_default`` takes ``x`` and returns ``outputs`` (the model's outputs unchanged)
and, for a classifier trained on logits, ``probabilities`` (their softmax or sigmoid).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import manifest, s3io

SUCCESS = "_SUCCESS"
MANIFEST = "manifest.json"
METRICS = "metrics.json"
METRICS_KEYS = ("test_loss", "headline", "steps", "examples_per_sec", "train_seconds", "workers",
                "restored_from_step")


def export_saved_model(model, example_shape: tuple[int, ...], probability_fn: str | None,
                       path: str | os.PathLike):
    """Write ``model`` as a SavedModel whose ``serving_default`` maps ``x`` to ``outputs`` (and
    ``probabilities``: ``probability_fn`` "softmax" or "sigmoid" of them, when it is given)."""
    import keras
    import tensorflow as tf

    activation = {"softmax": tf.nn.softmax, "sigmoid": tf.sigmoid, None: None}[probability_fn]

    def serve(x):
        out = model(x, training=False)
        return {"outputs": out, "probabilities": activation(out)} if activation else {"outputs": out}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve,
                         input_signature=[tf.TensorSpec([None, *example_shape], tf.float32, name="x")])
    archive.write_out(str(path), verbose=False)
    return Path(path)


def published(s3_client, bucket: str, run_prefix: str) -> bool:
    return s3io.exists(s3_client, bucket, s3io.join_key(run_prefix, SUCCESS))


def publish_run(s3_client, bucket: str, run_prefix: str, model_dir: str | os.PathLike, metrics: dict,
                run_id: str, cluster: str, log=print) -> dict:
    """Upload model files, manifest.json, metrics.json and then ``_SUCCESS``; returns the manifest."""
    missing = [k for k in (*METRICS_KEYS, metrics.get("headline")) if k not in metrics]
    if missing:
        raise ValueError(f"metrics lack {missing}")
    files = manifest.model_files(model_dir)
    doc = manifest.build_manifest(files, run_id=run_id, cluster=cluster)
    for key, path in files.items():
        s3io.upload_file(s3_client, path, bucket, s3io.join_key(run_prefix, key))
    s3io.upload_bytes(s3_client, json.dumps(doc, indent=2, sort_keys=True).encode(), bucket,
                      s3io.join_key(run_prefix, MANIFEST))
    s3io.upload_bytes(s3_client, json.dumps(metrics, indent=2, sort_keys=True).encode(), bucket,
                      s3io.join_key(run_prefix, METRICS))
    s3io.upload_bytes(s3_client, b"", bucket, s3io.join_key(run_prefix, SUCCESS))
    log(f"published {len(files)} model files to s3://{bucket}/{run_prefix}/ ({SUCCESS} written)")
    return doc
