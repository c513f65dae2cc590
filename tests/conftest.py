"""Shared fixtures: the repository, a private state root, and the controller's python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def run_cli(*args: str, home: Path, env: dict | None = None, timeout: int = 600,
            cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run ``python -m tfcluster ARGS`` with state under ``home``."""
    full_env = dict(os.environ, TFCLUSTER_HOME=str(home), PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([PYTHON, "-m", "tfcluster", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "state"
    h.mkdir()
    return h


def needs_root():
    return pytest.mark.skipif(os.geteuid() != 0, reason="the local provider needs root (namespaces)")
