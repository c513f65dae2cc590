"""Every provider module honours the shared interface; the adapter writes a root that calls it."""

from __future__ import annotations

import fcntl
import json
import re
import threading
import time
from pathlib import Path

from tfcluster.config import resolve
from tfcluster.paths import TERRAFORM_DIR, ClusterState
from tfcluster.providers.local import LocalProvider
from tfcluster.terraform import TerraformModule

SHARED_INPUTS = {"cluster_name", "ps_count", "worker_count", "chief_count", "instance_types", "images", "gpus",
                 "ssh_public_key", "ssh_user", "allowed_ssh_cidrs", "tf_port", "bucket", "prefix",
                 "max_runtime_minutes", "storage_access", "provider_options"}
NODE_KEYS = {"name", "role", "index", "private_ip", "public_ip", "ssh_user", "ssh_port", "gpus"}


def modules() -> list[Path]:
    return sorted(p for p in TERRAFORM_DIR.iterdir() if (p / "variables.tf").exists())


def declared_variables(module: Path) -> set[str]:
    text = "".join(p.read_text() for p in module.glob("*.tf"))
    return set(re.findall(r'^variable "([a-z_]+)"', text, re.M))


def test_every_module_declares_the_shared_inputs_and_files():
    assert modules(), "no provider modules found"
    for m in modules():
        assert declared_variables(m) == SHARED_INPUTS, m.name
        for f in ("main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md"):
            assert (m / f).exists(), f"{m.name}/{f}"


def test_every_module_outputs_nodes_with_the_shared_keys():
    for m in modules():
        text = (m / "outputs.tf").read_text()
        assert 'output "nodes"' in text, m.name
        block = text[text.index('output "nodes"'):]
        keys = set(re.findall(r"^\s+([a-z_]+)\s+=", block, re.M)) & (NODE_KEYS | {"value", "description"})
        assert NODE_KEYS <= keys, f"{m.name}: nodes output lacks {NODE_KEYS - keys}"


def test_every_variable_has_type_and_description():
    for m in modules():
        text = (m / "variables.tf").read_text()
        for block in re.split(r'^variable "', text, flags=re.M)[1:]:
            name = block.split('"')[0]
            assert "description" in block and "type" in block, f"{m.name}: variable {name}"


def test_provider_inputs_match_shared_interface(tmp_path):
    provider = LocalProvider(ClusterState("x", root=tmp_path))
    inputs = provider.inputs(resolve(), "ssh-ed25519 AAAA test")
    assert set(inputs) == SHARED_INPUTS
    module = provider.module()
    module.write_root(inputs)
    root = json.loads((tmp_path / "x" / "terraform" / "main.tf.json").read_text())
    assert root["module"]["cluster"]["source"] == str(TERRAFORM_DIR / "local")
    assert root["output"]["nodes"]["value"] == "${module.cluster.nodes}"
    assert inputs["provider_options"]["subnet"].startswith("10.231.")


def test_destroy_waits_out_an_apply_caught_mid_write_of_its_state(tmp_path):
    """A Ctrl-C during up can catch Terraform rewriting terraform.tfstate in place (truncated, not yet written,
    its lock held): the teardown's destroy must wait for that lock and destroy what the state then records,
    not die parsing the empty file (CI saw a JSONDecodeError from python-terraform there)."""
    module = tmp_path / "module"
    module.mkdir()
    (module / "main.tf").write_text('resource "terraform_data" "node" {\n  input = "a"\n}\n'
                                    'output "nodes" {\n  value = [terraform_data.node.id]\n}\n')
    work = tmp_path / "work"
    TerraformModule(module, work).write_root({})
    TerraformModule(module, work).apply()
    state = work / "terraform.tfstate"
    written = state.read_text()
    assert json.loads(written)["resources"]

    failed = []
    lock_info = work / ".terraform.tfstate.lock.info"  # without it Terraform does not wait for the lock
    with state.open("r+") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # the apply's lock, as Terraform's local backend takes it
        lock_info.write_text(json.dumps({"ID": "apply", "Operation": "OperationTypeApply", "Who": "test"}))
        held.truncate(0)
        destroying = threading.Thread(target=_capture, args=(failed, lambda: TerraformModule(module, work).destroy()))
        destroying.start()
        time.sleep(2)
        assert destroying.is_alive() and failed == []   # waiting for the lock, not done on the empty file
        held.write(written)
        held.flush()
        lock_info.unlink()
        fcntl.lockf(held, fcntl.LOCK_UN)
    destroying.join(timeout=90)
    assert not destroying.is_alive()
    assert failed == []
    assert not TerraformModule(module, work).has_resources()


def _capture(failed: list, fn) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reports what the thread raised
        failed.append(repr(e))
