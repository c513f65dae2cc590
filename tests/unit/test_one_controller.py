"""One train of a cluster at a time (and one sweep): a second is refused at once, naming the first, and
``down`` refuses while a train of the cluster runs. The first holds a lock that goes with its process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tfcluster import config, sweep, teardown, training
from tfcluster.errors import Busy, GuardError
from tfcluster.paths import ClusterState, held_alone, lock_holder

HOLD = ("import sys, time\nfrom pathlib import Path\nfrom tfcluster.paths import held_alone\n"
        "with held_alone(Path(sys.argv[1]), RuntimeError):\n    print('held', flush=True)\n    time.sleep(60)\n")


@pytest.fixture
def holder(tmp_path):
    """Start a process that holds a lock file until the test ends (killed: the lock goes with it)."""
    procs = []

    def hold(lock):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def test_a_held_lock_names_its_holder_and_goes_with_its_process(tmp_path, holder):
    lock = tmp_path / "locks" / "c.train"
    assert lock_holder(lock) is None
    proc = holder(lock)
    assert lock_holder(lock).startswith(f"pid {proc.pid}: ")
    with pytest.raises(RuntimeError, match=f"pid {proc.pid}: "):
        with held_alone(lock, RuntimeError):
            pass
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while lock_holder(lock) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock_holder(lock) is None
    with held_alone(lock, RuntimeError):       # free again: taken, and named by this process while held
        assert lock.read_text().startswith(f"pid {os.getpid()}: tfcluster ")


def test_a_second_train_is_refused_naming_the_first_and_down_refuses_while_it_runs(tmp_path, monkeypatch, holder):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path / "home"))
    spec = config.resolve({"cluster": "tfct-one"})
    state = ClusterState("tfct-one")
    monkeypatch.setattr(training, "_nodes_or_fail", lambda state: [])
    monkeypatch.setattr(training, "_train", lambda *a: pytest.fail("a second train went on"))
    destroyed = []
    monkeypatch.setattr(teardown, "destroy_cluster", lambda cluster, provider_name: destroyed.append(cluster))
    monkeypatch.setattr(teardown, "fetch_logs_before_down", lambda cluster: None)
    proc = holder(state.trainer_lock)
    with pytest.raises(Busy, match=rf"cluster tfct-one is in use by another tfcluster process "
                                   rf"\(pid {proc.pid}: tfcluster .*\): a train now would stop its tasks"):
        training.train(spec)
    with pytest.raises(Busy, match=rf"refusing to destroy cluster tfct-one: another tfcluster process is using "
                                   rf"it \(pid {proc.pid}: "):
        teardown.teardown(spec, force=False)
    assert destroyed == []
    teardown.teardown(spec, force=True)     # FORCE=1 still destroys
    assert destroyed == ["tfct-one"]
    assert not state.dir.exists()           # the locks are not the cluster's state


def test_a_train_of_a_cluster_a_sweep_runs_on_is_refused_but_the_sweeps_own(tmp_path, monkeypatch, holder):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path / "home"))
    spec = config.resolve({"cluster": "tfct-one"})
    monkeypatch.setattr(training, "_nodes_or_fail", lambda state: [])
    trained = []
    monkeypatch.setattr(training, "_train", lambda spec, state, nodes, configure_first, trial: trained.append(trial))
    monkeypatch.setattr(teardown, "destroy_cluster", lambda *a, **k: pytest.fail("destroyed under a sweep"))
    proc = holder(ClusterState("tfct-one").sweep_lock)
    with pytest.raises(Busy, match=rf"cluster tfct-one runs a sweep \(pid {proc.pid}: "):
        training.train(spec)
    training.train(spec, trial="s/t1")      # a trial of that sweep trains on it
    assert trained == ["s/t1"]
    with pytest.raises(Busy, match=rf"refusing to destroy cluster tfct-one: it runs a sweep \(pid {proc.pid}: "):
        teardown.teardown(spec, force=False)


def test_make_all_refused_by_another_controller_tears_nothing_down(tmp_path, monkeypatch, holder):
    """`make up train down` (FORCE=1 too) whose train is refused because another process trains the cluster:
    the cluster is that process's, so nothing is torn down."""
    from tfcluster import cli

    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path / "home"))
    spec = config.resolve({"cluster": "tfct-one"})
    monkeypatch.setattr(teardown, "teardown", lambda *a: pytest.fail("torn down"))

    def refused(spec):
        raise Busy("cluster tfct-one is in use by another tfcluster process")

    assert cli.run_then_teardown(spec, True, [lambda spec: None, refused], always=True) == 3


def test_a_refused_step_of_make_up_train_down_tears_down_only_what_is_there(tmp_path, monkeypatch, capsys):
    """`make up train down` whose up or train refuses bad input (exit 2): on a cluster down already (its state
    directory holds only what down keeps: the logs, the run record, the sweeps' records) nothing is torn down
    and only the error is said; where the nodes are up (this make's own `up` brought them), they are torn
    down."""
    from tfcluster import cli, cluster
    from tfcluster.errors import JobError

    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path / "home"))
    spec = config.resolve({"cluster": "tfct-one"})
    state = ClusterState("tfct-one")
    (state.dir / "logs").mkdir(parents=True)
    (state.dir / "sweeps").mkdir()
    state.run.write_text("{}")
    torn = []
    monkeypatch.setattr(teardown, "teardown", lambda spec, force: torn.append(spec.cluster))

    def refused(spec):
        raise JobError("model module job.py has no build_model() function")

    assert not cluster.has_more_than_down_keeps(state)
    assert cli.run_then_teardown(spec, False, [refused], always=False) == 2
    assert torn == [] and capsys.readouterr().out == ""
    state.nodes.write_text("[]")
    assert cluster.has_more_than_down_keeps(state)
    assert cli.run_then_teardown(spec, False, [refused], always=False) == 2
    assert torn == ["tfct-one"] and "tearing down" in capsys.readouterr().out


def test_a_second_sweep_is_refused(tmp_path, monkeypatch, holder):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path / "home"))
    spec = config.resolve({"cluster": "tfct-one"})
    monkeypatch.setattr(sweep, "_run", lambda *a: pytest.fail("a second sweep went on"))
    proc = holder(ClusterState("tfct-one").sweep_lock)
    with pytest.raises(GuardError, match=rf"cluster tfct-one runs a sweep already \(pid {proc.pid}: "):
        sweep.run(spec, None)


@pytest.mark.parametrize("lock", ["trainer_lock", "sweep_lock"])
def test_up_and_configure_of_a_cluster_another_process_uses_are_refused_before_they_touch_it(
        tmp_path, monkeypatch, holder, capsys, lock):
    """`make up` again or `make configure` while another process trains the cluster (or runs a sweep on it)
    would re-apply its nodes or replace the harness under its tasks: exit 3 at once, naming the other process,
    and nothing is done (``make up train down``: nothing torn down either)."""
    from tfcluster import cli, cluster

    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cluster, "preflight", lambda spec: ("checked", {}))
    monkeypatch.setattr(cluster, "up", lambda *a, **k: pytest.fail("up went on"))
    monkeypatch.setattr(training, "configure", lambda *a, **k: pytest.fail("configure went on"))
    monkeypatch.setattr(teardown, "teardown", lambda *a: pytest.fail("torn down"))
    state = ClusterState("tfct-one")
    proc = holder(getattr(state, lock))
    up_refused = (["up"], "'up' now would change the nodes it trains on")
    for argv, now in (up_refused, (["up", "--down-on-failure"], up_refused[1])):    # not up yet: being brought up
        assert cli.main([*argv, "--cluster", "tfct-one"]) == 3, argv
        err = capsys.readouterr().err
        assert f"(pid {proc.pid}: " in err and now in err and err.count("\n") == 1, err
    state.dir.mkdir(parents=True)
    state.nodes.write_text("[]")    # it is up
    for argv, now in (up_refused, (["configure"], "'configure' now would replace the harness")):
        assert cli.main([*argv, "--cluster", "tfct-one"]) == 3, argv
        err = capsys.readouterr().err
        assert f"(pid {proc.pid}: " in err and now in err and err.count("\n") == 1, err
    proc.kill()
    proc.wait(timeout=10)
    upped = []
    monkeypatch.setattr(cluster, "up", lambda spec, provider: upped.append((spec.cluster, provider)))
    assert cli.main(["up", "--cluster", "tfct-one"]) == 0 and upped == [("tfct-one", "checked")]  # free: it goes on
