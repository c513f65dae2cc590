"""The baked image's content key (tfcluster.baked): what changes it and what does not; its per-node scrub."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from tfcluster import baked
from tfcluster.config import resolve


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the roles and of the image playbook to edit."""
    shutil.copytree(REPO / "roles", tmp_path / "roles")
    (tmp_path / "playbooks").mkdir()
    shutil.copy(REPO / "playbooks" / baked.PLAYBOOK, tmp_path / "playbooks")
    return tmp_path / "roles", tmp_path / "playbooks" / baked.PLAYBOOK


def key(tree, overrides: dict | None = None, base: str = "b1", gpus: int = 0) -> str:
    roles, playbook = tree
    return baked.inputs_for(resolve({}, overrides or {}), gpus, base, roles_dir=roles, playbook=playbook).key


def test_the_key_is_stable_and_ignores_what_the_image_does_not_hold(tree):
    first = key(tree)
    assert key(tree) == first
    # per-node and per-run values, and the per-node role, are not in the image
    assert key(tree, {"training.steps": 7, "nodes.worker.count": 5, "cluster": "other", "strategy":
                      "multi_worker_mirrored"}) == first
    (tree[0] / "tf_node" / "defaults" / "main.yml").write_text("# changed\n")
    assert key(tree) == first
    # a lock of another release is not this image's
    other = tree[0] / "tensorflow" / "files" / "locks" / "tensorflow-cpu-2.20.0.txt"
    other.write_text(other.read_text() + "# changed\n")
    assert key(tree) == first


@pytest.mark.parametrize("role_file", ["common/tasks/main.yml", "common/defaults/main.yml",
                                       "gpu_driver/vars/Debian.yml", "tensorflow/vars/main.yml",
                                       "tensorflow/tasks/preflight.yml"])
def test_a_changed_role_file_makes_a_new_key(tree, role_file):
    first = key(tree)
    path = tree[0] / role_file
    path.write_text(path.read_text() + "\n# changed\n")
    assert key(tree) != first


def test_a_new_role_file_and_a_changed_playbook_make_a_new_key(tree):
    first = key(tree)
    (tree[0] / "common" / "templates").mkdir()
    (tree[0] / "common" / "templates" / "x.j2").write_text("x\n")
    second = key(tree)
    assert second != first
    tree[1].write_text(tree[1].read_text() + "\n# changed\n")
    assert key(tree) not in (first, second)


def test_the_image_lock_the_version_the_gpus_and_the_base_change_the_key(tree):
    first = key(tree)
    lock = tree[0] / "tensorflow" / "files" / "locks" / "tensorflow-cpu-2.21.0.txt"
    lock.write_text(lock.read_text() + "# changed\n")
    after_lock = key(tree)
    assert after_lock != first
    keys = {after_lock, key(tree, {"tensorflow.version": "2.20.0"}), key(tree, gpus=1), key(tree, base="b2")}
    assert len(keys) == 4


def test_the_default_inputs_name_the_image_by_version():
    inputs = baked.local_inputs(resolve({}, {}))
    assert inputs.full_name == f"tf-{inputs.tensorflow_version}-cpu-{inputs.key}"
    assert len(inputs.key) == 12


def test_scrub_removes_per_node_state_and_keeps_the_rest(tmp_path: Path):
    root = tmp_path / "layer"
    files = ["etc/ssh/tfcluster_host_ed25519_key", "etc/ssh/tfcluster_host_ed25519_key.pub",
             "etc/ssh/ssh_host_rsa_key", "etc/ssh/tfcluster_sshd_config", "home/debian/.ssh/authorized_keys",
             "etc/hostname", "etc/hosts", "etc/machine-id", "etc/apt/apt.conf.d/01tfcluster-proxy",
             "var/log/apt/history.log", "var/log/dpkg.log", "var/lib/tfcluster/run.json", "tmp/x",
             "root/.ansible/tmp/y", "var/cache/apt/archives/a.deb"]
    kept = ["opt/tfcluster/venv/bin/python", "etc/ssh/ssh_config", "usr/sbin/nft", "var/lib/dpkg/status",
            "var/lib/apt/lists/deb.debian.org_x"]
    for rel in files + kept:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    removed = baked.scrub(root)
    assert not [f for f in files if (root / f).exists()]
    assert all((root / k).exists() for k in kept)
    assert (root / "var" / "lib" / "tfcluster").is_dir()
    assert "etc/hostname" in removed
