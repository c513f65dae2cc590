"""`make bench`'s own input: an unknown strategy is refused before any cluster is made."""

from __future__ import annotations

import subprocess

from tests.conftest import PYTHON, REPO


def test_unknown_strategy_exits_2_naming_the_allowed_ones(tmp_path):
    res = subprocess.run([PYTHON, "scripts/bench.py", "--strategies", "parameter_server,allreduce", "--cluster",
                          "tfct-nobench"], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "TFCLUSTER_HOME": str(tmp_path)})
    assert res.returncode == 2, res.stdout + res.stderr
    allowed = "parameter_server, multi_worker_mirrored"
    assert f"--strategies allreduce: not a strategy; allowed are {allowed}" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []
