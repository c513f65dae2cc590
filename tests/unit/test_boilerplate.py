"""playbooks/boilerplate.yml checks the inventory against the strategy's shape (stated once, in the harness)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tfcluster import inventory
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node


def nodes(ps: int, workers: int, chiefs: int) -> list[Node]:
    out, pos = [], 0
    for role, count in (("ps", ps), ("worker", workers), ("chief", chiefs)):
        for i in range(count):
            out.append(Node(f"c-{role}-{i}", role, i, f"10.0.0.{10 + pos}", f"10.0.0.{10 + pos}", "debian", 22, 0))
            pos += 1
    return out


def play(tmp_path: Path, shape: tuple[int, int, int], strategy: str = "parameter_server",
         change=None) -> subprocess.CompletedProcess:
    state = ClusterState("c", root=tmp_path)
    state.dir.mkdir()
    inventory.write(state, nodes(*shape), 2222, strategy)
    inv = yaml.safe_load(state.inventory.read_text())
    inv["all"]["vars"]["ansible_connection"] = "local"   # the checks run on the controller only
    if change:
        change(inv)
    state.inventory.write_text(yaml.safe_dump(inv))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_FORCE_COLOR="0")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(state.inventory),
           str(REPO / "playbooks" / "boilerplate.yml")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                          timeout=120)


def test_a_cluster_of_the_strategys_shape_passes(tmp_path):
    res = play(tmp_path, (1, 2, 1))
    assert res.returncode == 0, res.stdout[-3000:]


def test_a_cluster_without_ps_passes_under_multi_worker_mirrored(tmp_path):
    res = play(tmp_path, (0, 2, 1), "multi_worker_mirrored")
    assert res.returncode == 0, res.stdout[-3000:]
    inv = yaml.safe_load(ClusterState("c", root=tmp_path).inventory.read_text())
    assert inv["all"]["children"]["ps"] == {"hosts": {}}
    assert set(inv["all"]["vars"]["tf_cluster_spec"]) == {"worker", "chief"}
    assert inv["all"]["vars"]["tf_strategy_shape"] == {"worker": [1, None], "chief": [1, 1]}


@pytest.mark.parametrize(("shape", "said"), [
    ((0, 2, 1), "strategy parameter_server needs ps nodes in 1..any; the inventory has []"),
    ((1, 2, 2), "strategy parameter_server needs chief nodes in 1..1; the inventory has ['c-chief-0', 'c-chief-1']"),
])
def test_a_cluster_of_another_shape_fails_naming_the_role(tmp_path, shape, said):
    res = play(tmp_path, shape)
    assert res.returncode != 0
    assert said in " ".join(res.stdout.split()), res.stdout[-3000:]


def _host(inv: dict, group: str, name: str) -> dict:
    return inv["all"]["children"][group]["hosts"][name]


@pytest.mark.parametrize(("change", "said"), [
    (lambda inv: _host(inv, "worker", "c-worker-1").update(tf_index=5),
     "c-worker-1: tf_role=worker tf_index=5 is not a task of"),
    (lambda inv: _host(inv, "worker", "c-worker-0").update(tf_role="chief"),
     "c-worker-0: tf_role=chief tf_index=0 is not a task of"),
    (lambda inv: _host(inv, "ps", "c-ps-0").pop("tf_role"),
     "c-ps-0: tf_role=undefined tf_index=0 is not a task of"),
])
def test_a_node_whose_role_or_index_is_not_a_task_of_the_cluster_fails_naming_it(tmp_path, change, said):
    """One check on the controller for every node (not a task per node), naming the node that is wrong."""
    res = play(tmp_path, (1, 2, 1), change=change)
    assert res.returncode != 0
    assert said in " ".join(res.stdout.split()), res.stdout[-3000:]
