"""terraform/local's provider_options, evaluated by Terraform itself on ``variables.tf`` alone: the options
LocalProvider passes satisfy it, and the module and LocalOptions agree on provider_options.node_memory_mb."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tfcluster.config import resolve
from tfcluster.errors import ConfigError
from tfcluster.paths import TERRAFORM_DIR, ClusterState
from tfcluster.providers.local import LocalProvider
from tfcluster.terraform import TERRAFORM_BIN

from .test_cloud_modules import KEY, terraform_env

VARIABLES = TERRAFORM_DIR / "local" / "variables.tf"
GOOD = ["256", "4096", "65536"]
BAD = ["255", "65537", "", "1G", "512.0", " 512"]

pytestmark = pytest.mark.skipif(not shutil.which(TERRAFORM_BIN), reason="no terraform")


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    """An initialised directory holding only terraform/local/variables.tf (no provider needed)."""
    work = tmp_path_factory.mktemp("vars-local")
    shutil.copy(VARIABLES, work / "variables.tf")
    res = subprocess.run([TERRAFORM_BIN, "init", "-input=false", "-backend=false"], cwd=work, capture_output=True,
                         text=True, env=terraform_env(work))
    assert res.returncode == 0, res.stdout + res.stderr
    return work


def inputs(tmp_path, **options) -> dict:
    """What LocalProvider hands the module for a spec with these user options."""
    spec = resolve(overrides={"provider_options": options})
    return LocalProvider(ClusterState("exp1", root=tmp_path)).inputs(spec, KEY)


def plan(work, values: dict) -> subprocess.CompletedProcess:
    (work / "inputs.tfvars.json").write_text(json.dumps(values))
    return subprocess.run([TERRAFORM_BIN, "plan", "-input=false", "-no-color", "-var-file=inputs.tfvars.json"],
                          cwd=work, capture_output=True, text=True, env=terraform_env(work))


def test_the_required_options_are_the_ones_local_provider_passes(module_dir, tmp_path):
    required = re.search(r"for k in \[([^\]]*)\]", VARIABLES.read_text())[1]
    passed = inputs(tmp_path)["provider_options"]
    assert set(re.findall(r'"(\w+)"', required)) <= set(passed)
    res = plan(module_dir, inputs(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("value", GOOD)
def test_node_memory_both_accept(module_dir, tmp_path, value):
    values = inputs(tmp_path, node_memory_mb=value)
    assert values["provider_options"]["node_memory_mb"] == value
    res = plan(module_dir, values)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("value", BAD)
def test_node_memory_both_refuse(module_dir, tmp_path, value):
    with pytest.raises(ConfigError, match="provider_options.node_memory_mb"):
        LocalProvider.parse_options({"node_memory_mb": value})
    values = inputs(tmp_path)
    values["provider_options"]["node_memory_mb"] = value
    res = plan(module_dir, values)
    assert res.returncode != 0
    assert "provider_options.node_memory_mb: a whole number of MiB from 256 to 65536" in " ".join(res.stderr.split())
