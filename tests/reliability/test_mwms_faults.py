"""`strategy: multi_worker_mirrored` on a real local cluster (a chief and 2 workers, no parameter servers):
trains digits and the regression example as the parameter-server path does, and survives a killed worker.

A lost worker stalls every synchronous step.  Here the surviving tasks' collectives fail at once (the
killed process's connections are reset), each task exits with an error, and each node's supervisor starts
it again; every task resumes from the chief's newest checkpoint in S3 and the step count goes on from
there.  A peer that vanishes without a reset (a VM gone) is caught by the stall watchdog instead.
"""

from __future__ import annotations

import re
import signal
import subprocess
from datetime import datetime

import pytest
import yaml

from tests.conftest import PYTHON, REPO, needs_root
from tests.integration.helpers import force_down, leftovers, make
from tests.reliability import runs
from tests.reliability.runs import node_log, printed_metric, resumed_steps, saved_before_restart

pytestmark = [pytest.mark.e2e, needs_root()]
CLUSTER = "tfct-relmw"
SUBNET = "10.231.250.0/24"     # outside every auto subnet (10.231.10-249) and the other tests' networks
STEPS = 1000
CHECKPOINT_EVERY = 100
TASKS = ("chief-0", "worker-0", "worker-1")
STALL_S = 30
CONFIG = f"""\
cluster: {CLUSTER}
strategy: multi_worker_mirrored
nodes:
  worker: {{count: 2}}
  chief: {{count: 1}}
network: {{subnet: {SUBNET}}}
training:
  steps: {STEPS}
  checkpoint_every: {CHECKPOINT_EVERY}
  checkpoint_min_interval_seconds: 0      # the faults land at checkpoints of given steps
  learning_rate: 0.005
  stall_timeout_seconds: {STALL_S}
"""
NO_FAULT: dict[str, float] = {}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("relmw") / "state"
    h.mkdir(parents=True)
    (h / "cluster.yml").write_text(CONFIG)
    yield h
    force_down(h, CLUSTER)
    assert leftovers(h, CLUSTER) == []


def tfcluster(env, *args, timeout=1200):
    return subprocess.run([PYTHON, "-m", "tfcluster", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def cluster(home, env):
    res = make("up", home, CONFIG=str(home / "cluster.yml"), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    res = tfcluster(env, "configure", "-c", str(home / "cluster.yml"))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    return runs.cluster_nodes(home, CLUSTER)


def train(env, home, *extra) -> runs.Train:
    return runs.Train(env, CLUSTER, "-c", str(home / "cluster.yml"), *extra)


def test_mwms_trains_digits_like_the_parameter_server_path(home, env, cluster):
    """multi_worker_mirrored, chief + 2 workers, digits: published, verified, accuracy >= 0.95, workers exit 0."""
    code, out = train(env, home).wait()
    assert code == 0, out[-4000:]
    assert "starting run" in out and "2 workers, 1 chief (multi_worker_mirrored)" in out, out[-3000:]
    NO_FAULT["accuracy"] = printed_metric(out)
    assert NO_FAULT["accuracy"] >= 0.95, out[-2000:]
    run = runs.run_record(home, CLUSTER)
    assert run["state"] == "verified" and run["metrics"]["workers"] == 3 and run["metrics"]["steps"] == STEPS
    for task in TASKS:       # every task trained every step and ended by itself
        log = node_log(home, CLUSTER, task)
        assert f"step {STEPS}/{STEPS} loss" in log and "task succeeded" in log, log[-2000:]


def test_mwms_regression_example(home, env, cluster, tmp_path):
    """The regression example (CSV shards in S3) under multi_worker_mirrored: mae as under parameter servers."""
    res = tfcluster(env, "example-data", "-c", str(home / "cluster.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
    example = yaml.safe_load((REPO / "examples" / "diabetes.yml").read_text())
    ours = yaml.safe_load(CONFIG)
    example.update(cluster=CLUSTER, strategy=ours["strategy"], nodes=ours["nodes"], network=ours["network"])
    example["training"]["model"] = str(REPO / "examples" / example["training"]["model"])
    config = tmp_path / "diabetes-mwms.yml"
    config.write_text(yaml.safe_dump(example))
    res = tfcluster(env, "train", "-c", str(config))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert printed_metric(res.stdout, "mae") < 48, res.stdout[-2000:]      # the parameter-server test's bound
    run = runs.run_record(home, CLUSTER)
    assert run["state"] == "verified" and run["headline"] == "test_mae" and run["metrics"]["workers"] == 3


def supervisor_times(log: str, what: str) -> list[float]:
    """Seconds of the day of the supervisor's lines containing ``what`` (`[supervisor 03:49:45] ...`)."""
    return [float(h) * 3600 + float(m) * 60 + float(s)
            for h, m, s in re.findall(rf"^\[supervisor (\d\d):(\d\d):(\d\d)\] .*{what}", log, re.M)]


def test_mwms_worker_killed_every_task_restarts_from_the_checkpoint(home, env, cluster):
    """Kill a worker at ~40% under multi_worker_mirrored: every task restarts from the newest checkpoint,
    the step count goes on from there, accuracy as without the fault."""
    # killed as it logs its step-400 checkpoint: mid-run whatever the machine's speed (a kill after a poll of
    # the chief's status lands ~1-2 s late)
    at = int(STEPS * 0.4)
    with runs.OnLogLine(home, CLUSTER, cluster, "worker-0", f"^checkpoint saved at step {at}$",
                        signal.SIGKILL) as kill:
        run = train(env, home)
        kill.wait()
    killed = datetime.now()
    code, out = run.wait()
    assert code == 0, out[-4000:]
    assert re.search(r"restarts [1-9]", out), out[-3000:]         # the progress line shows the chief's restart
    logs = {task: node_log(home, CLUSTER, task) for task in TASKS}
    resumed = {task: resumed_steps(log) for task, log in logs.items()}
    step = resumed["chief-0"][-1] if resumed["chief-0"] else None
    saved = saved_before_restart(logs["chief-0"])
    assert step and saved and step == saved[-1] and step >= at - CHECKPOINT_EVERY, (resumed, saved, at)
    assert all(set(r) == {step} for r in resumed.values()), resumed   # every task, from the same step
    # counting on from the checkpoint, not from 0: the steps left, the next checkpoint and the first progress
    # line after it (lines come ~1 s apart: at the fastest rate seen, ~136 steps/s, the first was step 600)
    after = logs["chief-0"].split(f"resumed from checkpoint at step {step}", 1)[1]
    first = int(re.search(r"^step (\d+)/", after, re.M).group(1))
    left = int(re.search(r"^training (\d+) steps on ", after, re.M).group(1))
    next_saved = int(re.search(r"^checkpoint saved at step (\d+)$", after, re.M).group(1))
    assert (left, next_saved) == (STEPS - step, step + CHECKPOINT_EVERY) and step < first, after[:2000]
    kill_s = killed.hour * 3600 + killed.minute * 60 + killed.second
    for task in ("chief-0", "worker-1"):     # the survivors noticed within the stall timeout (a bounded time)
        exits = [t for t in supervisor_times(logs[task], "task exited") if t >= kill_s - 1]
        assert exits and exits[0] - kill_s <= STALL_S + 5, (task, exits, kill_s, logs[task][-2000:])
    accuracy = printed_metric(out)
    print(f"killed worker-0 at step {at}; every task resumed at step {step}, first step after it {first}; "
          f"accuracy {accuracy} (without the fault {NO_FAULT.get('accuracy')})")
    assert accuracy >= NO_FAULT.get("accuracy", 0.97) - 0.02, (accuracy, NO_FAULT)
    assert runs.run_record(home, CLUSTER)["metrics"]["restored_from_step"] == step
