"""End to end: 1 ps + 2 workers + chief as real processes on loopback, S3 from moto_server.

One test keeps the suite fast: the first chief trains to step FIRST_STEPS and publishes run A; a second
chief with the same checkpoint prefix resumes at that step, trains to STEPS and publishes run B, which is
read back and evaluated in a fresh process. Both runs' TensorBoard events are read back from S3.
Nodes run as on a cluster: neither scikit-learn nor TensorBoard importable, each task a fork of the warm
interpreter (tfc-warm).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness_support import TRAIN_DIR, WARM, free_port, node_env, render_entry, s3_scalars
from tfc_harness import data, publish, sandbox, verify

from tfcluster.poll import wait_until

# Defaults recommended for the digits model: ~300 steps reach >= 0.95 test accuracy in a few seconds of
# training on 2 cores (100 steps already give ~0.95; the margin covers unlucky shuffles).
STEPS = 300
FIRST_STEPS = 100
BATCH_SIZE = 64
LEARNING_RATE = 0.005
CHECKPOINT_EVERY = 100
BUCKET = "tfc-e2e"
CHIEF_TIMEOUT_S = 240

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")]


def make_settings(endpoint: str, tf_cluster: dict, role: str, index: int, state_dir: Path, *,
                  steps: int, run_id: str, dataset_prefix: str) -> dict:
    return {
        "cluster": "e2e",
        "run_id": run_id,
        "role": role,
        "index": index,
        "tf_config": {"cluster": tf_cluster, "task": {"type": role, "index": index}},
        "model_module": "digits",
        "steps": steps,
        "batch_size": BATCH_SIZE,
        "learning_rate": LEARNING_RATE,
        "checkpoint_every": CHECKPOINT_EVERY,
        "s3": {"endpoint": endpoint, "region": "us-east-1", "bucket": BUCKET,
               "run_prefix": f"runs/e2e/{run_id}", "checkpoint_prefix": "runs/e2e/checkpoints",
               "dataset_prefix": dataset_prefix},
        "state_dir": str(state_dir),
        "max_runtime_s": CHIEF_TIMEOUT_S,
    }


def start_node(processes, tmp_path: Path, name: str, settings: dict, warm: bool = True):
    """Render the entry script and run it like a node would: no scikit-learn or TensorBoard importable, a fork
    of the warm interpreter (``warm``; else the plain way, as where a node's cannot fork it)."""
    script = tmp_path / "entry" / f"{name}.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(render_entry(TRAIN_DIR, settings))
    env = node_env({"PYTHONPATH": str(WARM.blockers())})
    return processes.start(name, [sys.executable, str(script)], env=env, cwd=str(tmp_path), warm=warm)


def wait_serving(processes, state_dirs: dict[str, Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = dict(state_dirs)
    while pending and time.monotonic() < deadline:
        for name, state_dir in list(pending.items()):
            proc = processes.procs[name][0]
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{processes.log(name)}"
            status = state_dir / "status.json"
            if status.exists() and json.loads(status.read_text())["phase"] == "serving":
                del pending[name]
        time.sleep(0.2)
    assert not pending, f"not serving after {timeout_s}s: {sorted(pending)}"


def check_events(client, run_prefix: str, dest: Path, *, first_step: int, last_step: int) -> dict:
    """The run's TensorBoard events in S3: training scalars from ``first_step`` (a resumed run starts after
    its checkpoint) to ``last_step``, each metric of the evaluation at ``last_step``."""
    scalars = s3_scalars(client, BUCKET, run_prefix, dest)
    assert set(scalars) == {"train/loss", "train/learning_rate", "train/examples_per_sec", "test/loss",
                            "test/accuracy"}, scalars
    steps = [step for step, _ in scalars["train/loss"]]
    assert first_step <= steps[0] and steps[-1] == last_step and steps == sorted(steps), steps
    assert all(value == pytest.approx(LEARNING_RATE) for _, value in scalars["train/learning_rate"])
    assert all(value > 0 for _, value in scalars["train/examples_per_sec"] + scalars["train/loss"])
    assert [step for step, _ in scalars["test/accuracy"]] == [last_step] == [s for s, _ in scalars["test/loss"]]
    return scalars


def test_train_resume_publish_verify(moto_endpoint, s3_client, processes, tmp_path):
    s3_client.create_bucket(Bucket=BUCKET)
    stored = data.ensure_dataset(s3_client, BUCKET, "datasets/digits", "digits")
    assert stored["uploaded"] and stored["prefix"] == f"datasets/digits-{stored['sha256'][:12]}"
    dataset = stored["prefix"]

    names = {"ps": ["ps0"], "worker": ["worker0", "worker1"], "chief": ["chief"]}
    tf_cluster = {role: [f"127.0.0.1:{free_port()}" for _ in nodes] for role, nodes in names.items()}
    state = {name: tmp_path / "nodes" / name for nodes in names.values() for name in nodes}

    for role in ("ps", "worker"):
        for index, name in enumerate(names[role]):
            start_node(processes, tmp_path, name, make_settings(
                moto_endpoint, tf_cluster, role, index, state[name], steps=STEPS, run_id="a", dataset_prefix=dataset))
    wait_serving(processes, {n: state[n] for n in ("ps0", "worker0", "worker1")}, timeout_s=90)
    for name in ("worker0", "worker1"):
        assert (state[name] / "data" / "train-shard.tfrecord").is_file()

    # First chief: trains to FIRST_STEPS, checkpoints and publishes run "a".
    start_node(processes, tmp_path, "chief-a", make_settings(
        moto_endpoint, tf_cluster, "chief", 0, state["chief"], steps=FIRST_STEPS, run_id="a", dataset_prefix=dataset))
    rc = processes.wait("chief-a", CHIEF_TIMEOUT_S)
    log_a = processes.log("chief-a")
    assert rc == 0, log_a
    assert f"checkpoint saved at step {FIRST_STEPS}" in log_a
    assert "resumed from checkpoint" not in log_a
    assert publish.published(s3_client, BUCKET, "runs/e2e/a")
    check_events(s3_client, "runs/e2e/a", tmp_path / "events-a", first_step=1, last_step=FIRST_STEPS)

    # Second chief, same checkpoint prefix: resumes at FIRST_STEPS and finishes run "b".
    start_node(processes, tmp_path, "chief-b", make_settings(
        moto_endpoint, tf_cluster, "chief", 0, state["chief"], steps=STEPS, run_id="b", dataset_prefix=dataset))
    rc = processes.wait("chief-b", CHIEF_TIMEOUT_S)
    log_b = processes.log("chief-b")
    assert rc == 0, log_b
    assert f"resumed from checkpoint at step {FIRST_STEPS}" in log_b
    assert f"step {STEPS}/{STEPS} loss" in log_b
    status = json.loads((state["chief"] / "status.json").read_text())
    assert status["phase"] == "done" and status["step"] == STEPS
    assert status["metric"] == "test_accuracy" and status["value"] >= 0.9

    module = str(TRAIN_DIR / "models" / "digits.py")
    result = verify.verify_run(s3_client, BUCKET, "runs/e2e/b", tmp_path / "verify-b", module, dataset)
    print(f"verified run b: recomputed {result['metrics']}, published {result['published']}")
    assert result["metrics"]["test_accuracy"] >= 0.90 and result["metrics"]["headline"] == "test_accuracy"
    manifest = json.loads((tmp_path / "verify-b" / "manifest.json").read_text())
    assert set(result["files"]) == set(manifest["files"])
    assert "model/saved_model.pb" in manifest["files"]
    assert not [key for key in manifest["files"] if not key.startswith("model/")]   # no event file listed
    events = check_events(s3_client, "runs/e2e/b", tmp_path / "events-b", first_step=FIRST_STEPS + 1,
                          last_step=STEPS)
    assert events["test/accuracy"][0][1] == pytest.approx(result["published"]["test_accuracy"], abs=1e-6)
    for key in manifest["files"]:
        assert (tmp_path / "verify-b" / key).is_file()
    check_warm_evaluator(s3_client, module, dataset, tmp_path, result["metrics"])
    metrics = result["published"]
    assert metrics["restored_from_step"] == FIRST_STEPS and metrics["steps"] == STEPS
    assert metrics["workers"] == 2 and metrics["headline"] == "test_accuracy"
    assert metrics["data"] == {"source": "arrays", "bucket": BUCKET, "prefix": dataset}
    assert abs(metrics["test_accuracy"] - result["metrics"]["test_accuracy"]) <= verify.TOLERANCE
    assert abs(metrics["test_loss"] - result["metrics"]["test_loss"]) <= verify.TOLERANCE

    # The CLI form, as the controller would run it.
    cli = subprocess.run([sys.executable, "-m", "tfc_harness.verify", "--bucket", BUCKET, "--run-prefix",
                          "runs/e2e/b", "--dest", str(tmp_path / "verify-cli"), "--endpoint", moto_endpoint,
                          "--module", module, "--dataset-prefix", dataset],
                         capture_output=True, text=True, env=node_env({"PYTHONPATH": str(TRAIN_DIR)}),
                         timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert re.search(r"^test accuracy: 0\.9\d{3}$", cli.stdout, re.M), cli.stdout

    # ps and workers are still serving (they never exit by themselves); the fixture kills them.
    for name in ("ps0", "worker0", "worker1"):
        assert processes.procs[name][0].poll() is None


def check_warm_evaluator(s3_client, module: str, dataset: str, tmp_path, fresh: dict) -> None:
    """The same verification through an evaluator started before the model was downloaded (as `train` starts
    it while the tasks train): the same figures, from that process; an unused one ends with close()."""
    if sandbox.available() is not None:
        pytest.skip(f"no sandbox here: {sandbox.available()}")
    warm = verify.WarmEvaluator(tmp_path / "verify-warm")
    try:
        assert warm.proc.poll() is None
        def nice() -> int:
            return int(Path(f"/proc/{warm.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])

        # `nice` sets it, then becomes the sandbox; it waits on the CPU training leaves idle
        assert wait_until(lambda: nice() == verify.WAIT_NICE, 10, 0.05), nice()
        result = verify.verify_run(s3_client, BUCKET, "runs/e2e/b", tmp_path / "verify-warm", module, dataset,
                                   warm=warm)
        assert warm.used and warm.proc.returncode == 0, warm.proc.args     # it evaluated (not a new process)
    finally:
        warm.close()
    assert result["metrics"] == fresh
    assert not warm.staging.exists()
    unused = verify.WarmEvaluator(tmp_path / "verify-unused")
    unused.close()
    assert unused.proc.returncode is not None and not unused.staging.exists()
    assert not (tmp_path / "verify-unused").exists()       # the copy's directory it made, left empty
