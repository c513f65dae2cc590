"""The baked image's content key (tfcluster.baked): what changes it and what does not; its per-node scrub."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tfcluster import baked
from tfcluster.config import resolve
from tfcluster.errors import EXIT_USAGE
from tfcluster.paths import ClusterState
from tfcluster.providers.local import LocalProvider


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
    (tree[0] / "tf_node" / "tasks" / "main.yml").write_text("# changed\n")
    assert key(tree) == first
    # a lock of another release is not this image's
    other = tree[0] / "tensorflow" / "files" / "locks" / "tensorflow-cpu-2.20.0.txt"
    other.write_text(other.read_text() + "# changed\n")
    assert key(tree) == first


@pytest.mark.parametrize("role_file", ["common/tasks/main.yml", "common/defaults/main.yml",
                                       "gpu_driver/vars/Debian.yml", "tensorflow/vars/main.yml",
                                       "tensorflow/tasks/preflight.yml", *baked.IMAGE_ROLE_PARTS])
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
             "var/log/apt/history.log", "var/log/dpkg.log", "var/lib/tfcluster/configured", "tmp/x",
             "var/lib/tfcluster/task/status.json", "opt/tfcluster/run/entry.py", "etc/tfcluster/task.env",
             "etc/tfcluster/firewall.nft", "opt/tfcluster/harness.tar.gz", "opt/tfcluster/harness/.bundle-ab12",
             "root/.ansible/tmp/y", "var/cache/apt/archives/a.deb"]
    kept = ["opt/tfcluster/venv/bin/python", "etc/ssh/ssh_config", "usr/sbin/nft", "var/lib/dpkg/status",
            "var/lib/apt/lists/deb.debian.org_x", "usr/local/bin/tfc-supervise"]
    for rel in files + kept:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    removed = baked.scrub(root)
    assert not [f for f in files if (root / f).exists()]
    assert all((root / k).exists() for k in kept)
    # tf_node's standing part stays: the task's state, run and credentials directories (emptied)
    for directory in ("var/lib/tfcluster/task", "opt/tfcluster/run", "etc/tfcluster", "opt/tfcluster/harness"):
        assert (root / directory).is_dir(), directory
    assert "etc/hostname" in removed


# -- which image a local cluster's nodes mount ----------------------------------------------------------------
def _fake_image(images: Path, name: str, key: str, built: float) -> Path:
    d = images / name
    (d / "layer").mkdir(parents=True)
    (d / "image.json").write_text(json.dumps({"kind": baked.KIND, "name": name, "key": key, "built": built}))
    return d


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TFCLUSTER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "_images"


def test_up_mounts_the_newest_image_of_the_matching_key(cache, tmp_path):
    spec = resolve({}, {"cluster": "tfcimg-pick"})
    provider = LocalProvider(ClusterState(spec.cluster, root=tmp_path / "state"))
    assert provider.layers(spec) == {"ps": "", "worker": "", "chief": ""}   # none built: the bare base image
    key_now = baked.local_inputs(spec).key
    _fake_image(cache, f"tf-2.21.0-cpu-{key_now}", key_now, built=100)
    newest = _fake_image(cache, "tf-2.21.0-cpu-rebuilt", key_now, built=200)
    _fake_image(cache, "tf-2.21.0-cpu-0123456789ab", "0123456789ab", built=300)   # newer, another key
    assert provider.layers(spec) == {r: str(newest / "layer") for r in ("ps", "worker", "chief")}
    # 'base' keeps a role on the bare base image; a built image's name selects it, whatever its key
    chosen = resolve({}, {"cluster": "tfcimg-pick", "nodes.ps.image": "base",
                          "nodes.worker.image": "tf-2.21.0-cpu-0123456789ab"})
    assert provider.layers(chosen) == {"ps": "", "worker": str(cache / "tf-2.21.0-cpu-0123456789ab" / "layer"),
                                       "chief": str(newest / "layer")}


def test_a_bad_image_value_is_refused_naming_the_field_and_what_is_allowed(cache, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    _fake_image(cache, "tf-2.21.0-cpu-0123456789ab", "0123456789ab", built=1)
    for command in ("up", "plan"):
        res = run_cli(command, "--cluster", "tfcimg-bad", "--set", "nodes.worker.image=tf-9", home=home,
                      env={"TFCLUSTER_CACHE": str(cache.parent)})
        assert res.returncode == EXIT_USAGE, res.stdout + res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
        for part in ("nodes.worker.image", "tf-9", "'base'", "tf-2.21.0-cpu-0123456789ab"):
            assert part in lines[0], lines[0]
    assert list(home.iterdir()) == []   # nothing created


# -- configure on an imaged node: the image roles are skipped where the image holds them ----------------------
def _site_plays() -> dict:
    """site.yml's plays by name (the boilerplate import left out)."""
    import yaml

    return {p["name"]: p for p in yaml.safe_load((REPO / "playbooks" / "site.yml").read_text()) if "hosts" in p}


SORT_PLAY = "Sort the nodes by what their image holds"
IMAGE_ROLES_PLAY = "Install what the node's image lacks (bare or older images)"
DONE_PLAY = "Record that every node is configured"


def test_site_yml_applies_the_image_roles_only_to_nodes_sorted_out_and_image_yml_records_the_key():
    import yaml

    plays = _site_plays()
    names = list(plays)
    assert names.index(SORT_PLAY) < names.index(IMAGE_ROLES_PLAY) < names.index(DONE_PLAY)
    sort_tasks = plays[SORT_PLAY]["tasks"]
    assert sort_tasks[0]["ansible.builtin.slurp"]["src"] == baked.KEY_FILE
    group_key = sort_tasks[-1]["ansible.builtin.group_by"]["key"]
    image_play = plays[IMAGE_ROLES_PLAY]
    assert image_play["hosts"] in group_key and image_play["gather_facts"] is True
    assert [r["role"] for r in image_play["roles"]] == list(baked.IMAGE_ROLES)
    standing = {"name": "tf_node", "tasks_from": "host"}
    assert [t["ansible.builtin.import_role"] for t in image_play["tasks"]] == [standing]
    # nothing else of tf_node in configure: the run's part (bundle, firewall, credentials) is train.yml's
    imported = [t.get("ansible.builtin.import_role") for p in plays.values() for t in p.get("tasks", [])]
    assert [i for i in imported if i] == [standing] and all("roles" not in p for n, p in plays.items()
                                                           if n != IMAGE_ROLES_PLAY)
    (baking,) = yaml.safe_load((REPO / "playbooks" / baked.PLAYBOOK).read_text())
    assert [r["role"] for r in baking["roles"]] == list(baked.IMAGE_ROLES)
    assert [t["ansible.builtin.import_role"] for t in baking["tasks"]] == [standing]
    assert "tasks/host.yml" in " ".join(baked.IMAGE_ROLE_PARTS)
    # tf_node's main entry point (IM's contextualization applies it) is the standing part, nothing of a run
    tf_node_tasks = yaml.safe_load((REPO / "roles" / "tf_node" / "tasks" / "main.yml").read_text())
    assert [t.get("ansible.builtin.import_tasks") for t in tf_node_tasks] == ["host.yml"]
    (record,) = baking["post_tasks"]
    assert record["ansible.builtin.copy"]["dest"] == baked.KEY_FILE
    assert "tfcluster_image_key" in record["ansible.builtin.copy"]["content"]


@pytest.mark.parametrize("stamp, keys, current", [
    ("abc123def456\n", {"worker": "abc123def456"}, True),      # the image holds this configuration's roles
    ("0123456789ab\n", {"worker": "abc123def456"}, False),     # an older image: the roles run (and update it)
    (None, {"worker": "abc123def456"}, False),                 # a bare image: the roles install everything
    ("abc123def456\n", {}, False),                             # a provider that gives no key: the roles run
    ("abc123def456\n", {"chief": "abc123def456"}, False),      # another role's key is not this node's
])
def test_the_image_roles_are_skipped_only_when_the_nodes_key_is_this_configurations(tmp_path, stamp, keys,
                                                                                       current):
    """site.yml's own sorting tasks, run by Ansible on this machine, with the key file moved to the test's
    directory: the node lands in the group that the image roles' play targets unless its key is current."""
    import subprocess

    import yaml

    from tfcluster import ansible_run

    key_file = tmp_path / "image-key"
    if stamp is not None:
        key_file.write_text(stamp)
    plays = _site_plays()
    tasks = yaml.safe_load(yaml.safe_dump(plays[SORT_PLAY]["tasks"]).replace(baked.KEY_FILE, str(key_file)))
    target = plays[IMAGE_ROLES_PLAY]["hosts"]
    shown = f"CURRENT={{{{ 'tfcluster_image_current' in group_names }}}} ROLES={{{{ '{target}' in group_names }}}}"
    tasks.append({"name": "Show", "ansible.builtin.debug": {"msg": shown}})
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"name": "Pre", "hosts": "localhost", "connection": "local",
                                     "gather_facts": False, "vars": {"tf_role": "worker"}, "tasks": tasks}]))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"tfcluster_image_keys": keys}))
    res = subprocess.run([str(ansible_run.BIN / "ansible-playbook"), "-i", "localhost,", str(play),
                          "-e", f"@{extra}"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                         cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"CURRENT={current} ROLES={not current}" in res.stdout, res.stdout[-2000:]


def test_the_local_provider_keys_each_role_it_runs_with_the_image_it_would_bake(tmp_path):
    state = ClusterState("tfcimg-keys", root=tmp_path)
    key_now = baked.local_inputs(resolve({}, {})).key
    assert LocalProvider(state).image_keys(resolve({}, {})) == {"ps": key_now, "worker": key_now, "chief": key_now}
    assert LocalProvider(state).image_keys(resolve({}, {"strategy": "multi_worker_mirrored"})) == {
        "worker": key_now, "chief": key_now}
