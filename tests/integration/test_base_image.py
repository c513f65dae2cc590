"""Local nodes boot the bare base image, as a cloud VM boots a stock image: a non-root sudo user, no
package index, no venv support, nothing of the host; `common` installs what it needs through the
cluster's apt proxy, which serves the cluster's bridge only."""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, needs_root
from tests.integration.helpers import force_down, leftovers, make, node_input, outside_namespace, ssh
from tfcluster import ansible_run, baked
from tfcluster.config import resolve
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node
from tfcluster.providers.local import LocalProvider

pytestmark = [pytest.mark.integration, pytest.mark.bare_image, needs_root()]
CLUSTER = "tfct-img"
#: the cloud-like path: no baked node image (tfcluster.baked), whether one is built or not
BARE = "nodes: {ps: {image: base}, worker: {image: base}, chief: {image: base}}\n"
PLAYBOOK = Path(__file__).with_name("common.yml")
VENV_CHECK = "python3 -c 'import venv, ensurepip' && echo venv-ok"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("img") / "state"
    h.mkdir()
    bare = h.parent / "bare.yml"
    bare.write_text(BARE)
    res = make("up", h, CLUSTER=CLUSTER, WORKERS="1", CONFIG=str(bare), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    yield h
    force_down(h, CLUSTER)
    assert leftovers(h, CLUSTER) == []


@pytest.fixture(scope="module")
def nodes(home):
    return {n["name"]: n for n in json.loads((home / CLUSTER / "nodes.json").read_text())}


def on(home, nodes, node: str, command: str, as_root: bool = False) -> subprocess.CompletedProcess:
    return ssh(home, CLUSTER, nodes[f"{CLUSTER}-{node}"]["private_ip"], command, as_root=as_root)


def test_nodes_log_in_as_a_non_root_sudo_user_only(home, nodes):
    assert all(n["ssh_user"] == "debian" for n in nodes.values()), nodes
    res = on(home, nodes, "chief-0", "id -un; sudo -n id -u; . /etc/os-release; echo $VERSION_ID")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["debian", "0", "12"]
    root = ssh(home, CLUSTER, nodes[f"{CLUSTER}-chief-0"]["private_ip"], "true", as_root=False, user="root")
    assert root.returncode == 255 and "Permission denied" in root.stderr, root.stderr


def test_the_image_has_nothing_of_the_host(home, nodes):
    host_only = "make"
    assert shutil.which(host_only), f"this test needs a host that has {host_only}"
    res = on(home, nodes, "worker-0", f"command -v {host_only} || echo absent; "
                                      f"dpkg -s {host_only} >/dev/null 2>&1 || echo not-installed; "
                                      "ls /var/lib/apt/lists | grep -c _Packages || true")
    assert res.stdout.split() == ["absent", "not-installed", "0"], res.stdout + res.stderr


def test_common_installs_through_the_proxy_what_the_bare_image_lacks(home, nodes):
    before = on(home, nodes, "ps-0", VENV_CHECK)
    assert before.returncode != 0 and "ensurepip" in before.stderr, before.stdout + before.stderr

    state = ClusterState(CLUSTER, root=home)
    cmd = [str(ansible_run.BIN / "ansible-playbook"), "-i", str(state.inventory), str(PLAYBOOK)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ansible_run.environment(state), timeout=600)
    assert res.returncode == 0, res.stdout[-4000:]
    recap = re.findall(rf"^({CLUSTER}-\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", res.stdout, re.M)
    assert len(recap) == 3, res.stdout[-2000:]

    for node in nodes:
        after = ssh(home, CLUSTER, nodes[node]["private_ip"], VENV_CHECK, as_root=False)
        assert after.stdout.strip() == "venv-ok", after.stdout + after.stderr
    log = (home / CLUSTER / "logs" / "aptproxy.log").read_text()
    for n in nodes.values():   # every node fetched the archive's index through the proxy
        assert re.search(rf"^\S+ {re.escape(n['private_ip'])} \"GET http://deb\.debian\.org/debian/dists/bookworm/"
                         r"InRelease HTTP/1\.1\" 200", log, re.M), f"{n['name']} did not use the proxy"

    again = subprocess.run(cmd, capture_output=True, text=True, env=ansible_run.environment(state), timeout=600)
    assert again.returncode == 0, again.stdout[-3000:]
    changed = re.findall(rf"^{CLUSTER}-\S+\s+: ok=\d+\s+changed=(\d+)", again.stdout, re.M)
    assert changed == ["0", "0", "0"], again.stdout[-2000:]


def test_the_proxy_serves_the_bridge_only(home, nodes):
    gateway = nodes[f"{CLUSTER}-chief-0"]["private_ip"].rsplit(".", 1)[0] + ".1"
    listening = subprocess.run(["ss", "-Hltn", "src", f"{gateway}:3142"], capture_output=True, text=True).stdout
    bridge = node_input(home, CLUSTER, f"{CLUSTER}-chief-0")["bridge"]
    assert listening.split()[3] == f"{gateway}%{bridge}:3142", listening   # bound to the bridge device
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", 3142), timeout=2)

    # from a node: the archive only, nothing else through the proxy, and no way around it
    probe = ("import urllib.request as u, socket\n"
             f"o = u.build_opener(u.ProxyHandler({{'http': 'http://{gateway}:3142'}}))\n"
             "try:\n    o.open('http://example.org/', timeout=10)\nexcept u.HTTPError as e:\n    print(e.code)\n"
             "try:\n    socket.create_connection(('203.0.113.1', 80), timeout=3)\n"
             "except OSError as e:\n    print('direct', e.errno)\n")
    res = on(home, nodes, "worker-0", f"python3 -c \"{probe}\"")
    assert res.stdout.split() == ["403", "direct", "101"], res.stdout + res.stderr   # 101: ENETUNREACH

    # from a namespace outside the bridge, routed to the gateway address through this host: no answer
    with outside_namespace("tfct_img_out", "tfctimg0", "10.231.253.0/30", f"{gateway}/32") as run_outside:
        out = run_outside("import socket\ntry:\n"
                          f"    socket.create_connection(('{gateway}', 3142), timeout=3); print('open')\n"
                          "except OSError as e:\n    print('closed', e)\n")
    assert out.startswith("closed"), out


def test_task_status_is_read_through_sudo_and_never_empty_on_an_error(home, nodes):
    """Progress as a cloud image's non-root user: the task's state is root's (0750); tfcluster reads it
    through sudo, and a status it cannot read is an error naming the node, not an empty answer."""
    from tfcluster.providers.base import Node
    from tfcluster.remote import TASK_DIR, NodeCommandError
    from tfcluster.remote import task_status as node_task_status

    state = ClusterState(CLUSTER, root=home)
    chief = Node.from_dict(nodes[f"{CLUSTER}-chief-0"])
    with pytest.raises(NodeCommandError, match=f"{chief.name}: 'sudo -n /usr/local/bin/tfc-supervise status"):
        node_task_status(state, chief)   # answers, but the command is not there yet

    script = base64.b64encode((REPO / "roles" / "tf_node" / "files" / "tfc-supervise").read_bytes()).decode()
    finished = json.dumps({"state": "succeeded", "exit_code": 0})
    res = on(home, nodes, "chief-0", f"echo {script} | base64 -d > /usr/local/bin/tfc-supervise && "
                                     f"chmod 0755 /usr/local/bin/tfc-supervise && mkdir -p {TASK_DIR} && "
                                     f"chmod 0750 /var/lib/tfcluster {TASK_DIR} && "
                                     f"echo '{finished}' > {TASK_DIR}/supervisor.json", as_root=True)
    assert res.returncode == 0, res.stderr
    plain = on(home, nodes, "chief-0", f"/usr/local/bin/tfc-supervise status --dir {TASK_DIR}")
    assert plain.returncode == 3 and "cannot read" in plain.stderr and plain.stdout == "", plain
    assert node_task_status(state, chief)["supervisor"] == {"state": "succeeded", "exit_code": 0}


def test_the_image_roles_install_tensorflow_on_the_bare_nodes_then_change_nothing(home, nodes):
    """The cloud-like path of the image roles (what a builder node, or a bare cloud VM, goes through): TensorFlow
    installed from the wheelhouse served on the bridge and imported; a second run changes nothing."""
    spec = resolve({}, {"cluster": CLUSTER, "nodes.worker.count": 1})
    state = ClusterState(CLUSTER, root=home)
    # one of the three nodes, a training task's: each node installs TensorFlow itself (the same work on every
    # node, ~1 min of a core, the slowest part of the suite's bare-image path); the other two show the roles
    # go to the nodes given and no other. Several bare nodes installing at once from the served wheelhouse
    # is `make bench SCALE=1`'s bare-image run (4 nodes), not the suite's
    members = [Node.from_dict(nodes[f"{CLUSTER}-worker-0"])]
    host = LocalProvider(state).wheelhouse_host(spec)
    first = baked.apply_roles(spec, state, members, host, log=print)
    assert set(first) == {n.name for n in members}, first      # those nodes only, not the whole inventory
    assert all(first[n.name]["changed"] > 0 for n in members), first
    for node in (n.name for n in members):
        out = ssh(home, CLUSTER, nodes[node]["private_ip"], "cat /opt/tfcluster/venv/.tfcluster-verified")
        assert out.stdout.split()[0] == spec.tensorflow.version, out.stdout + out.stderr
    for other in ("ps-0", "chief-0"):                                           # the nodes not given got nothing
        res = on(home, nodes, other, "test -e /opt/tfcluster/venv/.tfcluster-verified && echo installed || echo none")
        assert res.stdout.strip() == "none", (other, res.stdout + res.stderr)
    again = baked.apply_roles(spec, state, members, host, log=print)
    assert {n.name: again[n.name]["changed"] for n in members} == {n.name: 0 for n in members}, again
