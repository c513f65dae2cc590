"""`make up` / `make down` on the local provider, for real: namespaces, sshd, Ansible, S3 endpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, interruptible, needs_root
from tests.integration.helpers import force_down, leftovers, make, ssh
from tfcluster import ansible_run, localnode, store
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
    assert "all 4 nodes answer over SSH" in res.stdout

    state = ClusterState(cluster, root=home)
    nodes = json.loads(state.nodes.read_text())
    assert sorted(n["role"] for n in nodes) == ["chief", "ps", "worker", "worker"]
    assert oct(state.ssh_key.stat().st_mode & 0o777) == "0o600"

    # up's first contact recorded each node's host key; Ansible reaches every node through the generated
    # inventory, under mitogen's strategy too (it checks host keys strictly: it finds them there)
    assert len(state.known_hosts.read_text().splitlines()) >= 4
    os.environ["TFCLUSTER_HOME"] = str(home)
    try:
        for mitogen in (False, True):
            ping = subprocess.run([str(ansible_run.BIN / "ansible"), "all", "-i", str(state.inventory), "-m",
                                   "ansible.builtin.ping", "-o"], capture_output=True, text=True, timeout=120,
                                  env=ansible_run.environment(state, mitogen=mitogen), stdin=subprocess.DEVNULL)
            assert ping.returncode == 0 and ping.stdout.count("SUCCESS") == 4, ping.stdout + ping.stderr
    finally:
        os.environ.pop("TFCLUSTER_HOME")

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


LISTENER = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('0.0.0.0', 2222)); s.listen(); s.settimeout(60); print('listening', flush=True)\n"
            "while True:\n    c, a = s.accept(); c.sendall(b'ok'); c.close()")


def _connect(ip: str, port: int) -> str:
    code = (f"import socket\ntry:\n    c = socket.create_connection(('{ip}', {port}), timeout=5); "
            "print('open', c.recv(2).decode() or '-')\nexcept OSError as e:\n    print('closed', type(e).__name__)")
    return code


def test_a_node_cannot_reach_the_host_and_its_tf_port_answers_members_only(home, cluster):
    """What the local provider isolates (README): its own PID namespace and /dev, no capability to mount or
    make devices, and the TensorFlow port closed to everyone but the cluster's members."""
    res = make("up", home, CLUSTER=cluster, WORKERS="1", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    nodes = {n["role"]: n for n in json.loads(ClusterState(cluster, root=home).nodes.read_text())}
    chief, worker = nodes["chief"]["private_ip"], nodes["worker"]["private_ip"]
    key = ClusterState(cluster, root=home).ssh_key

    # The PID namespace: the node's first process is its sshd, /proc shows the node's processes only, and no
    # /proc/<pid>/root leads out of the node (to the host's files, such as this cluster's private key).
    out = ssh(home, cluster, chief, f"cat /proc/1/comm; cat /proc/1/root/etc/hostname; ls /proc | grep -c '^[0-9]'; "
                                    f"ls /proc/*/root{key} 2>/dev/null | wc -l")
    assert out.returncode == 0, out.stderr
    comm, hostname, processes, keys = out.stdout.split()
    assert (comm, hostname, keys) == ("sshd", nodes["chief"]["name"], "0")
    assert int(processes) < 20, out.stdout
    host_pids = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]
    assert len(host_pids) > int(processes)

    # Its own /dev: a few character devices and its own ptys; no disk, memory or kernel log device.
    out = ssh(home, cluster, chief, "ls -A /dev")
    assert set(out.stdout.split()) == {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm",
                                       "fd", "stdin", "stdout", "stderr"}, out.stdout

    # Root on the node cannot mount, make a device node or use the capabilities dropped at boot.
    out = ssh(home, cluster, chief, "mount -t tmpfs none /mnt 2>&1 || echo mount-refused; "
                                    "mknod /tmp/sda b 8 0 2>&1 || echo mknod-refused; grep CapBnd /proc/self/status")
    assert "mount-refused" in out.stdout and "mknod-refused" in out.stdout, out.stdout
    bounding = int(out.stdout.split("CapBnd:")[1].split()[0], 16)
    for bit, name in ((21, "sys_admin"), (16, "sys_module"), (17, "sys_rawio"), (19, "sys_ptrace"), (27, "mknod"),
                      (25, "sys_time")):
        assert not bounding & (1 << bit), f"{name} is in the node's bounding set"

    # The TensorFlow port: a listener on the chief answers the worker, not the host (any local user): the
    # host's own guard, out of the nodes' reach (the node's firewall comes with a run's start).
    guard = subprocess.run(["nft", "list", "table", "inet", localnode.guard_table(localnode.bridge_name(cluster))],
                           capture_output=True, text=True)
    assert "tcp dport 2222 reject with tcp reset" in guard.stdout, guard.stdout + guard.stderr
    listen = subprocess.Popen(
        ["ssh", "-i", str(key), "-o", f"UserKnownHostsFile={key.parent / 'known_hosts'}", "-o", "BatchMode=yes",
         "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
         f"debian@{chief}", f"timeout 60 python3 -c \"{LISTENER}\""],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = listen.stdout.readline().strip()       # it listens before the probes (a slow login took > 2 s)
        assert ready == "listening", ready + listen.stdout.read()
        from_member = ssh(home, cluster, worker, f"python3 -c \"{_connect(chief, 2222)}\"", as_root=False)
        assert from_member.stdout.strip() == "open ok", from_member.stdout + from_member.stderr
        from_host = subprocess.run([PYTHON, "-c", _connect(chief, 2222)], capture_output=True, text=True, timeout=30)
        assert from_host.stdout.strip() == "closed ConnectionRefusedError", from_host.stdout + from_host.stderr
        ssh_port = subprocess.run([PYTHON, "-c", _connect(chief, 22)], capture_output=True, text=True, timeout=30)
        assert ssh_port.stdout.strip() == "open SS", ssh_port.stdout   # SSH still answers the controller
    finally:
        listen.kill()
        listen.wait(timeout=30)
