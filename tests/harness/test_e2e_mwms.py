"""End to end, ``strategy: multi_worker_mirrored``: a chief and 2 workers as real processes on loopback,
S3 from moto_server.

Every task trains on its own third of the digits (synchronous all-reduce steps).  The first start trains to
FIRST_STEPS, checkpoints and publishes run A, and every task exits by itself; a second start of all three,
with the same checkpoint prefix, resumes at that step on every task, trains to STEPS and publishes run B,
which is read back and evaluated in a fresh process.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from harness_support import TRAIN_DIR, free_port
from test_e2e import BUCKET, CHIEF_TIMEOUT_S, FIRST_STEPS, STEPS, check_events, make_settings, start_node
from tfc_harness import data, publish, verify

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")]

STRATEGY = "multi_worker_mirrored"
TASKS = (("chief", 0, "chief"), ("worker", 0, "worker0"), ("worker", 1, "worker1"))


def start_all(processes, tmp_path: Path, endpoint: str, tf_cluster: dict, *, steps: int, run_id: str,
              dataset: str, chief_interval_s: float = 0) -> None:
    for role, index, name in TASKS:
        settings = make_settings(endpoint, tf_cluster, role, index, tmp_path / "nodes" / name, steps=steps,
                                 run_id=run_id, dataset_prefix=dataset)
        interval = chief_interval_s if role == "chief" else 0
        start_node(processes, tmp_path, f"{name}-{run_id}",
                   dict(settings, strategy=STRATEGY, checkpoint_min_interval_s=interval))


def wait_all(processes, run_id: str) -> dict[str, str]:
    """Every task exits by itself with 0; returns their logs."""
    logs = {}
    for _, _, name in TASKS:
        rc = processes.wait(f"{name}-{run_id}", CHIEF_TIMEOUT_S)
        logs[name] = processes.log(f"{name}-{run_id}")
        assert rc == 0, f"{name}-{run_id} exited with {rc}:\n{logs[name]}"
    return logs


def test_all_reduce_train_resume_publish_verify(moto_endpoint, s3_client, processes, tmp_path):
    s3_client.create_bucket(Bucket=BUCKET)
    dataset = data.ensure_dataset(s3_client, BUCKET, "datasets/digits", "digits")["prefix"]
    tf_cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)], "chief": [f"127.0.0.1:{free_port()}"]}

    start_all(processes, tmp_path, moto_endpoint, tf_cluster, steps=FIRST_STEPS, run_id="a", dataset=dataset)
    logs = wait_all(processes, "a")
    for log in logs.values():
        assert f"checkpoint saved at step {FIRST_STEPS}" in log and "resumed from checkpoint" not in log, log
        assert "training 100 steps on 3 training tasks" in log, log
    rows = [int(line.split("wrote ")[1].split()[0]) for log in logs.values() for line in log.splitlines()
            if " of the training rows to " in line]
    assert len(rows) == 3 and max(rows) - min(rows) <= 1      # each task its own third of the rows
    assert publish.published(s3_client, BUCKET, "runs/e2e/a")
    scratch = tmp_path / "nodes" / "worker0" / "checkpoints"
    assert not any(scratch.rglob("ckpt-*")), "a worker's scratch checkpoint was kept"
    assert not publish.published(s3_client, BUCKET, "runs/e2e/b")

    # Whether a checkpoint is due is agreed: any task's clock makes it due on every task. Here the chief's own
    # would skip step 200's (tfcluster gives every task the same interval; here the workers' find every
    # boundary due): were the tasks' own used, the chief would not join the workers' collective save and the
    # run would hang; had all to find it due, none would save it.
    start_all(processes, tmp_path, moto_endpoint, tf_cluster, steps=STEPS, run_id="b", dataset=dataset,
              chief_interval_s=3600)
    logs = wait_all(processes, "b")
    for log in logs.values():
        assert f"resumed from checkpoint at step {FIRST_STEPS}" in log, log
        assert f"step {STEPS}/{STEPS} loss" in log, log
        assert re.findall(r"^checkpoint saved at step (\d+)$", log, re.M) == ["200", str(STEPS)], log
    assert "chief: done" in logs["chief"] and "publishing" not in logs["worker0"]
    status = json.loads((tmp_path / "nodes" / "chief" / "status.json").read_text())
    assert status["phase"] == "done" and status["step"] == STEPS
    assert status["metric"] == "test_accuracy" and status["value"] >= 0.9, status
    worker_status = json.loads((tmp_path / "nodes" / "worker1" / "status.json").read_text())
    assert worker_status["role"] == "worker" and worker_status["phase"] == "done"
    # only the chief writes TensorBoard events; they are in S3 with the run
    assert (tmp_path / "nodes" / "chief" / "tensorboard" / "b").is_dir()
    assert not [p for _, _, name in TASKS[1:] for p in (tmp_path / "nodes" / name).glob("tensorboard")]
    events = check_events(s3_client, "runs/e2e/b", tmp_path / "events-b", first_step=FIRST_STEPS + 1,
                          last_step=STEPS)

    module = str(TRAIN_DIR / "models" / "digits.py")
    result = verify.verify_run(s3_client, BUCKET, "runs/e2e/b", tmp_path / "verify-b", module, dataset)
    print(f"verified run b: recomputed {result['metrics']}, published {result['published']}")
    metrics = result["published"]
    assert result["metrics"]["test_accuracy"] >= 0.9
    assert metrics["restored_from_step"] == FIRST_STEPS and metrics["steps"] == STEPS and metrics["workers"] == 3
    assert abs(metrics["test_accuracy"] - result["metrics"]["test_accuracy"]) <= verify.TOLERANCE
    assert abs(metrics["test_loss"] - result["metrics"]["test_loss"]) <= verify.TOLERANCE
    assert events["test/accuracy"][0][1] == pytest.approx(metrics["test_accuracy"], abs=1e-6)
