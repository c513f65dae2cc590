"""Terraform provider lock files (issue 14, item 5): committed where the provider can be had here (aws, from
the plugin mirror), used read-only by tfcluster's init; gcp and openstack say why they have none."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from tfcluster.errors import ProvisionError
from tfcluster.paths import TERRAFORM_DIR
from tfcluster.terraform import LOCK_FILE, TerraformModule

MIRROR = Path(os.environ.get("TFCLUSTER_TF_PLUGIN_MIRROR", "/opt/tf-plugins"))
AWS_VERSION = re.search(r'\bversion\s*=\s*"([^"]+)"', (TERRAFORM_DIR / "aws" / "versions.tf").read_text()).group(1)
AWS_PLUGIN = MIRROR / "registry.terraform.io" / "hashicorp" / "aws" / AWS_VERSION / "linux_amd64"


def test_the_aws_lock_is_committed_and_pins_the_modules_provider_version():
    lock = (TERRAFORM_DIR / "aws" / LOCK_FILE).read_text()
    block = re.search(r'provider "registry.terraform.io/hashicorp/aws" \{(.*?)\n\}', lock, re.S).group(1)
    assert f'version     = "{AWS_VERSION}"' in block and f'constraints = "{AWS_VERSION}"' in block
    assert re.search(r'"h1:[A-Za-z0-9+/=]{44}"', block)
    assert ".terraform.lock.hcl" not in (REPO / ".gitignore").read_text().split()


def test_local_needs_no_lock_file():
    """terraform_data is built in: no provider, nothing to lock."""
    assert "required_providers" not in (TERRAFORM_DIR / "local" / "versions.tf").read_text()
    assert not (TERRAFORM_DIR / "local" / LOCK_FILE).exists()


@pytest.mark.parametrize("module, provider", [("gcp", "hashicorp/google"),
                                              ("openstack", "terraform-provider-openstack/openstack")])
def test_gcp_and_openstack_have_no_lock_because_their_providers_cannot_be_had_here(module, provider):
    """`terraform providers lock` needs the provider packages (registry or a mirror); these machines reach
    neither for these two, so no lock file is committed and the README says so, rather than a made-up one."""
    assert provider in (TERRAFORM_DIR / module / "versions.tf").read_text()
    assert not (TERRAFORM_DIR / module / LOCK_FILE).exists()
    assert not (MIRROR / "registry.terraform.io" / provider).exists()
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "gcp and openstack have no committed lock file" in readme


@pytest.mark.skipif(not AWS_PLUGIN.is_dir(), reason=f"no hashicorp/aws {AWS_VERSION} in the plugin mirror ({MIRROR})")
def test_init_uses_the_committed_lock_read_only_and_refuses_a_provider_it_does_not_list(tmp_path):
    tf = TerraformModule(TERRAFORM_DIR / "aws", tmp_path / "work")
    tf.write_root({})
    tf.init()
    assert (tmp_path / "work" / LOCK_FILE).read_text() == (TERRAFORM_DIR / "aws" / LOCK_FILE).read_text()
    # a copy of the module whose lock lists another checksum: the mirror's package is refused
    module = tmp_path / "aws"
    module.mkdir()
    for f in (TERRAFORM_DIR / "aws").glob("*.tf"):
        (module / f.name).write_text(f.read_text())
    (module / "templates").symlink_to(TERRAFORM_DIR / "aws" / "templates")
    lock = (TERRAFORM_DIR / "aws" / LOCK_FILE).read_text()
    (module / LOCK_FILE).write_text(re.sub(r'"h1:[^"]+"', '"h1:' + "A" * 43 + '="', lock))
    other = TerraformModule(module, tmp_path / "other")
    other.write_root({})
    with pytest.raises(ProvisionError, match="(?s)terraform init failed.*(checksum|lock file)"):
        other.init()


def test_terraform_commands_write_no_variable_files_to_tmp(tmp_path, monkeypatch):
    """python-terraform wrote its empty variables to a /tmp/*.tfvars.json around every command and removed it
    only when terraform returned: every Ctrl-C left one. The module below lists the temporary directory from
    inside the apply, while such a file would exist."""
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    module = tmp_path / "module"
    module.mkdir()
    seen = tmp_path / "seen.txt"
    (module / "main.tf").write_text(
        'resource "terraform_data" "probe" {\n'
        f'  provisioner "local-exec" {{\n    command = "ls -A {temp} > {seen}"\n  }}\n}}\n')
    (module / "outputs.tf").write_text('output "nodes" {\n  value = {}\n}\n')
    tf = TerraformModule(module, tmp_path / "work")
    tf.write_root({})
    tf.apply()
    assert seen.read_text() == ""
    tf.destroy()
    assert list(temp.iterdir()) == []
