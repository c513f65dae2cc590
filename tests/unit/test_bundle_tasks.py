"""tf_node's bundle tasks (roles/tf_node/tasks/bundle.yml), run by Ansible on this machine against a harness
directory in the test's own directory: a bundle is copied once per content id, an older bundle's id never
skips the copy of a later one, and nothing of another bundle stays beside it."""

from __future__ import annotations

import json
import subprocess

import yaml

from tests.conftest import REPO, needs_root
from tfcluster import ansible_run, wheelhouse
from tfcluster.paths import TRAIN_DIR

pytestmark = needs_root()


def _start_bundle(tmp_path, bundle, bundle_id) -> str:
    """Run the bundle tasks as start.yml imports them; the play's output."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "Bundle", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [{"name": "The bundle", "ansible.builtin.include_role": {"name": "tf_node", "tasks_from": "bundle"}}],
    }]))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"tf_node_harness_dir": str(tmp_path / "harness"), "tf_node_bundle": str(bundle),
                                 "tf_node_bundle_id": bundle_id}))
    (tmp_path / "harness").mkdir(exist_ok=True)
    res = subprocess.run([str(ansible_run.BIN / "ansible-playbook"), "-i", "localhost,", str(play), "-e",
                          f"@{extra}"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                         cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    return res.stdout


def _changed(out: str, task: str) -> bool:
    section = out.split(f"TASK [tf_node : {task}]")[1].split("TASK [")[0]
    return "changed: [localhost]" in section


def _copied(out: str) -> bool:
    """The bundle copied and unpacked (both or neither)."""
    copied, unpacked = _changed(out, "Copy the harness bundle"), _changed(out, "Unpack the harness bundle")
    assert copied == unpacked, out
    return copied


def test_a_bundle_is_copied_once_per_id_and_an_older_id_never_skips_a_later_bundle(tmp_path):
    user = tmp_path / "mymodel.py"
    user.write_text("def build_model():\n    return None\n")
    plain, plain_id = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "a")
    mine, mine_id = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "b", str(user))
    harness = tmp_path / "harness"

    assert _copied(_start_bundle(tmp_path, plain, plain_id))
    assert sorted(p.name for p in harness.glob(".bundle-*")) == [f".bundle-{plain_id}"]
    assert not _copied(_start_bundle(tmp_path, plain, plain_id))       # the same id: nothing copied again
    assert _copied(_start_bundle(tmp_path, mine, mine_id))
    assert (harness / "models" / "mymodel.py").read_text() == user.read_text()
    assert sorted(p.name for p in harness.glob(".bundle-*")) == [f".bundle-{mine_id}"]
    stray = harness / "tfc_harness" / "formats" / "renamed_files.py"      # a module of an older harness only
    stray.write_text("raise ImportError('an old bundle\'s module')\n")
    # back to the first bundle: its marker went with the second's unpack, so it is copied and unpacked again,
    # over nothing of the other bundle: neither the user's model nor a module this bundle lacks stays behind
    assert _copied(_start_bundle(tmp_path, plain, plain_id))
    assert sorted(p.name for p in harness.glob(".bundle-*")) == [f".bundle-{plain_id}"]
    assert not stray.exists() and not (harness / "models" / "mymodel.py").exists()
    shipped = {p.relative_to(harness).as_posix() for p in harness.rglob("*.py")}
    assert shipped == {p.relative_to(TRAIN_DIR).as_posix() for p in TRAIN_DIR.glob("tfc_harness/**/*.py")} | \
        {p.relative_to(TRAIN_DIR).as_posix() for p in TRAIN_DIR.glob("models/*.py")}
    for folder in ("tfc_harness", "tfc_harness/formats", "models"):
        assert (harness / folder).stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in harness.rglob("*.py")} == {0o644}
    assert {(p.stat().st_uid, p.stat().st_gid) for p in harness.rglob("*")} == {(0, 0)}
