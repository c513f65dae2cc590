"""`make up` / `make down` on the local provider, for real: namespaces, sshd, Ansible, S3 endpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import PYTHON, REPO, interruptible, needs_root
from tests.integration.helpers import force_down, leftovers, make, ssh
from tfcluster import ansible_run, store
from tfcluster.paths import ClusterState

pytestmark = [pytest.mark.integration, needs_root()]


@pytest.fixture
def cluster(home):
    name = "tfct-up"
    yield name
    force_down(home, name)
    assert leftovers(home, name) == []


def test_up_ping_isolation_down_twice(home, cluster):
    res = make("up", home, CLUSTER=cluster, WORKERS="2", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ansible reaches all 4 nodes" in res.stdout

    state = ClusterState(cluster, root=home)
    nodes = json.loads(state.nodes.read_text())
    assert sorted(n["role"] for n in nodes) == ["chief", "ps", "worker", "worker"]
    assert oct(state.ssh_key.stat().st_mode & 0o777) == "0o600"

    # Ansible through the generated inventory (the CLI uses the same call)
    os.environ["TFCLUSTER_HOME"] = str(home)
    try:
        ping = ansible_run.ping(state)
    finally:
        os.environ.pop("TFCLUSTER_HOME")
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert ping.stdout.count("SUCCESS") == 4

    # each node: its own address and hostname, a private filesystem, the S3 endpoint reachable
    seen_ips = set()
    for n in nodes:
        out = ssh(home, cluster, n["private_ip"],
                  "hostname; hostname -I; "
                  f"echo {n['name']} > /etc/tfct-private; cat /etc/tfct-private; ls /etc/tfct-* | wc -l; "
                  f"python3 -c 'import urllib.request as u; print(u.urlopen(\"{store.local_endpoint()}\").status)'")
        assert out.returncode == 0, out.stderr
        hostname, addr, private, count, s3 = out.stdout.split()
        assert hostname == n["name"]
        assert addr == n["private_ip"]
        assert private == n["name"] and count == "1"
        assert s3 == "200"
        seen_ips.add(addr)
    assert len(seen_ips) == 4
    assert not os.path.exists("/etc/tfct-private"), "a node wrote to the host's filesystem"

    status = subprocess.run([PYTHON, "-m", "tfcluster", "status", "--cluster", cluster], cwd=REPO,
                            capture_output=True, text=True, env=dict(os.environ, TFCLUSTER_HOME=str(home)))
    assert status.returncode == 0 and status.stdout.count("ssh ok") == 4, status.stdout

    res = make("down", home, CLUSTER=cluster)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "is down: no node, namespace, bridge or node process remains" in res.stdout
    assert leftovers(home, cluster) == []
    assert store.is_running(), "the S3 store must outlive make down"
    res = make("down", home, CLUSTER=cluster)
    assert res.returncode == 0, res.stdout + res.stderr


def test_failure_midway_then_down_cleans_up(home, cluster):
    res = make("up", home, CLUSTER=cluster, WORKERS="3",
               env={"TFCLUSTER_FAULT_NODE_UP": f"{cluster}-worker-1:fail"}, timeout=300)
    assert res.returncode != 0
    assert f"{cluster}-worker-1" in res.stderr and "make down" in res.stderr
    assert leftovers(home, cluster), "the injected failure should leave a half-made cluster behind"
    res = make("down", home, CLUSTER=cluster)
    assert res.returncode == 0, res.stdout + res.stderr
    assert leftovers(home, cluster) == []


def test_interrupted_up_then_down_cleans_up(home, cluster):
    env = dict(os.environ, TFCLUSTER_HOME=str(home), TFCLUSTER_FAULT_NODE_UP=f"{cluster}-chief-0:nosshd")
    proc = subprocess.Popen([PYTHON, "-m", "tfcluster", "up", "--cluster", cluster], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=interruptible)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(ns.endswith("chief-0") for ns in _netns(cluster)):
        time.sleep(0.2)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)   # Ctrl-C while the chief waits for an sshd that never comes
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out
    res = make("down", home, CLUSTER=cluster)
    assert res.returncode == 0, res.stdout + res.stderr
    assert leftovers(home, cluster) == []


def _netns(cluster):
    from tfcluster import localnode

    return [ns for ns in localnode.list_netns() if ns.startswith(f"tfc_{cluster}_")]


def test_make_all_tears_down_after_ctrl_c(home, cluster):
    """`make all` interrupted (Ctrl-C while up waits for a node) still tears the cluster down."""
    env = dict(os.environ, TFCLUSTER_HOME=str(home), TFCLUSTER_FAULT_NODE_UP=f"{cluster}-worker-0:nosshd")
    proc = subprocess.Popen(["make", "--no-print-directory", "-C", str(REPO), "all", f"CLUSTER={cluster}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(ns.endswith("worker-0") for ns in _netns(cluster)):
        time.sleep(0.2)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0
    assert "interrupted; tearing the cluster down" in out, out[-3000:]
    assert f"cluster {cluster} is down" in out, out[-3000:]
    assert leftovers(home, cluster) == []


def test_node_without_sshd_fails_up_in_time_naming_it(home, cluster):
    """A node whose sshd never starts: `up` fails within the SSH timeout, naming the node; down cleans."""
    env = dict(os.environ, TFCLUSTER_HOME=str(home), TFCLUSTER_FAULT_NODE_UP=f"{cluster}-worker-1:nosshd")
    start = time.monotonic()
    res = subprocess.run([PYTHON, "-m", "tfcluster", "up", "--cluster", cluster, "--set", "ssh.timeout_seconds=5"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"node {cluster}-worker-1" in res.stderr and "did not come up" in res.stderr, res.stderr
    assert took < 60, took
    res = make("down", home, CLUSTER=cluster)
    assert res.returncode == 0, res.stdout + res.stderr
    assert leftovers(home, cluster) == []


def test_make_up_train_down_tears_down_when_a_goal_fails(home, cluster):
    """`make up train down`: Make stops at a failing goal, so the failing up or train tears down itself."""
    res = make("up train down", home, CLUSTER=cluster, WORKERS="1",
               env={"TFCLUSTER_FAULT_NODE_UP": f"{cluster}-worker-0:fail"}, timeout=300)
    assert res.returncode != 0 and "tearing down" in res.stdout, res.stdout + res.stderr
    assert leftovers(home, cluster) == []

    res = make("up", home, CLUSTER=cluster, WORKERS="1", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    # a train that cannot run on these nodes (another shape) fails at once, before configuring anything
    res = make("train down", home, CLUSTER=cluster, WORKERS="2", timeout=300)
    assert res.returncode != 0 and "up with another shape" in res.stderr, res.stdout + res.stderr
    assert "tearing down" in res.stdout and "is down" in res.stdout, res.stdout
    assert leftovers(home, cluster) == []
