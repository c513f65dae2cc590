"""Helpers for tests that make real local clusters: make targets, SSH into nodes, leftover checks."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import REPO
from tfcluster import cgroup, localnode
from tfcluster.image import IMAGE_USER


def make(target: str, home: Path, timeout: int = 900, env: dict | None = None,
         **knobs: str) -> subprocess.CompletedProcess:
    args = ["make", "--no-print-directory", "-C", str(REPO), *target.split()] + [f"{k}={v}" for k, v in knobs.items()]
    full_env = dict(os.environ, TFCLUSTER_HOME=str(home), PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=timeout)


def ssh_argv(home: Path, cluster: str, ip: str, command: str, as_root: bool = True,
             user: str = IMAGE_USER) -> list[str]:
    """The ssh command line that runs a shell command on a local node (see :func:`ssh`)."""
    ssh_dir = home / cluster / "ssh"
    if as_root:
        command = f"sudo -n sh -c {shlex.quote(command)}"
    return ["ssh", "-i", str(ssh_dir / "id_ed25519"), "-o", f"UserKnownHostsFile={ssh_dir / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            f"{user}@{ip}", command]


def ssh(home: Path, cluster: str, ip: str, command: str, timeout: int = 30, as_root: bool = True,
        user: str = IMAGE_USER) -> subprocess.CompletedProcess:
    """Run a shell command on a local node, logged in as the base image's user; with root's rights
    (through sudo, as on a cloud VM) unless as_root is False."""
    return subprocess.run(ssh_argv(home, cluster, ip, command, as_root, user), capture_output=True, text=True,
                          timeout=timeout)


@contextmanager
def outside_namespace(ns: str, veth: str, net: str, route: str) -> Iterator[Callable[[str], str]]:
    """A namespace outside every cluster, linked to this host by a veth pair on the /30 `net` (host .1,
    namespace .2), with `route` through the host; yields a function that runs Python code there and
    returns what it printed. Removed on exit, also after a failure."""
    host_ip, ns_ip = (str(a) for a in ipaddress.ip_network(net).hosts())
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "p"], check=True)
        subprocess.run(["ip", "link", "set", veth + "p", "netns", ns], check=True)
        subprocess.run(["ip", "addr", "add", f"{host_ip}/30", "dev", veth], check=True)
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
        for cmd in (["addr", "add", f"{ns_ip}/30", "dev", veth + "p"], ["link", "set", veth + "p", "up"],
                    ["route", "add", route, "via", host_ip]):
            subprocess.run(["ip", "-n", ns, *cmd], check=True)

        def run(code: str) -> str:
            res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True,
                                 text=True, timeout=30)
            return res.stdout + res.stderr

        yield run
    finally:
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def node_input(home: Path, cluster: str, node: str) -> dict:
    """The inputs terraform/local recorded for a node (its namespace, veth, address ...), from the state."""
    tfstate = json.loads((home / cluster / "terraform" / "terraform.tfstate").read_text())
    for res in tfstate["resources"]:
        if res["type"] == "terraform_data" and res["name"] == "node":
            for inst in res["instances"]:
                if inst["index_key"] == node:
                    return inst["attributes"]["input"]["value"]
    raise KeyError(f"no node {node} in the Terraform state of {cluster}")


def processes_with_cmdline(*markers: str) -> list[int]:
    """PIDs whose command line mentions every marker (the apt proxy carries its cluster's state dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if all(m.encode() in cmdline for m in markers):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def processes_with_env(marker: str) -> list[int]:
    """PIDs whose environment mentions marker (node processes carry TFC_DIR=<state dir>/...)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def leftovers(home: Path, cluster: str) -> list[str]:
    """Everything of a local cluster still on this machine."""
    found = [f"netns {ns}" for ns in localnode.list_netns() if ns.startswith(localnode.netns_prefix(cluster))]
    if localnode.link_exists(localnode.bridge_name(cluster)):
        found.append("bridge")
    if localnode.guard_exists(localnode.bridge_name(cluster)):
        found.append("nftables table " + localnode.guard_table(localnode.bridge_name(cluster)))
    found += [f"veth {v}" for v in localnode.list_links(localnode.veth_prefix(cluster))]
    found += [f"process {p}" for p in processes_with_env(f"TFC_DIR={home / cluster}")]
    found += [f"apt proxy {p}" for p in processes_with_cmdline("tfcluster.aptproxy", str(home / cluster))]
    found += [f"memory cgroup {path}" for path in cgroup.leftovers(cluster)]
    for sub in ("nodes", "ssh", "terraform"):
        if (home / cluster / sub).exists():
            found.append(f"state {sub}/")
    from tfcluster.paths import ClusterState

    control_dir = ClusterState(cluster, root=home).control_dir
    if control_dir.exists():
        found.append(f"ssh control dir {control_dir}")
    # an SSH master (ControlPersist) names its socket in its process title: "ssh: <control dir>/<hash> [mux]"
    found += [f"ssh master {p}" for p in processes_with_cmdline(f"{control_dir}/")]
    return found


def force_down(home: Path, cluster: str) -> None:
    """Last-resort cleanup for a test that failed midway."""
    make("down", home, CLUSTER=cluster, FORCE="1", timeout=300)
    from tfcluster.paths import ClusterState
    from tfcluster.providers.local import LocalProvider

    LocalProvider(ClusterState(cluster, root=home)).force_cleanup()
