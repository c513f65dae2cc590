"""A run whose weights become NaN while every loss it reports is finite saves nothing and publishes nothing:
a ps, a worker and a chief on loopback (``parameter_server``: the weights the check reads live on the ps).

The module's loss is ``sqrt(|y - y_hat|)`` on a zero model and zero labels: the first step's loss is 0 and
its gradient NaN, so the update leaves NaN weights that no loss of that step shows. With a checkpoint due
after every step, the chief must refuse the first save and fail naming the weights."""

from __future__ import annotations

import importlib.util
import json
import textwrap

import pytest
from harness_support import free_port
from test_e2e import CHIEF_TIMEOUT_S, make_settings, start_node
from tfc_harness import data, publish

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")]

MODULE = '''
import keras
import numpy as np
import tensorflow as tf


def loss(y_true, y_pred):
    return tf.sqrt(tf.abs(tf.reshape(y_true, [-1, 1]) - y_pred))


def build_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])


def make_dataset():
    x = np.random.default_rng(0).normal(size=(320, 4)).astype("float32")
    y = np.zeros(320, "float32")
    return {"train": (x[:256], y[:256]), "test": (x[256:], y[256:])}
'''


def test_nan_weights_behind_a_finite_loss_are_not_checkpointed_or_published(moto_endpoint, s3_client, bucket,
                                                                           processes, tmp_path):
    module = tmp_path / "zero_sqrt.py"
    module.write_text(textwrap.dedent(MODULE))
    dataset = data.ensure_dataset(s3_client, bucket, "datasets/zero_sqrt", str(module))["prefix"]
    tf_cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"],
                  "chief": [f"127.0.0.1:{free_port()}"]}
    for role, name in (("ps", "ps0"), ("worker", "worker0"), ("chief", "chief")):
        settings = make_settings(moto_endpoint, tf_cluster, role, 0, tmp_path / "nodes" / name, steps=20,
                                 run_id="diverged", dataset_prefix=dataset)
        settings["s3"]["bucket"] = bucket
        # started the plain way, as where a node's warm interpreter cannot fork a task: the harness's own
        # imports (tfc_harness.runner: TensorFlow without scikit-learn), which the other e2e tests' forks skip
        start_node(processes, tmp_path, name, dict(settings, model_module=str(module), checkpoint_every=1),
                   warm=False)

    rc, log = processes.wait("chief", CHIEF_TIMEOUT_S), processes.log("chief")
    assert rc == 1, log
    assert ("ERROR: chief failed in phase 'training': Diverged: the model's weights or the optimizer's state became "
            "NaN or infinite in steps 1-1: training diverged, so nothing from these steps was saved (no checkpoint "
            "was saved yet)") in log, log
    assert "checkpoint saved" not in log
    status = json.loads((tmp_path / "nodes" / "chief" / "status.json").read_text())
    assert status["phase"] == "failed" and status["error"].startswith("Diverged: the model's weights")
    assert s3_client.list_objects_v2(Bucket=bucket, Prefix=settings["s3"]["checkpoint_prefix"])["KeyCount"] == 0
    assert not publish.published(s3_client, bucket, "runs/e2e/diverged")
