"""gpu_driver on local nodes: reports no GPU and changes nothing; a node claiming GPUs it lacks fails."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import needs_root
from tests.integration.helpers import force_down, leftovers, make
from tfcluster import ansible_run
from tfcluster.paths import ClusterState

pytestmark = [pytest.mark.integration, needs_root()]
CLUSTER = "tfct-gpu"
PLAYBOOK = Path(__file__).with_name("gpu_driver.yml")


@pytest.fixture
def cluster(home):
    res = make("up", home, CLUSTER=CLUSTER, WORKERS="1", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    yield ClusterState(CLUSTER, root=home)
    force_down(home, CLUSTER)
    assert leftovers(home, CLUSTER) == []


def play(state: ClusterState, *extra: str) -> subprocess.CompletedProcess:
    cmd = [str(ansible_run.BIN / "ansible-playbook"), "-i", str(state.inventory), str(PLAYBOOK), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=ansible_run.environment(state), timeout=300)


def test_no_gpu_is_a_clean_noop_and_missing_gpus_fail(cluster):
    res = play(cluster)
    assert res.returncode == 0, res.stdout[-3000:]
    assert res.stdout.count("0 GPU(s) declared, 0 NVIDIA device(s) found; nothing to do") == 3
    recap = re.findall(r"^(tfct-gpu-\S+)\s+: ok=\d+\s+changed=(\d+)", res.stdout, re.M)
    assert len(recap) == 3 and all(c == "0" for _, c in recap), recap

    res = play(cluster, "--limit", f"{CLUSTER}-worker-0", "-e", "tf_gpus=2")
    assert res.returncode != 0
    assert f"{CLUSTER}-worker-0 is declared with 2 GPU(s) but has 0 NVIDIA device(s)" in res.stdout, \
        res.stdout[-3000:]
    assert os.path.exists(cluster.inventory)
