"""Cloud defaults of issue 8: bucket (item 6), SSH wait (10), TensorFlow vs the default image's Python (1),
the VM halt after the run's deadline (12). All refusals come before anything is created."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import run_cli
from tfcluster import config, tfsupport
from tfcluster.errors import ConfigError
from tfcluster.paths import REPO, ClusterState
from tfcluster.providers.base import REGISTRY, VM_HALT_MARGIN_MINUTES

CLOUD = {
    "aws": {},
    "gcp": {"provider_options": {"project": "my-project-123"}, "storage.endpoint": "https://storage.googleapis.com"},
    "openstack": {"provider_options": {"external_network": "public"}, "storage.endpoint": "https://s3.example.org"},
}


def cloud_spec(name: str, **overrides):
    values = {"provider": name, "network.allowed_ssh_cidrs": ["203.0.113.0/24"], "storage.bucket": "my-team-runs",
              **CLOUD[name], **overrides}
    return config.resolve(overrides=values)


@pytest.mark.parametrize("provider", ["aws", "gcp", "openstack", "im"])
def test_cloud_providers_need_a_bucket_of_their_own(provider):
    with pytest.raises(ConfigError) as err:
        config.resolve(overrides={"provider": provider})
    assert err.value.field == "storage.bucket" and "set explicitly" in err.value.allowed
    # set explicitly, even to the same name, it is the user's choice
    assert config.resolve(overrides={"provider": provider, "storage.bucket": "tfcluster"}).storage.bucket == "tfcluster"


def test_local_and_adopted_local_nodes_keep_the_default_bucket():
    assert config.resolve().storage.bucket == "tfcluster"
    spec = config.resolve(overrides={"provider": "im", "provider_options": {"adopt_local": "true"}})
    assert spec.storage.bucket == "tfcluster" and spec.ssh.timeout_seconds == 60


def test_cli_validate_refuses_the_default_bucket_on_aws_with_status_2(home):
    res = run_cli("validate", "--provider", "aws", home=home)
    assert res.returncode == 2
    assert "storage.bucket: got 'tfcluster (the default)'" in res.stderr


def test_ssh_wait_is_longer_on_clouds_unless_set():
    assert config.resolve().ssh.timeout_seconds == 60
    assert cloud_spec("aws").ssh.timeout_seconds == config.CLOUD_SSH_TIMEOUT_S == 600
    assert cloud_spec("gcp", **{"ssh.timeout_seconds": 90}).ssh.timeout_seconds == 90
    assert config.resolve({"ssh": {"timeout_seconds": 30}}, {"provider": "local"}).ssh.timeout_seconds == 30


def test_the_table_is_the_roles_and_holds_the_default_release():
    data = yaml.safe_load((REPO / "roles/tensorflow/vars/main.yml").read_text())["_tensorflow_python_support"]
    assert tfsupport.table() == {k: tuple(v) for k, v in data.items()}
    default = config.FIELDS["tensorflow.version"].default
    assert tfsupport.pythons_for(default) is not None
    assert "3.11" in tfsupport.pythons_for(default)  # Debian 12's Python, the default image everywhere


@pytest.mark.parametrize("provider", ["aws", "gcp", "openstack"])
def test_default_images_are_debian_12(provider):
    image = REGISTRY[provider].default_image
    assert "Debian 12" in image.name and image.python == "3.11"
    assert image.ssh_user == {"aws": "admin", "gcp": "debian", "openstack": "debian"}[provider]
    module = (REPO / "terraform" / provider / "main.tf").read_text()
    assert f'var.ssh_user == "" ? "{image.ssh_user}"' in module


@pytest.mark.parametrize("provider", ["aws", "gcp", "openstack"])
def test_a_release_the_default_images_python_cannot_install_is_refused(provider, tmp_path, monkeypatch):
    monkeypatch.setattr(tfsupport, "table", lambda: {"2.21": ("3.10", "3.11"), "2.99": ("3.12", "3.13")})
    monkeypatch.setattr(tfsupport, "locked_releases", lambda: ("2.21.0", "2.99.0"))
    cls = REGISTRY[provider]
    cls(ClusterState("x", root=tmp_path)).check(cloud_spec(provider))  # 2.21.0: fine
    with pytest.raises(ConfigError) as err:
        cls(ClusterState("x", root=tmp_path)).check(cloud_spec(provider, **{"tensorflow.version": "2.99.0"}))
    assert err.value.field == "tensorflow.version" and err.value.value == "2.99.0"
    assert "Python 3.11" in err.value.allowed and "2.21.x" in err.value.allowed and "3.12, 3.13" in err.value.allowed
    with pytest.raises(ConfigError) as err:
        cls(ClusterState("x", root=tmp_path)).check(cloud_spec(provider, **{"tensorflow.version": "2.5.0"}))
    assert err.value.field == "tensorflow.version" and "2.21.x, 2.99.x" in err.value.allowed


def test_own_images_on_every_role_leave_the_check_to_the_node(tmp_path, monkeypatch):
    monkeypatch.setattr(tfsupport, "table", lambda: {"2.99": ("3.12",)})
    monkeypatch.setattr(tfsupport, "locked_releases", lambda: ("2.99.0",))
    images = {f"nodes.{r}.image": "ami-0123456789abcdef0" for r in config.ROLES}
    REGISTRY["aws"](ClusterState("x", root=tmp_path)).check(cloud_spec("aws", **{"tensorflow.version": "2.99.0"},
                                                                       **images))
    del images["nodes.chief.image"]
    with pytest.raises(ConfigError, match="nodes.chief"):
        REGISTRY["aws"](ClusterState("x", root=tmp_path)).check(
            cloud_spec("aws", **{"tensorflow.version": "2.99.0"}, **images))


def test_cli_refuses_the_mismatch_with_status_2_and_creates_nothing(home, monkeypatch):
    res = run_cli("up", "--provider", "aws", "--set", "storage.bucket=my-team-runs", "--set",
                  "network.allowed_ssh_cidrs=[203.0.113.0/24]", "--set", "tensorflow.version=2.15.1", home=home)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "tensorflow.version: got '2.15.1'" in res.stderr
    assert not (home / "tfc").exists()


def test_vm_halt_follows_the_runs_deadline_on_cloud_vms_only(tmp_path):
    for name in ("aws", "gcp", "openstack"):
        spec = cloud_spec(name, max_runtime_minutes=45)
        assert REGISTRY[name](ClusterState("x", root=tmp_path)).vm_halt_minutes(spec) == 45 + VM_HALT_MARGIN_MINUTES
    assert REGISTRY["local"](ClusterState("x", root=tmp_path)).vm_halt_minutes(config.resolve()) == 0
    im = REGISTRY["im"](ClusterState("x", root=tmp_path))
    adopted = config.resolve(overrides={"provider": "im", "provider_options": {"adopt_local": "true"}})
    assert im.vm_halt_minutes(adopted) == 0
    cloud = config.resolve(overrides={"provider": "im", "storage.bucket": "b-1x", "max_runtime_minutes": 30})
    assert im.vm_halt_minutes(cloud) == 30 + VM_HALT_MARGIN_MINUTES

