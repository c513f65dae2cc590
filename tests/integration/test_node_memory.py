"""provider_options.node_memory_mb on real local nodes: every process of a node is in its memory cgroup with
the limit, a process allocating beyond it is OOM-killed while the node's sshd lives on, another limit for the
cluster that is up is refused, and `down` removes the cgroups, also after an `up` that failed midway."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import needs_root, run_cli
from tests.integration.helpers import leftovers, node_input, ssh
from tfcluster import cgroup, localnode
from tfcluster.paths import ClusterState
from tfcluster.providers.local import LocalProvider

pytestmark = [pytest.mark.integration, needs_root(),
              pytest.mark.skipif(cgroup.hierarchy() is None, reason=cgroup.NO_CONTROLLER)]

CLUSTER = "tfcmem"  # no other test's name starts so
#: outside every auto subnet (10.231.10-249.0/24) and the other tests' networks (10.231.253-255.x)
SUBNET = "10.231.251.0/24"
LIMIT_MB = 256


@pytest.fixture
def cluster(home):
    """The cluster's name; whatever happens, nothing of it remains afterwards."""
    yield CLUSTER
    run_cli("down", "--cluster", CLUSTER, "--force", home=home, timeout=300)
    LocalProvider(ClusterState(CLUSTER, root=home)).force_cleanup()
    assert leftovers(home, CLUSTER) == []


def up(home: Path, *args: str, env: dict | None = None, memory_mb: int = LIMIT_MB):
    return run_cli("up", "--cluster", CLUSTER, "--set", f"network.subnet={SUBNET}",
                   "--set", f"provider_options.node_memory_mb={memory_mb}", *args, home=home, env=env, timeout=300)


def limits(directory: Path) -> dict[str, int]:
    names = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.max", "memory.swap.max")
    return {n: int((directory / n).read_text()) for n in names if (directory / n).exists()}


def oom_kills(directory: Path) -> int:
    events = directory / ("memory.events" if cgroup.hierarchy().version == 2 else "memory.oom_control")
    return int(re.search(r"^oom_kill (\d+)$", events.read_text(), re.M)[1])


def test_node_memory_limit_oom_and_down(home, cluster):
    res = up(home, "--workers", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    nodes = json.loads(ClusterState(cluster, root=home).nodes.read_text())
    worker = next(n for n in nodes if n["role"] == "worker")
    node = node_input(home, cluster, worker["name"])
    assert node["cgroup"] == f"tfcluster/{cluster}/{worker['name']}"
    directory = cgroup.hierarchy().root / node["cgroup"]
    assert set(limits(directory).values()) <= {LIMIT_MB << 20, 0}
    assert limits(directory).get("memory.limit_in_bytes", limits(directory).get("memory.max")) == LIMIT_MB << 20

    # every process of the node is in its cgroup, and so is what a login starts there (as on a VM)
    in_cgroup = {int(p) for p in (directory / "cgroup.procs").read_text().split()}
    assert set(localnode.netns_pids(node["netns"])) <= in_cgroup
    out = ssh(home, cluster, worker["private_ip"], "cat /proc/self/cgroup", as_root=False)
    assert out.returncode == 0, out.stderr
    assert re.search(rf"^\d+:(memory)?:/{re.escape(node['cgroup'])}$", out.stdout, re.M), out.stdout

    # beyond the limit: the allocating process is OOM-killed, the node (its sshd) lives on
    init_pid = int((Path(node["node_dir"]) / "init.pid").read_text())
    before = oom_kills(directory)
    out = ssh(home, cluster, worker["private_ip"],
              f"python3 -c 'b = b\"x\" * ({LIMIT_MB + 150} << 20); print(\"survived\")'; echo rc=$?",
              as_root=False, timeout=60)
    assert "rc=137" in out.stdout and "survived" not in out.stdout, out.stdout + out.stderr
    assert oom_kills(directory) > before
    os.kill(init_pid, 0)  # the node's first process (its sshd) is still there
    out = ssh(home, cluster, worker["private_ip"], "echo alive", as_root=False)
    assert out.stdout.strip() == "alive", out.stderr

    # the limit is the nodes' own from when they were made: another one is refused, and nothing changes
    res = up(home, "--workers", "1", memory_mb=2 * LIMIT_MB)
    assert res.returncode == 2 and "provider_options.node_memory_mb" in res.stderr and "make down" in res.stderr
    assert limits(directory).get("memory.limit_in_bytes", limits(directory).get("memory.max")) == LIMIT_MB << 20

    res = run_cli("down", "--cluster", cluster, home=home, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not directory.exists() and cgroup.leftovers(cluster) == []


def test_failed_up_leaves_cgroups_that_down_removes(home, cluster):
    env = {"TFCLUSTER_FAULT_NODE_UP": f"{cluster}-worker-0:nosshd"}
    res = up(home, "--workers", "1", "--set", "ssh.timeout_seconds=5", env=env)
    assert res.returncode == 1 and f"node {cluster}-worker-0" in res.stderr, res.stdout + res.stderr
    directory = cgroup.hierarchy().root / cgroup.cluster_path(cluster) / f"{cluster}-worker-0"
    assert (directory / "cgroup.procs").read_text().split(), "the half-made node's init is in its cgroup"
    res = run_cli("down", "--cluster", cluster, home=home, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert cgroup.leftovers(cluster) == [] and leftovers(home, cluster) == []
