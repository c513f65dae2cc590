"""A task's temporary files stay in its state_dir: AutoGraph's files, which a task's fast exit leaves behind,
never pile up in the machine's /tmp."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from harness_support import example_settings
from tfc_harness import runner


def test_the_task_tmp_is_emptied_and_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    directory = tmp_path / "state" / runner.TMP_DIR
    directory.mkdir(parents=True)
    (directory / "__autograph_generated_file_from_the_last_run.py").write_text("x = 1\n")
    runner.use_private_tmp(directory)
    assert list(directory.iterdir()) == []                       # the last run's leftovers are gone
    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    assert os.environ["TMPDIR"] == str(directory) and tempfile.gettempdir() == str(directory)
    with tempfile.NamedTemporaryFile(dir=None) as f:
        assert os.path.dirname(f.name) == str(directory)


def test_autograph_writes_into_it_and_a_fast_exit_leaves_nothing_in_tmp(tmp_path):
    """A converted function's file lands in the task's directory, also when the process ends with os._exit
    (as a task does): the directory the process was given instead of /tmp keeps it."""
    given = tmp_path / "given-tmp"
    given.mkdir()
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from tfc_harness import runner\n"
        "runner.use_private_tmp(Path(sys.argv[1]))\n"
        "import tensorflow as tf\n"
        "@tf.function\n"
        "def f(x):\n"
        "    if x > 0:\n"
        "        return x\n"
        "    return -x\n"
        "f(tf.constant(1))\n"
        "runner.end_now(0)\n")
    task_tmp = tmp_path / "state" / runner.TMP_DIR
    task_tmp.parent.mkdir()                    # the task's state_dir (runner.prepare_process makes it first)
    env = dict(os.environ, TMPDIR=str(given), TF_CPP_MIN_LOG_LEVEL="2")
    script = tmp_path / "task.py"          # a file: AutoGraph converts only functions whose source it can read
    script.write_text(code)
    res = subprocess.run([sys.executable, str(script), str(task_tmp)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert any(p.name.startswith("__autograph_generated_file") for p in task_tmp.iterdir()), \
        list(task_tmp.iterdir())
    assert list(given.iterdir()) == []


def test_a_task_prepared_for_its_run_uses_the_tmp_in_its_state_dir(tmp_path):
    """runner.prepare_process (what every task runs before TensorFlow) gives the process that directory."""
    state = tmp_path / "state"
    code = ("import json, sys, tempfile, os\n"
            "from tfc_harness import runner, settings\n"
            "s = runner.prepare_process(settings.validate(json.loads(sys.argv[1])))\n"
            "print(json.dumps([tempfile.gettempdir(), os.environ['TMPDIR'], s.state_dir]))\n")
    res = subprocess.run([sys.executable, "-c", code, json.dumps(example_settings(state_dir=str(state)))],
                         env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout) == [str(state / runner.TMP_DIR)] * 2 + [str(state)]


def test_what_cannot_be_emptied_does_not_stop_the_task(tmp_path, monkeypatch):
    """A file where the directory goes, or leftovers the task user cannot remove: the task still starts."""
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    directory = tmp_path / runner.TMP_DIR
    directory.write_text("not a directory")
    runner.use_private_tmp(directory)
    assert directory.is_dir() and tempfile.gettempdir() == str(directory)
    stuck = directory / "read-only"
    stuck.mkdir()
    (stuck / "kept").write_text("x")
    monkeypatch.setattr(runner.shutil, "rmtree", lambda *a, **k: None)     # as if nothing could be removed
    runner.use_private_tmp(directory)
    assert directory.is_dir() and oct(directory.stat().st_mode & 0o777) == "0o700"
