"""A preemption notice (SIGUSR1 from the node's supervisor, as on a spot VM) makes the run save the step it
reached at once, not at the next checkpoint interval, and end with exit code 5; the next start resumes there.

Real processes on loopback, S3 from moto_server: under ``parameter_server`` the notice reaches a worker (which
cannot save: it tells the chief through S3); under ``multi_worker_mirrored`` it reaches one worker and every
task saves the same step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
from pathlib import Path

import pytest
from harness_support import free_port
from test_e2e import BUCKET, CHIEF_TIMEOUT_S, make_settings, start_node, wait_serving
from tfc_harness import checkpoints, data
from tfc_harness.preemption import PREEMPTED_EXIT_CODE

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")]

LONG = 5000          # steps: far more than the test lets it run
# checkpoint interval: the notice comes long before the first boundary. Under parameter_server the chief learns
# of a worker's notice from its mark in S3 (its poll: every 2 s); in a CI run at ~230 steps/s it saw it only at
# step 1000 (~3.7 s after the notice at step 150, the whole suite beside it), so the boundary is ~16 s away there
EVERY = 4000


def wait_for_step(status: Path, step: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if json.loads(status.read_text()).get("step", 0) >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{status} never reached step {step}")


def notice(processes, name: str) -> None:
    """What the node's supervisor does on a notice: SIGUSR1 to the task."""
    os.kill(processes.procs[name][0].pid, signal.SIGUSR1)


def settings_for(endpoint, tf_cluster, role, index, state_dir, dataset, strategy, steps=LONG):
    """The e2e settings, in a bucket of the strategy's own (the tests share one S3 server)."""
    s = make_settings(endpoint, tf_cluster, role, index, state_dir, steps=steps, run_id="p",
                      dataset_prefix=dataset)
    return dict(s, strategy=strategy, checkpoint_every=EVERY, s3=dict(s["s3"], bucket=bucket_of(strategy)))


def bucket_of(strategy: str) -> str:
    return f"{BUCKET}-{strategy.replace('_', '-')}"


def test_parameter_server_worker_notice_makes_the_chief_save_at_once_then_resume(moto_endpoint, s3_client,
                                                                                processes, tmp_path):
    bucket = bucket_of("parameter_server")
    s3_client.create_bucket(Bucket=bucket)
    dataset = data.ensure_dataset(s3_client, bucket, "datasets/digits", "digits")["prefix"]
    names = {"ps": ["ps0"], "worker": ["worker0", "worker1"], "chief": ["chief"]}
    tf_cluster = {role: [f"127.0.0.1:{free_port()}" for _ in nodes] for role, nodes in names.items()}
    state = {n: tmp_path / "nodes" / n for nodes in names.values() for n in nodes}
    for role in ("ps", "worker"):
        for index, name in enumerate(names[role]):
            start_node(processes, tmp_path, name, settings_for(moto_endpoint, tf_cluster, role, index, state[name],
                                                               dataset, "parameter_server"))
    wait_serving(processes, {n: state[n] for n in ("ps0", "worker0", "worker1")}, timeout_s=90)
    start_node(processes, tmp_path, "chief-1", settings_for(moto_endpoint, tf_cluster, "chief", 0, state["chief"],
                                                            dataset, "parameter_server"))
    wait_for_step(state["chief"] / "status.json", 150)
    notice(processes, "worker1")
    assert processes.wait("chief-1", 60) == PREEMPTED_EXIT_CODE, processes.log("chief-1")
    status = json.loads((state["chief"] / "status.json").read_text())
    saved = checkpoints.saved_steps(s3_client, bucket, "runs/e2e/checkpoints")
    assert status["phase"] == "preempted" and "worker-1" in status["error"], status
    assert saved and saved[-1] == status["step"] and 150 <= saved[-1] < EVERY, (saved, status)
    assert "preemption notice written" in processes.log("worker1")

    # the next start resumes at that step (the marker of the earlier attempt is forgotten)
    at = saved[-1]
    start_node(processes, tmp_path, "chief-2", settings_for(moto_endpoint, tf_cluster, "chief", 0, state["chief"],
                                                            dataset, "parameter_server", steps=at + 40))
    assert processes.wait("chief-2", CHIEF_TIMEOUT_S) == 0, processes.log("chief-2")
    assert f"resumed from checkpoint at step {at}" in processes.log("chief-2")


def test_mirrored_notice_on_one_worker_saves_the_same_step_on_every_task(moto_endpoint, s3_client, processes,
                                                                        tmp_path):
    bucket = bucket_of("multi_worker_mirrored")
    s3_client.create_bucket(Bucket=bucket)
    dataset = data.ensure_dataset(s3_client, bucket, "datasets/digits", "digits")["prefix"]
    tasks = (("chief", 0, "chief"), ("worker", 0, "worker0"), ("worker", 1, "worker1"))
    tf_cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)], "chief": [f"127.0.0.1:{free_port()}"]}
    for role, index, name in tasks:
        start_node(processes, tmp_path, name, settings_for(moto_endpoint, tf_cluster, role, index,
                                                           tmp_path / "nodes" / name, dataset,
                                                           "multi_worker_mirrored"))
    wait_for_step(tmp_path / "nodes" / "chief" / "status.json", 100)
    notice(processes, "worker1")
    steps = {}
    for _, _, name in tasks:
        assert processes.wait(name, 90) == PREEMPTED_EXIT_CODE, processes.log(name)
        status = json.loads((tmp_path / "nodes" / name / "status.json").read_text())
        assert status["phase"] == "preempted", status
        steps[name] = status["step"]
    saved = checkpoints.saved_steps(s3_client, bucket, "runs/e2e/checkpoints")
    assert len(set(steps.values())) == 1 and saved == [steps["chief"]] and saved[0] < EVERY, (steps, saved)
