"""Sweeps without nodes: the sweep file's checks, the trials it expands to, the groups' configuration, the
record's resume rules, the ranking and the table. (A sweep on real nodes: tests/e2e/test_sweep.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tfcluster import config, groups, sweep, sweepfile
from tfcluster.errors import ConfigError

#: a model with hparams (build_model(hparams): units) and metrics mae, rmse
DIABETES = Path(__file__).resolve().parents[2] / "examples" / "diabetes.yml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yml"
    path.write_text(text)
    return path


@pytest.fixture
def spec():
    return config.resolve(config.load_file(DIABETES), {"cluster": "tfct-sw", "training.hparams": {"units": 16}})


def test_a_grid_runs_every_combination_in_a_stable_order_with_ids_and_keys(tmp_path, spec):
    path = write(tmp_path, "parameters:\n  training.learning_rate: [0.001, 0.01]\n"
                           "  training.batch_size: [32, 64, 128]\nparallel: 2\n")
    sw = sweepfile.load(path, spec)
    assert (sw.name, sw.method, sw.parallel) == ("sweep", "grid", 2)
    assert [t["params"] for t in sw.trials[:3]] == [
        {"training.learning_rate": 0.001, "training.batch_size": 32},
        {"training.learning_rate": 0.001, "training.batch_size": 64},
        {"training.learning_rate": 0.001, "training.batch_size": 128}]
    assert len(sw.trials) == 6 and [t["id"] for t in sw.trials] == [f"t0{i}" for i in range(6)]
    assert len({t["key"] for t in sw.trials}) == 6
    assert sw.trials == sweepfile.load(path, spec).trials              # the same file: the same trials
    # the metric defaults to the model's headline and its direction is known
    assert (sw.metric, sw.direction) == ("test_mae", "minimize")


def test_a_random_search_draws_the_same_trials_from_the_same_seed_within_the_ranges(tmp_path, spec):
    text = ("method: random\nseed: 7\ntrials: 5\nparameters:\n"
            "  training.learning_rate: {min: 0.0001, max: 0.1, log: true}\n"
            "  training.steps: {min: 50, max: 80}\n  hparams.units: [8, 16, 32]\n"
            "metric: loss\n")
    sw = sweepfile.load(write(tmp_path, text), spec)
    again = sweepfile.load(write(tmp_path, text), spec)
    assert sw.trials == again.trials and len(sw.trials) == 5
    for t in sw.trials:
        p = t["params"]
        assert 0.0001 <= p["training.learning_rate"] <= 0.1
        assert isinstance(p["training.steps"], int) and 50 <= p["training.steps"] <= 80
        assert p["hparams.units"] in (8, 16, 32)
    assert (sw.metric, sw.direction) == ("test_loss", "minimize")
    other = sweepfile.load(write(tmp_path, text.replace("seed: 7", "seed: 8")), spec)
    assert other.trials != sw.trials


def test_a_trial_keeps_the_clusters_hparams_and_sets_its_own(tmp_path, spec):
    sw = sweepfile.load(write(tmp_path, "parameters:\n  hparams.units: [4]\n  training.learning_rate: [0.05]\n"), spec)
    trial = sweepfile.trial_spec(spec, sw, sw.trials[0]["params"])
    assert trial.training.hparams == {"units": 4}
    assert trial.training.learning_rate == 0.05 and trial.cluster == spec.cluster
    assert spec.training.hparams == {"units": 16}                 # the cluster's own is untouched


def test_hparams_on_a_model_that_takes_none_are_refused_before_anything_runs(tmp_path):
    digits = config.resolve({"cluster": "tfct-sw"})
    with pytest.raises(Exception) as err:
        sweepfile.load(write(tmp_path, "parameters:\n  hparams.units: [4, 8]\n"), digits)
    assert "build_model() takes no parameter" in str(err.value) and err.value.exit_code == 2


def test_a_swept_hparam_is_refused_when_no_trial_reads_it_and_each_trials_values_are_built(tmp_path):
    """Every trial's hparams are built before anything runs; a name must be read with one trial's values at
    least (an architecture's own names are read only with it)."""
    (tmp_path / "cond.py").write_text(
        "import keras\nloss = 'mse'\ndef make_dataset(): pass\ndef build_model(hparams):\n"
        "    n = int(hparams['units']) if hparams['arch'] == 'mlp' else int(hparams['filters'])\n"
        "    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(n)])\n")
    spec = config.resolve({"cluster": "tfct-sw", "training": {"model": str(tmp_path / "cond.py"),
                                                             "hparams": {"arch": "mlp", "units": 4}}})
    grid = "parameters:\n  hparams.arch: [mlp, cnn]\n  hparams.units: [4, 8]\n  hparams.filters: [2]\n"
    assert len(sweepfile.load(write(tmp_path, grid), spec).trials) == 4
    path = write(tmp_path, grid + "  hparams.layers: [1, 2]\n")
    with pytest.raises(Exception) as err:
        sweepfile.load(path, spec)
    assert str(err.value).startswith(f"sweep {path}: model module cond.py: build_model() never reads "
                                     "training.hparams 'layers' with any trial's values (it reads arch, filters, "
                                     "units)"), str(err.value)
    assert err.value.exit_code == 2
    path = write(tmp_path, "parameters:\n  hparams.arch: [mlp]\n  hparams.units: [4, x]\n  hparams.filters: [2]\n")
    with pytest.raises(Exception) as err:
        sweepfile.load(path, spec)
    assert "build_model() raised ValueError at line 5: invalid literal for int() with base 10: 'x' (training.hparams " \
           "{'arch': 'mlp', 'units': 'x', 'filters': 2})" in str(err.value), str(err.value)


@pytest.mark.parametrize("text, field, allowed", [
    ("parameters: {}\n", "parameters", "a mapping of fields"),
    ("parameters:\n  training.model: [digits]\n", "parameters", "hparams.<name>"),
    ("parameters:\n  nodes.worker.count: [1, 2]\n", "parameters", "training.learning_rate"),
    ("parameters:\n  training.learning_rate: []\n", "parameters.training.learning_rate", "non-empty list"),
    ("parameters:\n  training.learning_rate: [0.01, -1]\n", "parameters.training.learning_rate", "a number > 0.0"),
    ("parameters:\n  training.batch_size: {min: 8, max: 64}\n", "parameters.training.batch_size", "a list of values"),
    ("method: random\ntrials: 2\nparameters:\n  training.learning_rate: {min: 0, max: 1, log: true}\n",
     "parameters.training.learning_rate", "a > 0"),
    ("method: random\nparameters:\n  hparams.units: [1]\n", "trials", "an integer ≥ 1"),
    ("method: random\ntrials: 0\nparameters:\n  hparams.units: [1]\n", "trials", "an integer ≥ 1"),
    ("trials: 3\nparameters:\n  hparams.units: [1]\n", "trials", "only with method: random"),
    ("method: bayes\nparameters:\n  hparams.units: [1]\n", "method", "grid"),
    ("parallel: 0\nparameters:\n  hparams.units: [1]\n", "parallel", "from 1 to 9"),
    ("metric: f1\nparameters:\n  hparams.units: [1]\n", "metric", "loss, mae, rmse"),
    ("metric: rmse\ndirection: up\nparameters:\n  hparams.units: [1]\n", "direction", "maximize or minimize"),
    ("metric: mae\ndirection: maximize\nparameters:\n  hparams.units: [1]\n", "direction",
     "minimize, the direction of mae"),
    ("parameter:\n  hparams.units: [1]\n", "parameter", "one of the keys"),
    ("name: 'a b'\nparameters:\n  hparams.units: [1]\n", "name", "letters, digits"),
    ("- 1\n", "file", "a YAML mapping"),
])
def test_a_bad_sweep_file_names_the_field_and_what_is_allowed(tmp_path, spec, text, field, allowed):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        sweepfile.load(path, spec)
    assert err.value.field == f"sweep {path}: {field}"
    assert allowed in err.value.allowed
    # a key the file leaves out is said to be missing, not to hold its default
    assert ("trials: missing; allowed" in str(err.value)) == (text.startswith("method: random\nparameters")), \
        str(err.value)


def test_a_long_cluster_name_cannot_have_groups(tmp_path):
    long = config.resolve(config.load_file(DIABETES), {"cluster": "a-seventeen-chars"})
    with pytest.raises(ConfigError) as err:
        sweepfile.load(write(tmp_path, "parallel: 2\nparameters:\n  hparams.units: [1]\n"), long)
    assert err.value.field == "cluster" and "at most 16 characters" in err.value.allowed
    assert sweepfile.load(write(tmp_path, "parallel: 1\nparameters:\n  hparams.units: [1]\n"), long).parallel == 1


def test_group_k_is_its_own_cluster_with_the_kth_next_subnet_when_the_subnet_is_given():
    base = config.resolve({"cluster": "exp", "network": {"subnet": "10.231.240.0/24"}})
    assert groups.spec_for(base, 0) is base
    g2 = groups.spec_for(base, 2)
    assert (g2.cluster, g2.network.subnet) == ("exp-g2", "10.231.242.0/24")
    assert g2.training == base.training and g2.nodes == base.nodes
    auto = config.resolve({"cluster": "exp"})
    assert groups.spec_for(auto, 1).network.subnet == "auto"    # from the group's own name


def test_the_group_record_lists_what_down_must_remove(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    assert groups.extra("exp") == []
    groups.remember("exp", "exp-g2")
    groups.remember("exp", "exp-g1")
    groups.remember("exp", "exp-g1")
    assert groups.extra("exp") == ["exp-g1", "exp-g2"]
    groups.forget("exp", "exp-g1")
    groups.forget("exp", "exp-g2")
    assert groups.extra("exp") == [] and not (tmp_path / "exp" / "groups.json").exists()


def test_each_missing_group_is_checked_once_and_all_before_any_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(sweep.lifecycle, "preflight", lambda s: calls.append(("check", s.cluster)) or
                        (f"provider of {s.cluster}", {}))
    monkeypatch.setattr(sweep.lifecycle, "up", lambda s, provider=None: calls.append(("up", s.cluster, provider)))
    base = config.resolve({"cluster": "exp", "network": {"subnet": "10.231.240.0/24"}})
    assert [s.cluster for s in sweep.ensure_groups(base, 2)] == ["exp", "exp-g1"]
    assert calls == [("check", "exp"), ("check", "exp-g1"),
                     ("up", "exp", "provider of exp"), ("up", "exp-g1", "provider of exp-g1")]
    assert groups.extra("exp") == ["exp-g1"]


def test_plan_checks_every_group_as_up_does_and_creates_none(tmp_path, monkeypatch, capsys):
    """make plan SWEEP=: the groups' checks as make up SWEEP= makes them (the plan's own cluster once), a group of
    another shape refused (exit 2) before anything is printed."""
    from tfcluster import plan
    from tfcluster.errors import ClusterMismatch

    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(plan, "preflight", lambda s: calls.append(("plan's check", s.cluster)) or ("p", {}))
    monkeypatch.setattr(sweep.lifecycle, "preflight", lambda s: calls.append(("check", s.cluster)) or ("p", {}))
    monkeypatch.setattr(plan, "provider_plan", lambda *a: pytest.fail("planned past a failed check"))
    base = config.resolve({"cluster": "exp", "network": {"subnet": "10.231.240.0/24"}})
    sw = sweepfile.load(write(tmp_path, "parameters:\n  training.learning_rate: [0.001, 0.01]\nparallel: 3\n"),
                        base)
    bigger = groups.spec_for(config.resolve({"cluster": "exp", "network": {"subnet": "10.231.240.0/24"},
                                             "nodes": {"worker": {"count": 3}}}), 2)
    state = sweep.ClusterState("exp-g2")
    state.dir.mkdir(parents=True)
    state.nodes.write_text("[]")
    sweep.lifecycle.save_spec(state, bigger)                # group 2 is up with 3 workers
    with pytest.raises(ClusterMismatch, match="cluster exp-g2 is up with another shape: 3 worker"):
        plan.show(base, sw)
    assert calls == [("plan's check", "exp")] and capsys.readouterr().out == ""
    sweep.lifecycle.save_spec(state, groups.spec_for(base, 2))
    monkeypatch.setattr(plan, "provider_plan", lambda *a: (_ for _ in ()).throw(RuntimeError("planned")))
    with pytest.raises(RuntimeError, match="planned"):
        plan.show(base, sw)
    assert calls[1:] == [("plan's check", "exp"), ("check", "exp-g1")]    # group 2 is up: it fits


def test_the_record_keeps_what_earlier_runs_of_the_same_sweep_found_by_the_trials_values(tmp_path, spec,
                                                                                       monkeypatch):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    path = write(tmp_path, "name: s1\nparameters:\n  training.learning_rate: [0.001, 0.01]\n")
    sw = sweepfile.load(path, spec)
    rec = sweep.Record(spec, sw)
    rec.update(rec.trials()[1], state="verified", metric=0.9, run_id="r1")
    # the file grows a value: the verified trial is still known by its values, under its new id
    path.write_text("name: s1\nparameters:\n  training.learning_rate: [0.0001, 0.001, 0.01]\n")
    again = sweep.Record(spec, sweepfile.load(path, spec))
    states = {t["params"]["training.learning_rate"]: (t["id"], t["state"]) for t in again.trials()}
    assert states == {0.0001: ("t00", "pending"), 0.001: ("t01", "pending"), 0.01: ("t02", "verified")}


def test_a_sweep_whose_trials_are_all_verified_brings_up_no_group_and_prints_its_table(tmp_path, spec,
                                                                                      monkeypatch, capsys):
    """Run again after every trial was verified: no node would train, so none boots (on a cloud: no VM); the
    table, the best trial and the record in S3 are as the first run left them. One pending trial: the groups
    come up as before."""
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    sw = sweepfile.load(write(tmp_path, "name: s2\nparameters:\n  training.learning_rate: [0.001, 0.01]\n"), spec)
    rec = sweep.Record(spec, sw)
    for i, trial in enumerate(rec.trials()):
        rec.update(trial, state="verified", metric=0.5 + i, run_id=f"r{i}", group="tfct-sw", s3_prefix=f"s3://b/r{i}/")
    monkeypatch.setattr(sweep, "ensure_groups", lambda *a: pytest.fail("brought up groups for no trial"))
    monkeypatch.setattr(sweep, "publish", lambda *a: "s3://b/sweeps/s2/")
    assert sweep.bring_up(spec, sw) == []
    assert sweep.run(spec, sw) == 0
    out = capsys.readouterr().out
    assert "every one of its 2 trials is verified already: no group of nodes is brought up" in out
    assert "t00" in out and "t01" in out and "sweep s2: 2 of 2 trials verified" in out
    rec.update(rec.trials()[0], state="failed")
    calls = []
    monkeypatch.setattr(sweep, "ensure_groups", lambda s, parallel: calls.append(parallel) or [])
    sweep.bring_up(spec, sw)
    assert calls == [sw.parallel]


def test_trials_rank_by_the_metric_in_its_direction_and_the_best_is_a_verified_one(tmp_path, spec):
    sw = sweepfile.load(write(tmp_path, "parameters:\n  training.learning_rate: [1, 2, 3, 4]\nmetric: loss\n"),
                    spec)
    trials = [dict(t) for t in sw.trials]
    for t, state, value in zip(trials, ["verified", "failed", "verified", "verified"], [0.5, None, 0.2, 0.9],
                               strict=True):
        t.update(state=state, metric=value, run_id=f"r-{t['id']}", group="g", s3_prefix="s3://b/p/",
                 seconds=12.0)
    assert [t["id"] for t in sweep.ranked(trials, "minimize")] == ["t02", "t00", "t03", "t01"]
    assert [t["id"] for t in sweep.ranked(trials, "maximize")] == ["t03", "t00", "t02", "t01"]
    assert sweep.best(sw, trials)["trial"] == "t02" and sweep.best(sw, trials)["value"] == 0.2
    lines = sweep.table(sw, trials).splitlines()
    assert lines[0].split() == ["trial", "learning_rate", "loss", "time", "state", "run"]
    assert lines[1].split()[:3] == ["t02", "3", "0.2000"] and lines[-1].split()[-2:] == ["failed", "r-t01"]
    tied = [dict(t, state="verified", metric=1.0, metrics={"test_loss": loss})
            for t, loss in zip(trials, [0.06, 0.009, None, 0.02], strict=True)]
    assert [t["id"] for t in sweep.ranked(tied, "maximize")] == ["t01", "t03", "t00", "t02"]   # equal: lower loss
    for t in trials:
        t["state"] = "failed"
    assert sweep.best(sw, trials) is None


@pytest.mark.parametrize("command", ["sweep", "up", "all", "plan"])
def test_a_bad_sweep_exits_2_with_one_line_and_creates_nothing(tmp_path, home, command):
    path = write(tmp_path, "parameters:\n  training.learning_rate: [0.01, 0]\nparallel: 2\n")
    res = run_cli(command, "-c", str(DIABETES), "--cluster", "tfct-swbad", "--sweep", str(path), home=home)
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in res.stderr
    assert f"sweep {path}: parameters.training.learning_rate: got 0" in err[0]
    assert not (home / "tfct-swbad").exists() and not (home / "tfct-swbad-g1").exists()


def test_plan_shows_the_sweeps_trials_and_groups(tmp_path, spec, monkeypatch):
    from tfcluster import plan

    path = write(tmp_path, "name: lr\nparameters:\n  training.learning_rate: [0.001, 0.01, 0.1]\n"
                           "  hparams.units: [8, 16, 32, 64, 128]\nparallel: 2\n")
    sw = sweepfile.load(path, spec)
    monkeypatch.setattr(plan, "TRIALS_SHOWN", 4)
    monkeypatch.setattr(plan.ClusterState, "nodes", property(lambda self: tmp_path / f"{self.cluster}.json"))
    (tmp_path / "tfct-sw-g1.json").write_text("[]")
    assert plan.sweep_lines(spec, sw) == [
        f"lr ({path}): 15 trials (grid), minimizing mae",
        "2 at once, on groups tfct-sw, tfct-sw-g1: each a cluster of its own (its own subnet and addresses) with the "
        "nodes above (tfct-sw-g1 up already)",
        "t00: learning_rate=0.001, units=8", "t01: learning_rate=0.001, units=16",
        "t02: learning_rate=0.001, units=32", "t03: learning_rate=0.001, units=64", "... and 11 more"]


def test_a_missing_sweep_file_is_refused(home):
    res = run_cli("sweep", "--cluster", "tfct-swbad", "--sweep", "/nope/sweep.yml", home=home)
    assert res.returncode == 2 and "SWEEP: got '/nope/sweep.yml'; allowed: an existing sweep file" in res.stderr


def test_tensorboard_names_a_sweeps_trials_from_its_record(tmp_path, spec, monkeypatch):
    from tfcluster import tensorboard

    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    path = write(tmp_path, "name: s2\nparameters:\n  training.learning_rate: [0.001, 0.01]\n")
    sw = sweepfile.load(path, spec)
    rec = sweep.Record(spec, sw)
    rec.update(rec.trials()[0], run_id="20261123-070000-ab12", group="tfct-sw-g1")
    assert tensorboard.sweep_runs(spec, str(path), client=None) == [
        ("tfct-sw-g1", "20261123-070000-ab12", "t00-learning_rate=0.001")]
    assert json.loads(rec.path.read_text())["trials"][1]["state"] == "pending"


def test_down_refuses_while_any_groups_model_is_unverified_and_destroys_no_group(home):
    """The guard of every group is checked before any group is destroyed (no nodes needed: the records)."""
    (home / "tfct-swg").mkdir()
    (home / "tfct-swg" / "groups.json").write_text(json.dumps({"groups": ["tfct-swg-g1"]}))
    (home / "tfct-swg" / "run.json").write_text(json.dumps({"run_id": "r0", "state": "verified"}))
    (home / "tfct-swg-g1").mkdir()
    (home / "tfct-swg-g1" / "run.json").write_text(json.dumps(
        {"run_id": "r1", "state": "unverified", "s3_prefix": "s3://tfcluster/runs/tfct-swg-g1/r1/"}))
    res = run_cli("down", "--cluster", "tfct-swg", home=home)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "refusing to destroy cluster tfct-swg-g1: run r1 published a model" in res.stderr
    assert "destroy cluster" not in res.stdout
    assert json.loads((home / "tfct-swg" / "groups.json").read_text())["groups"] == ["tfct-swg-g1"]


def test_a_trials_playbook_progress_goes_to_its_log_only_and_its_failures_to_the_console_too(spec, capsys):
    import io

    lines = ["==> start the tasks ...\n", "    PLAY [Start the tasks, the chief last]\n",
             "    TASK [tf_node : Copy the harness bundle]\n", "    PLAY RECAP\n",
             "    exp-chief-0                : ok=11   changed=7    unreachable=0    failed=0\n",
             "    fatal: [exp-chief-0]: FAILED! => {\"msg\": \"no\"}\n", "  [training] step 5/10 (50%)\n"]
    log = io.StringIO()
    scheduler = sweep.Scheduler(spec, None, None, [])
    for line in lines:
        scheduler._show("[t00 exp]", line, log)
    assert log.getvalue() == "".join(lines)
    assert capsys.readouterr().out.splitlines() == [
        "[t00 exp] ==> start the tasks ...", "[t00 exp]     TASK [tf_node : Copy the harness bundle]",
        '[t00 exp]     fatal: [exp-chief-0]: FAILED! => {"msg": "no"}', "[t00 exp]   [training] step 5/10 (50%)"]
    for line in ("    PLAY RECAP\n",
                 "    exp-chief-0                : ok=3    changed=0    unreachable=1    failed=0\n",
                 "    exp-ps-0                   : ok=3    changed=0    unreachable=0    failed=0\n"):
        scheduler._show("[t00 exp]", line, log)
    assert capsys.readouterr().out.splitlines() == [
        "[t00 exp]     exp-chief-0                : ok=3    changed=0    unreachable=1    failed=0"]


def test_local_groups_whose_names_derive_the_same_subnet_are_refused_before_any_is_created(tmp_path, monkeypatch):
    """run95 and run95-g1 both derive 10.231.25.0/24: each group's own check passes while neither is up, and the
    second bridge would take a network in use."""
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    monkeypatch.setattr(sweep.lifecycle, "preflight", lambda s: pytest.fail("checked a group past the collision"))
    base = config.resolve({"cluster": "run95"})
    with pytest.raises(ConfigError, match=r"network.subnet: got 'auto'; allowed: a subnet for each group of the "
                                          r"sweep: groups run95 and run95-g1 would both take 10.231.25.0/24"):
        sweep.check_groups(base, 2)
    given = config.resolve({"cluster": "run95", "network": {"subnet": "10.231.25.0/24"}})
    monkeypatch.setattr(sweep.lifecycle, "preflight", lambda s: ("p", {}))
    specs, _ = sweep.check_groups(given, 2)      # a given subnet: the groups take the next ones
    assert [s.network.subnet for s in specs] == ["10.231.25.0/24", "10.231.26.0/24"]
