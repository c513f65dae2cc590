"""The baked node image (tfcluster.baked) on the local provider, for real: the session's image (tests/conftest.py
node_image, baked by the same roles on one builder node) holds what the image roles install and no per-node
state; a cluster made from it mounts it read-only, its image roles change nothing, and it trains."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, needs_root
from tests.integration.helpers import force_down, leftovers, make, node_input, ssh
from tfcluster import baked
from tfcluster.config import resolve
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node
from tfcluster.providers.local import LocalProvider

pytestmark = [pytest.mark.integration, needs_root()]
CLUSTER = "tfcimg-imaged"
SUBNET = "10.231.248.0/24"   # outside the other tests' networks (the image builder uses 10.231.249.0/24)


def listing(layer: Path) -> str:
    """A digest of a layer's every path, size and mode: an image in use must not change."""
    digest = hashlib.sha256()
    for p in sorted(layer.rglob("*")):
        st = p.lstat()
        digest.update(f"{p.relative_to(layer)} {st.st_size} {st.st_mode:o}\n".encode())
    return digest.hexdigest()


def test_the_image_matches_the_configuration_and_holds_no_per_node_state(node_image):
    assert node_image["key"] == baked.local_inputs(resolve({}, {})).key
    layer = Path(node_image["dir"]) / "layer"
    meta = json.loads((Path(node_image["dir"]) / "image.json").read_text())
    assert meta["kind"] == baked.KIND and meta["key"] == node_image["key"]
    # what the image roles installed is in it
    for path in ("opt/tfcluster/venv/bin/python", "usr/sbin/nft", "usr/lib/python3.11/ensurepip"):
        assert (layer / path).exists(), path
    # so is tf_node's standing part: the supervisor, the task's user and its (empty) directories
    assert (layer / "usr/local/bin/tfc-supervise").stat().st_mode & 0o111
    assert re.search(r"^tfcluster:.*:/var/lib/tfcluster/task:/usr/sbin/nologin$", (layer / "etc/passwd").read_text(),
                     re.M)
    for directory in ("var/lib/tfcluster/task", "opt/tfcluster/run", "etc/tfcluster", "opt/tfcluster/harness/models"):
        assert (layer / directory).is_dir(), directory
    # and nothing that belongs to one node or one run
    per_node = [p.relative_to(layer).as_posix() for p in layer.rglob("*")
                if re.search(r"(^etc/ssh/.*(host.*key|sshd_config)|/\.ssh(/|$)|^etc/(hostname|hosts|machine-id)$|"
                             r"^var/lib/tfcluster/(configured|task/.)|^opt/tfcluster/run/.|^etc/tfcluster/.|"
                             r"^var/log/.|^tmp/.|\.ansible(/|$)|tfcluster-proxy)",
                             p.relative_to(layer).as_posix())]
    assert per_node == [], per_node


@pytest.fixture(scope="module")
def imaged(tmp_path_factory, node_image):
    home = tmp_path_factory.mktemp("imaged") / "state"
    home.mkdir()
    config = home.parent / "cluster.yml"
    config.write_text(f"network: {{subnet: {SUBNET}}}\n")
    layer = Path(node_image["dir"]) / "layer"
    before = listing(layer)
    started = time.monotonic()
    res = make("up", home, CLUSTER=CLUSTER, WORKERS="1", CONFIG=str(config), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "baking image" not in res.stdout     # the session's image is there: up does not bake again
    print(f"up on the image: {time.monotonic() - started:.1f}s")
    yield home, config, layer
    force_down(home, CLUSTER)
    assert leftovers(home, CLUSTER) == []
    assert listing(layer) == before    # the image in use was never altered


def test_nodes_mount_the_image_and_its_roles_change_nothing(imaged):
    home, _, layer = imaged
    nodes = json.loads((home / CLUSTER / "nodes.json").read_text())
    for n in nodes:
        assert node_input(home, CLUSTER, n["name"])["image_layer"] == str(layer)
        out = ssh(home, CLUSTER, n["private_ip"], "/opt/tfcluster/venv/bin/python -c 'import sys; print(sys.prefix)'"
                  "; hostname; cat /etc/ssh/tfcluster_host_ed25519_key.pub", as_root=True)
        assert out.returncode == 0, out.stderr
        prefix, hostname, key = out.stdout.splitlines()
        assert prefix == "/opt/tfcluster/venv" and hostname == n["name"] and key.endswith(n["name"])
    # the image roles, as configure and the builder run them (the wheelhouse served on the bridge)
    spec = resolve({"network": {"subnet": SUBNET}}, {"cluster": CLUSTER, "nodes.worker.count": 1})
    state = ClusterState(CLUSTER, root=home)
    started = time.monotonic()
    recap = baked.apply_roles(spec, state, [Node.from_dict(n) for n in nodes],
                              LocalProvider(state).wheelhouse_host(spec), log=print)
    changed = {host: r["changed"] for host, r in recap.items() if host != "localhost"}
    assert changed == {n["name"]: 0 for n in nodes}, recap
    print(f"image roles on 3 imaged nodes: {time.monotonic() - started:.1f}s, changed {changed}")


def _configure(home, config, *args):
    env = dict(os.environ, TFCLUSTER_HOME=str(home), PYTHONUNBUFFERED="1")
    return subprocess.run([PYTHON, "-m", "tfcluster", "configure", "--config", str(config), "--cluster", CLUSTER,
                           "--workers", "1", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_configure_only_checks_imaged_nodes_and_training_works(imaged, tmp_path):
    home, config, _ = imaged
    # every node's image holds this configuration: configure reads each node's image key and runs no playbook
    res = _configure(home, config)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "every node is configured with this content already (its image holds it" in res.stdout, res.stdout
    assert "PLAY RECAP" not in res.stdout and not (home / CLUSTER / "logs" / "configure.log").exists()
    # site.yml itself, asked for, only checks: the image roles' play matches no node, and nothing changes
    res = _configure(home, config, "--full")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recap = re.findall(rf"^\s*({CLUSTER}-\S+)\s+: ok=\d+\s+changed=(\d+)", res.stdout, re.M)
    assert sorted(recap) == sorted((n, "0") for n in (f"{CLUSTER}-ps-0", f"{CLUSTER}-worker-0", f"{CLUSTER}-chief-0"))
    log = (home / CLUSTER / "logs" / "configure.log").read_text()
    section = log.split("PLAY [Install what the node's image lacks")[-1].split("PLAY [")[0]
    assert "skipping: no hosts matched" in section, section
    assert "TASK [common :" not in log and "TASK [tensorflow :" not in log and "TASK [tf_node" not in log

    started = time.monotonic()
    res = make("train", home, CLUSTER=CLUSTER, WORKERS="1", CONFIG=str(config), STEPS="60",
               env={"TFCLUSTER_ARTIFACTS": str(tmp_path)}, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    print(f"train on the image: {time.monotonic() - started:.1f}s")
    assert "every node is configured with this content already" in res.stdout, res.stdout[-3000:]
    # the run's part came with its start: the harness bundle, copied to every node once
    log = (home / CLUSTER / "logs" / "train.log").read_text()
    section = log.split("TASK [tf_node : Copy the harness bundle")[-1].split("TASK [")[0]
    assert len(re.findall(r"^changed: \[", section, re.M)) == 3, section
    assert "model verified" in res.stdout
    run = json.loads((home / CLUSTER / "run.json").read_text())
    assert run["state"] == "verified", run
