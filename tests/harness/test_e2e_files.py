"""End to end with data in object storage: 1 ps + 2 workers + chief as real processes, TFRecord shards
in moto, the example binary classifier (examples/cancer.py: decode, BinaryCrossentropy on logits, AUC).

The controller's step (``python -m tfc_harness.prepare run``) lists the shards and assigns them to the
workers by size; each worker streams its files through its bounded buffer; the chief evaluates AUC and
accuracy on the test files; the verifier recomputes them from the SavedModel read back from S3.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness_support import REPO, S3_CREDENTIALS, free_port, node_env
from test_e2e import start_node, wait_serving
from tfc_harness import publish, verify

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")]

BUCKET = "tfc-files"
MODULE = str(REPO / "examples" / "cancer.py")
STEPS = 300
CHIEF_TIMEOUT_S = 240


def prepare(endpoint: str, workers: int, tmp: Path) -> dict:
    """The controller's step, as tfcluster runs it: a subprocess printing one JSON line, with a temporary
    directory of its own (``tmp``)."""
    job = {"module": MODULE, "hparams": {}, "workers": workers, "bucket": BUCKET, "endpoint": endpoint,
           "region": "us-east-1", "dataset_base": "datasets/cancer",
           "data": {"train": f"s3://{BUCKET}/examples/cancer/train-*.tfrecord",
                    "test": f"s3://{BUCKET}/examples/cancer/test-*.tfrecord", "format": "tfrecord", "label": "y"}}
    proc = subprocess.run([sys.executable, "-m", "tfc_harness.prepare", "run", json.dumps(job)], capture_output=True,
                          text=True, env=node_env(dict(S3_CREDENTIALS, TMPDIR=str(tmp))), timeout=180)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def settings_for(endpoint, tf_cluster, role, index, state_dir, data) -> dict:
    return {
        "cluster": "files", "run_id": "f1", "role": role, "index": index,
        "tf_config": {"cluster": tf_cluster, "task": {"type": role, "index": index}},
        "model_module": MODULE, "steps": STEPS, "batch_size": 32, "learning_rate": 0.002,
        "checkpoint_every": 100, "data": data,
        "s3": {"endpoint": endpoint, "region": "us-east-1", "bucket": BUCKET, "run_prefix": "runs/files/f1",
               "checkpoint_prefix": "runs/files/f1/checkpoints", "dataset_prefix": "datasets/unused"},
        "state_dir": str(state_dir), "max_runtime_s": CHIEF_TIMEOUT_S,
    }


def test_tfrecord_shards_stream_train_publish_verify(moto_endpoint, s3_client, processes, tmp_path):
    from tfcluster import examples

    s3_client.create_bucket(Bucket=BUCKET)
    shards = examples.cancer_shards()
    examples.write_shards(s3_client, BUCKET, "examples/cancer", shards)
    prepared = prepare(moto_endpoint, workers=2, tmp=tmp_path)
    data = prepared["data"]
    assigned = [[f["key"] for f in worker] for worker in data["train"]]
    train_keys = sorted(s.key for s in shards if s.split == "train")
    assert sorted(k for keys in assigned for k in keys) == train_keys and all(assigned)   # disjoint, complete
    assert [f["key"] for f in data["test"]] == sorted(s.key for s in shards if s.split == "test")
    assert prepared["describe"]["train"] and all(f["etag"] for f in prepared["describe"]["train"])

    names = {"ps": ["ps0"], "worker": ["worker0", "worker1"], "chief": ["chief"]}
    tf_cluster = {role: [f"127.0.0.1:{free_port()}" for _ in nodes] for role, nodes in names.items()}
    state = {name: tmp_path / "nodes" / name for nodes in names.values() for name in nodes}
    for role in ("ps", "worker"):
        for index, name in enumerate(names[role]):
            start_node(processes, tmp_path, name, settings_for(moto_endpoint, tf_cluster, role, index, state[name],
                                                               data))
    wait_serving(processes, {n: state[n] for n in ("ps0", "worker0", "worker1")}, timeout_s=90)
    start_node(processes, tmp_path, "chief", settings_for(moto_endpoint, tf_cluster, "chief", 0, state["chief"], data))
    rc = processes.wait("chief", CHIEF_TIMEOUT_S)
    log = processes.log("chief")
    assert rc == 0, log
    assert publish.published(s3_client, BUCKET, "runs/files/f1")

    for index, name in enumerate(names["worker"]):
        mine = sum(f["size"] for f in data["train"][index])
        status = json.loads((state[name] / "status.json").read_text())
        assert status["data"]["error"] is None and status["data"]["bytes"] >= mine, status   # a whole epoch at least
        left = list((state[name] / "data" / "stream").glob("*.data"))
        assert len(left) <= 4, left                                                          # the bounded buffer

    result = verify.verify_run(s3_client, BUCKET, "runs/files/f1", tmp_path / "verify", MODULE, "", data)
    metrics, published = result["metrics"], result["published"]
    print(f"verified: recomputed {metrics}, published {published}")
    assert metrics["headline"] == published["headline"] == "test_auc"
    assert metrics["test_auc"] >= 0.97 and metrics["n"] == 114
    assert published["data"] == prepared["describe"]        # metrics.json names the data the run record does
    assert [f["key"] for f in published["data"]["train"]] == train_keys
    assert (Path(result["model_dir"]) / "saved_model.pb").is_file()
