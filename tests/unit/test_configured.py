"""Configure is skipped only when every node holds the digest of exactly what it would apply now, or runs an
image that holds it; and nothing of a run (the harness bundle with the user's model) is part of it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tfcluster import configured
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node

VARIABLES = {"tensorflow_version": "2.21.0", "tensorflow_source": "wheelhouse", "tfcluster_image_keys": {"worker": "k"}}


@pytest.fixture
def state(tmp_path, monkeypatch) -> ClusterState:
    """A cluster state with an inventory, and a copy of the roles and playbooks to edit."""
    for name in ("roles", "playbooks"):
        shutil.copytree(REPO / name, tmp_path / "repo" / name)
    shutil.copy(REPO / "ansible.cfg", tmp_path / "repo")
    monkeypatch.setattr(configured, "REPO", tmp_path / "repo")
    monkeypatch.setattr(configured, "ROLES_DIR", tmp_path / "repo" / "roles")
    monkeypatch.setattr(configured, "PLAYBOOKS_DIR", tmp_path / "repo" / "playbooks")
    monkeypatch.setattr(configured, "ANSIBLE_CFG", tmp_path / "repo" / "ansible.cfg")
    st = ClusterState("c", root=tmp_path / "state")
    st.dir.mkdir(parents=True)
    st.inventory.write_text("all: {hosts: {c-chief-0: {ansible_host: 10.0.0.10}}}\n")
    return st


def test_the_digest_covers_roles_playbooks_variables_and_inventory(state, tmp_path):
    first = configured.digest(state, VARIABLES)
    assert configured.digest(state, dict(VARIABLES)) == first
    # the wheelhouse's address changes per configure and changes nothing on a node
    assert configured.digest(state, dict(VARIABLES, tensorflow_wheelhouse_url="http://10.0.0.1:41234/")) == first
    changes = [
        lambda: (tmp_path / "repo/roles/tf_node/templates/firewall.nft.j2").write_text("# changed\n"),
        lambda: (tmp_path / "repo/roles/common/files/new.txt").write_text("new\n"),
        lambda: (tmp_path / "repo/playbooks/site.yml").write_text("# changed\n"),
        lambda: (tmp_path / "repo/ansible.cfg").write_text("# changed\n"),
        lambda: state.inventory.write_text("all: {hosts: {c-chief-0: {ansible_host: 10.0.0.11}}}\n"),
    ]
    seen = {first}
    for change in changes:
        (tmp_path / "repo/roles/common/files").mkdir(exist_ok=True)
        change()
        now = configured.digest(state, VARIABLES)
        assert now not in seen
        seen.add(now)
    for key, value in (("tensorflow_version", "2.20.0"), ("tensorflow_source", "index"),
                       ("tfcluster_image_keys", {"worker": "other"})):
        assert configured.digest(state, dict(VARIABLES, **{key: value})) not in seen


def _nodes(n: int) -> list[Node]:
    return [Node(f"c-worker-{i}", "worker", i, f"10.0.0.{10 + i}", f"10.0.0.{10 + i}", "debian", 22, 0)
            for i in range(n)]


@pytest.mark.parametrize("answers, current", [
    ({"c-worker-0": ("d1", ""), "c-worker-1": ("d1", ""), "c-worker-2": ("d1", "")}, True),
    ({"c-worker-0": ("d1", ""), "c-worker-1": ("d0", ""), "c-worker-2": ("d1", "")}, False),  # other content
    ({"c-worker-0": ("d1", ""), "c-worker-1": ("", ""), "c-worker-2": ("d1", "")}, False),    # no stamp, bare
    ({"c-worker-0": ("d1", ""), "c-worker-1": ("d1", ""), "c-worker-2": "down"}, False),      # does not answer
    ({"c-worker-0": ("", "k1"), "c-worker-1": ("", "k1"), "c-worker-2": ("d0", "k1")}, True),  # current images
    ({"c-worker-0": ("", "k1"), "c-worker-1": ("", "k0"), "c-worker-2": ("d1", "k0")}, False),  # an older image
])
def test_up_to_date_only_when_every_node_holds_the_digest_or_a_current_image(state, monkeypatch, answers,
                                                                            current):
    """The check runs the real shell command (here, in a directory standing for the node's root)."""
    def fake_run(_state, node, command, timeout, root=True):
        assert root is False   # the stamp and the image key are 0644: read without sudo
        answer = answers[node.name]
        if answer == "down":
            return None
        node_root = state.dir / node.name
        for path, text in zip((configured.STAMP, configured.baked.KEY_FILE), answer, strict=True):
            if text:
                (node_root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                (node_root / path.lstrip("/")).write_text(text + "\n")
        local = command.replace(configured.STAMP, str(node_root) + configured.STAMP).replace(
            configured.baked.KEY_FILE, str(node_root) + configured.baked.KEY_FILE)
        return subprocess.run(["sh", "-c", local], capture_output=True, text=True, timeout=timeout)

    monkeypatch.setattr(configured.remote, "run", fake_run)
    assert configured.up_to_date(state, _nodes(3), "d1", {"worker": "k1"}) is current
    assert configured.up_to_date(state, [], "d1", {"worker": "k1"}) is False


def test_a_current_image_counts_only_for_the_role_it_is_keyed_for(state, monkeypatch):
    monkeypatch.setattr(configured, "read_stamps", lambda _s, nodes: {n.name: ("", "k1") for n in nodes})
    assert configured.up_to_date(state, _nodes(2), "d1", {"worker": "k1"}) is True
    assert configured.up_to_date(state, _nodes(2), "d1", {"chief": "k1"}) is False
    assert configured.up_to_date(state, _nodes(2), "d1", {}) is False      # a provider without images


def test_site_yml_stamps_only_the_nodes_it_applied_the_roles_to_and_only_with_a_digest():
    import yaml

    play = next(p for p in yaml.safe_load((REPO / "playbooks" / "site.yml").read_text()) if "post_tasks" in p)
    # only where the roles were applied: a node whose image is current gets none of them, and no stamp
    assert play["hosts"] == "tfcluster_image_roles"
    stamp = play["post_tasks"][0]
    assert stamp["ansible.builtin.copy"]["dest"] == configured.STAMP
    assert "tfcluster_configure_digest" in stamp["ansible.builtin.copy"]["content"]
    assert stamp["when"] == "tfcluster_configure_digest | default('') | length > 0"
