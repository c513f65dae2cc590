"""End to end on the local provider: a 2×2 grid sweep with ``parallel: 2``, interrupted and resumed.

One module, in order: the sweep is started on a cluster that is not up (it brings up both groups), is
interrupted with Ctrl-C while both first trials train (each one's chief paused until the stop reaches it),
and is run again: the interrupted trials resume their own runs from their checkpoints on their groups, the
others start, and the sweep ends with its table, ``sweep.json`` and ``best.json`` in S3 and every trial's
model verified. A third run skips every trial.
``make down`` removes both groups. Each group is a chief and one worker (multi_worker_mirrored) training
the digits model: what is tested is the sweep, not the model. The grid is steps × learning rate, the long
trials first: they are the ones interrupted, and the short ones keep the file's time down.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time

import pytest

from tests.conftest import PYTHON, REPO, interruptible, needs_root
from tests.integration.helpers import force_down, leftovers, make
from tests.reliability import runs

pytestmark = [pytest.mark.e2e, needs_root()]
CLUSTER = "tfct-sw"
#: the first two trials' steps: each trial's chief is paused (SIGSTOP) at the first line of its log past step
#: 250 (a pauser on its node, started as the sweep prints the trial's first step), and continued once the
#: Ctrl-C's stop reaches it, so both are stopped mid-run whatever the machine's speed (without the pause, 1000
#: steps once let both chiefs publish before the stop reached them in CI, and 3000 cost the resumed run ~2 x
#: 2750 steps). The chief logs a line about once a second, at the end of a call: it paused at steps 520 and
#: 444 in one run (paused when the sweep printed step 250, 2-3 s later, by ~650 at ~135 steps/s); paused, a chief runs
#: 0.2 s in every 2.7 (its worker's heartbeats), ~10 steps a second at that rate.
STEPS = 1200
PAUSE_AT = rf"^step (2[5-9][0-9]|[3-9][0-9][0-9]|1[01][0-9][0-9])/{STEPS} "
SHORT = 300     # the last two trials' steps: they start after the resume and are not interrupted
GROUPS = (CLUSTER, f"{CLUSTER}-g1")
CLUSTER_FILE = f"""
cluster: {CLUSTER}
strategy: multi_worker_mirrored
nodes:
  ps: {{count: 0}}
  worker: {{count: 1}}
training: {{steps: {SHORT}, checkpoint_every: 100}}   # at most one checkpoint per 30 s: the Ctrl-C's save is the one
"""
SWEEP_FILE = f"""
name: steps-lr
parameters:
  training.steps: [{STEPS}, {SHORT}]
  training.learning_rate: [0.003, 0.01]
metric: accuracy
parallel: 2
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    (d / "cluster.yml").write_text(CLUSTER_FILE)
    (d / "sweep.yml").write_text(SWEEP_FILE)
    return d


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("sweep-state") / "state"
    h.mkdir()
    yield h
    for cluster in GROUPS:
        force_down(h, cluster)
    assert [x for c in GROUPS for x in leftovers(h, c)] == []


@pytest.fixture(scope="module")
def env(home, tmp_path_factory):
    return dict(os.environ, TFCLUSTER_HOME=str(home), PYTHONUNBUFFERED="1",
                TFCLUSTER_ARTIFACTS=str(tmp_path_factory.mktemp("artifacts")))


def sweep_cmd(files) -> list[str]:
    return [PYTHON, "-m", "tfcluster", "sweep", "-c", str(files / "cluster.yml"), "--sweep",
            str(files / "sweep.yml")]


def record(home) -> dict:
    return json.loads((home / CLUSTER / "sweeps" / "steps-lr" / "sweep.json").read_text())


@pytest.fixture(scope="module")
def interrupted(files, home, env):
    """The first run, Ctrl-C'd once both groups' first trials have trained past step 250: each trial's chief is
    paused at its first log line past it until the Ctrl-C's stop reaches it (:data:`STEPS`;
    :class:`runs.PausedUntilStop` lets it run 0.2 s in about every 2.7 meanwhile, so that its worker's
    heartbeats go through: a chief paused for the other trial to catch up and then for its stop, ~14 s once,
    lost its worker). The sweep's output is read by a thread throughout, so that the sweep never blocks on a
    full pipe."""
    proc = subprocess.Popen(sweep_cmd(files), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=interruptible)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put(None)], daemon=True)
    reader.start()
    out, pausers, stopped = [], {}, False      # pausers: trial id -> its chief's pauser
    deadline = time.monotonic() + 1200
    try:
        while len(pausers) < 2:
            try:
                line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            assert line, "the sweep ended, or printed nothing until the deadline, before both first trials " \
                         "trained:\n" + "".join(out[-80:])
            out.append(line)
            m = re.match(rf"\[(t\d+) (\S+)\]\s+\[training\] step (\d+)/{STEPS}", line)
            if m and m.group(1) not in pausers:      # the trial trains: pause its chief at its step 250 or later
                group = m.group(2)
                pausers[m.group(1)] = runs.PausedUntilStop(home, group, runs.cluster_nodes(home, group), "chief-0",
                                                           timeout=max(60.0, deadline - time.monotonic()) + 300,
                                                           at=PAUSE_AT)
            assert time.monotonic() < deadline, "".join(out[-80:])
        for pauser in pausers.values():
            pauser.wait_paused()
        proc.send_signal(signal.SIGINT)
        stopped = True
        for trial, pauser in pausers.items():
            print(f"{trial}'s chief: {pauser.wait(timeout=120)}", flush=True)
    finally:
        if not stopped and proc.poll() is None:
            proc.send_signal(signal.SIGINT)     # the sweep stops its trials (each in a session of its own)
        for pauser in pausers.values():
            pauser.__exit__(None, None, None)
        try:
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
            reader.join(timeout=30)
    while (line := lines.get_nowait() if not lines.empty() else None) is not None:
        out.append(line)
    return proc.returncode, "".join(out), set(pausers)


def test_a_sweep_brings_up_its_groups_and_ctrl_c_leaves_its_trials_resumable(interrupted, home):
    code, out, saved = interrupted
    assert code == 130, out[-4000:]
    assert f"bringing up {CLUSTER}-g1" in out and f"group 0 of cluster {CLUSTER}: bringing up {CLUSTER}" in out
    assert "interrupted: stopping the running trials" in out
    rec = record(home)
    states = {t["id"]: t for t in rec["trials"]}
    assert {states[t]["state"] for t in saved} == {"interrupted"}, rec
    assert {states[t]["group"] for t in saved} == set(GROUPS)
    for t in saved:   # each group holds its trial's run, interrupted with its checkpoints in S3
        run = json.loads((home / states[t]["group"] / "run.json").read_text())
        assert run["state"] == "interrupted" and run["trial"] == states[t]["key"]
        assert states[t]["run_id"] == run["run_id"]
    assert sorted(json.loads((home / CLUSTER / "groups.json").read_text())["groups"]) == [f"{CLUSTER}-g1"]


@pytest.fixture(scope="module")
def resumed(interrupted, files, home, env):
    before = {t["id"]: dict(t) for t in record(home)["trials"]}
    res = subprocess.run(sweep_cmd(files), cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    return res, before


def test_the_same_sweep_resumes_its_trials_and_ends_with_the_table_and_the_best_model(resumed, interrupted, home,
                                                                                     env):
    res, before = resumed
    rec = record(home)
    errors = {t["id"]: t.get("error") for t in rec["trials"] if t.get("state") != "verified"}
    assert res.returncode == 0, f"{errors}\n" + res.stdout[-6000:] + res.stderr[-2000:]
    out = res.stdout
    trials = {t["id"]: t for t in rec["trials"]}
    assert len(trials) == 4 and {t["state"] for t in trials.values()} == {"verified"}, rec
    for tid in interrupted[2]:   # the interrupted ones resumed their own runs, from their checkpoints
        assert trials[tid]["run_id"] == before[tid]["run_id"]
        assert re.search(rf"\[{tid} \S+\] ==> resuming run {before[tid]['run_id']}", out), out[-5000:]
    # both were stopped mid-run (paused past step 250) and saved the step they reached: each restored a checkpoint
    # of step 250 or later (no other was due: at most one per 30 s, and none of the first 30 s)
    assert min(trials[tid]["restored_from_step"] for tid in interrupted[2]) >= 250, trials
    for t in trials.values():
        assert 0.5 <= t["metric"] <= 1.0 and t["metric"] == t["metrics"]["test_accuracy"]
    # the table: every trial, best first (equal accuracies: the lower test loss first)
    lines = out[out.index("trial  steps  learning_rate"):].splitlines()
    ranked = sorted(trials.values(), key=lambda t: (-t["metric"], t["metrics"]["test_loss"]))
    assert [ln.split()[0] for ln in lines[1:5]] == [t["id"] for t in ranked]
    assert all("verified" in ln for ln in lines[1:5])
    best = rec["best"]
    assert best["trial"] == ranked[0]["id"] and best["value"] == ranked[0]["metric"]
    assert f"best: trial {best['trial']}" in out and "4 of 4 trials verified" in out
    # sweep.json and best.json in S3, as on this machine; the best model is there and verified
    from tests.e2e.test_train import s3_client

    s3 = s3_client(home)
    prefix = f"runs/{CLUSTER}/sweeps/steps-lr"
    remote = json.loads(s3.get_object(Bucket="tfcluster", Key=f"{prefix}/sweep.json")["Body"].read())
    assert remote["trials"] == rec["trials"] and remote["best"] == best
    assert json.loads(s3.get_object(Bucket="tfcluster", Key=f"{prefix}/best.json")["Body"].read()) == best
    model = best["model"].removeprefix("s3://tfcluster/")
    assert model.startswith(f"runs/{best['group']}/{best['run_id']}")
    assert s3.get_object(Bucket="tfcluster", Key=f"{model}_SUCCESS")
    run = json.loads((home / best["group"] / "run.json").read_text())
    assert run["state"] in ("verified",) and any(t["run_id"] == run["run_id"] for t in trials.values())
    # tensorboard names each trial's run by its id and values
    from tfcluster import config, tensorboard

    os.environ["TFCLUSTER_HOME"] = str(home)
    try:
        spec = config.resolve({"cluster": CLUSTER})
        names = [n for _, _, n in tensorboard.sweep_runs(spec, str(REPO / "x" / "steps-lr.yml"), s3)]
    finally:
        os.environ.pop("TFCLUSTER_HOME")
    assert sorted(names) == sorted(f"{t['id']}-steps={t['params']['training.steps']},"
                                   f"learning_rate={t['params']['training.learning_rate']}" for t in trials.values())


def test_a_finished_sweep_run_again_skips_every_trial(resumed, files, home, env):
    res = subprocess.run(sweep_cmd(files), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert "4 already verified, skipped" in res.stdout and "==> trial" not in res.stdout
    assert "4 of 4 trials verified" in res.stdout


def test_down_removes_every_group(resumed, home):
    res = make("down", home, CLUSTER=CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    for cluster in GROUPS:
        assert f"cluster {cluster} is down" in res.stdout
        assert leftovers(home, cluster) == []
    assert not (home / CLUSTER / "groups.json").exists()
    assert (home / CLUSTER / "sweeps" / "steps-lr" / "sweep.json").exists()   # the record stays
