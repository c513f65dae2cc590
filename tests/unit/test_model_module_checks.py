"""The user's model module is imported (in a subprocess) and checked by `validate` and `up` before anything
is created: exit status 2, one line naming the module and what is wrong, no traceback, nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import QUIET_SUBNET, run_cli
from tests.unit.test_config import _cluster_traces

GOOD_MODEL = ("import keras\ndef build_model():\n"
              "    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])\n")

# (id, module text, extra cluster file text, what the one error line must say)
CASES = [
    ("syntax error", "def build_model(:\n    pass\n", "",
     "model module job.py: importing it raised SyntaxError"),
    ("import error", "import no_such_package_here\n" + GOOD_MODEL, "",
     "model module job.py: importing it raised ModuleNotFoundError: No module named 'no_such_package_here'"),
    ("no build_model", "def make_dataset():\n    return {}\n", "",
     "model module job.py has no build_model() function"),
    ("no data source", GOOD_MODEL + "loss = 'mse'\n", "",
     "model module job.py has no data: define make_dataset() or name files in the cluster file's data.train"),
    ("tfrecord without decode", GOOD_MODEL + "loss = 'mse'\n",
     "data:\n  train: s3://tfcluster/d/train-*\n  test: s3://tfcluster/d/test-*\n",
     "model module job.py has no decode(record) function; data.format tfrecord needs one"),
    ("loss Keras cannot resolve", GOOD_MODEL + "loss = 'mean_squired_error'\ndef make_dataset(): pass\n", "",
     "model module job.py: loss 'mean_squired_error' is not a Keras loss name"),
    ("metric Keras cannot resolve", GOOD_MODEL + "loss = 'mse'\ndef make_dataset(): pass\n"
     "def metrics():\n    return ['mean_absolut_error']\n", "",
     "model module job.py: metrics() returned 'mean_absolut_error', which is not a Keras metric name"),
    ("build_model raises", "def build_model():\n    raise ValueError('units must be > 0')\ndef make_dataset(): pass\n",
     "", "model module job.py: build_model() raised ValueError: units must be > 0"),
    ("hparams for a build_model without them", GOOD_MODEL + "def make_dataset(): pass\n",
     "training:\n  hparams: {units: 8}\n", "build_model() takes no parameter, but training.hparams is set"),
]


# `up` runs the same check as `validate`: every case through validate, a few through up too.
RUNS = [("validate", *case) for case in CASES] + [("up", *case) for case in CASES if case[0] in (
    "syntax error", "no data source", "metric Keras cannot resolve")]


@pytest.mark.parametrize("command,case_id,module,cluster_text,message", RUNS,
                         ids=[f"{r[0]}: {r[1]}" for r in RUNS])
def test_a_bad_model_module_is_refused_before_anything_exists(home, tmp_path, command, case_id, module,
                                                              cluster_text, message):
    (tmp_path / "job.py").write_text(module)
    cfg = tmp_path / "cluster.yml"
    cfg.write_text(f"cluster: tfct-mod\ntraining:\n  model: {tmp_path / 'job.py'}\n"
                   + cluster_text.replace("training:\n", "training:\n  steps: 10\n"))
    res = run_cli(command, "-c", str(cfg), home=home, timeout=180)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert list(home.iterdir()) == []
    assert _cluster_traces("tfct-mod") == []


@pytest.mark.parametrize("command", ["validate", "up"])
def test_a_tensorflow_release_that_does_not_exist_is_refused(home, command):
    res = run_cli(command, "--cluster", "tfct-mod", "--set", "tensorflow.version=2.99.0", home=home, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "tensorflow.version: got '2.99.0'; allowed: a release tfcluster knows: 2.16.x" in res.stderr
    assert list(home.iterdir()) == []


def test_validate_says_what_the_module_gives(home, tmp_path):
    (tmp_path / "regress.py").write_text(GOOD_MODEL + "loss = 'mse'\ndef make_dataset(): pass\n"
                                         "def metrics():\n    return ['mae']\n")
    res = run_cli("validate", "--set", f"training.model={tmp_path / 'regress.py'}",
                  "--set", f"network.subnet={QUIET_SUBNET}", home=home, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "model module regress.py: data from make_dataset, loss mean_squared_error, metrics " \
           "mean_absolute_error" in res.stderr
    again = run_cli("validate", "--set", f"training.model={tmp_path / 'regress.py'}",
                    "--set", f"network.subnet={QUIET_SUBNET}", home=home, timeout=180)
    assert again.returncode == 0 and again.stderr == res.stderr    # the cached check says the same


def test_the_job_check_process_gets_a_temporary_directory_of_its_own_removed_after_it(monkeypatch, tmp_path):
    """AutoGraph's files of the functions the check converts (a CSV parser, the user's decode), and the bytecode
    Python writes beside them, which TensorFlow's exit leaves behind, go to that directory, not /tmp."""
    import subprocess

    from tfcluster import job

    given = []

    def run(argv, env, **kw):
        directory = Path(env["TMPDIR"])
        assert directory.is_dir() and directory != Path("/tmp") and list(directory.iterdir()) == []
        (directory / "__pycache__").mkdir()
        (directory / "__pycache__" / "__autograph_generated_file1.cpython-311.pyc").write_bytes(b"x")
        given.append(directory)
        return subprocess.CompletedProcess(argv, 0, stdout='{"probe": "checked"}\n', stderr="")

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(job.tempfile, "tempdir", None)       # gettempdir() reads TMPDIR again
    monkeypatch.setattr(job.subprocess, "run", run)
    assert job._call("run", {"module": "m.py"}, {}, 60) == {"probe": "checked"}
    assert len(given) == 1 and given[0].parent == tmp_path and not given[0].exists()
