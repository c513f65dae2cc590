"""tfc_harness is an installed package of the controller's venv, and the node bundle holds all of it."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

from tfcluster import wheelhouse
from tfcluster.paths import TRAIN_DIR


def test_the_controller_imports_the_harness_without_a_path_insertion(tmp_path):
    """A fresh interpreter, started elsewhere with no PYTHONPATH, finds the harness of this checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import sys, tfc_harness.data, tfc_harness.verify, tfc_harness.strategies as s; "
            "print(tfc_harness.data.__file__); print(s.SHAPES['parameter_server']['chief'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    path, chief = proc.stdout.splitlines()
    assert path == str(TRAIN_DIR / "tfc_harness" / "data.py") and chief == "(1, 1)"


def test_the_bundle_ships_every_harness_module(tmp_path):
    """The bundle takes every module of tfc_harness, its sub-packages' too (the data formats')."""
    bundle, _ = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path)
    members = tarfile.open(bundle).getmembers()
    shipped = {m.name for m in members if m.name.startswith("tfc_harness/") and m.isfile()}
    assert {m.name: oct(m.mode) for m in members if m.isdir()} == {
        "models": "0o755", "tfc_harness": "0o755", "tfc_harness/formats": "0o755"}
    sources = {p.relative_to(TRAIN_DIR).as_posix() for p in (TRAIN_DIR / "tfc_harness").rglob("*.py")}
    assert sources == shipped
    assert {"tfc_harness/strategies.py", "tfc_harness/parameter_server.py", "tfc_harness/formats/__init__.py",
            "tfc_harness/formats/csv_files.py"} <= shipped
