"""A run that fails still leaves its TensorBoard events in S3: a chief and a worker on loopback
(``multi_worker_mirrored``, the cheapest cluster), whose chief trains and evaluates, then cannot export the
model (its ``model`` folder is a file) and fails in phase ``publishing``."""

from __future__ import annotations

import importlib.util

import pytest
from harness_support import free_port, s3_scalars
from test_e2e import CHIEF_TIMEOUT_S, make_settings, start_node
from tfc_harness import data, publish

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")]

STEPS = 40       # two fixed chunks of 20 synchronous steps


def test_a_failed_run_copies_its_events(moto_endpoint, s3_client, bucket, processes, tmp_path):
    dataset = data.ensure_dataset(s3_client, bucket, "datasets/digits", "digits")["prefix"]
    tf_cluster = {"worker": [f"127.0.0.1:{free_port()}"], "chief": [f"127.0.0.1:{free_port()}"]}
    chief_dir = tmp_path / "nodes" / "chief"
    chief_dir.mkdir(parents=True)
    (chief_dir / "model").write_text("not a folder: the SavedModel export fails\n")
    for role, name in (("chief", "chief"), ("worker", "worker0")):
        settings = make_settings(moto_endpoint, tf_cluster, role, 0, tmp_path / "nodes" / name, steps=STEPS,
                                 run_id="failed", dataset_prefix=dataset)
        settings["s3"]["bucket"] = bucket
        start_node(processes, tmp_path, name, dict(settings, strategy="multi_worker_mirrored", checkpoint_every=20))

    assert processes.wait("worker0", CHIEF_TIMEOUT_S) == 0, processes.log("worker0")
    rc, log = processes.wait("chief", CHIEF_TIMEOUT_S), processes.log("chief")
    assert rc == 1 and "ERROR: chief failed in phase 'publishing'" in log, log
    assert not publish.published(s3_client, bucket, "runs/e2e/failed")

    scalars = s3_scalars(s3_client, bucket, "runs/e2e/failed", tmp_path / "events")
    assert scalars["train/loss"][-1][0] == STEPS and scalars["train/learning_rate"]
    assert [step for step, _ in scalars["test/accuracy"]] == [STEPS], scalars
    assert "could not copy the TensorBoard events" not in log
