"""A task's temporary files stay in its state_dir: AutoGraph's files, which a task's fast exit leaves behind,
never pile up in the machine's /tmp."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

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
