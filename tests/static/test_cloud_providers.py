"""GcpProvider and OpenstackProvider: what they refuse before Terraform runs, and the inputs they pass."""

from __future__ import annotations

import json

import pytest

from tfcluster.config import resolve
from tfcluster.errors import ConfigError
from tfcluster.paths import TERRAFORM_DIR, ClusterState
from tfcluster.providers.base import REGISTRY
from tfcluster.providers.gcp import GcpProvider
from tfcluster.providers.openstack import OpenstackProvider

from ..unit.test_terraform_interface import SHARED_INPUTS

SSH = ["203.0.113.0/24"]
GOOD = {
    "gcp": {"provider_options": {"project": "my-project-123", "zone": "europe-west4-a"},
            "storage.endpoint": "https://storage.googleapis.com"},
    "openstack": {"provider_options": {"cloud": "mysite", "external_network": "public"},
                  "storage.endpoint": "https://s3.example.org"},
}
CLASSES = {"gcp": GcpProvider, "openstack": OpenstackProvider}


def spec_for(name: str, **overrides):
    values = {"provider": name, "network.allowed_ssh_cidrs": SSH, "storage.bucket": "my-team-runs", **GOOD[name],
              **overrides}
    return resolve(overrides=values)


def provider(name: str, tmp_path):
    return CLASSES[name](ClusterState("exp1", root=tmp_path))


def refused(name: str, tmp_path, **overrides) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        provider(name, tmp_path).check(spec_for(name, **overrides))
    return info.value


@pytest.mark.parametrize("name", CLASSES)
def test_registered_and_good_spec_accepted(name, tmp_path):
    assert REGISTRY[name] is CLASSES[name]
    provider(name, tmp_path).check(spec_for(name))


@pytest.mark.parametrize("name", CLASSES)
def test_empty_allowed_ssh_cidrs_refused(name, tmp_path):
    err = refused(name, tmp_path, **{"network.allowed_ssh_cidrs": []})
    assert err.field == "network.allowed_ssh_cidrs" and "no open default" in err.allowed


@pytest.mark.parametrize("name", CLASSES)
def test_unknown_option_refused(name, tmp_path):
    options = {**GOOD[name]["provider_options"], "colour": "red"}
    err = refused(name, tmp_path, provider_options=options)
    assert err.field == "provider_options.colour"
    assert all(key in err.allowed for key in CLASSES[name].options)


@pytest.mark.parametrize("name", CLASSES)
def test_root_ssh_user_refused(name, tmp_path):
    assert refused(name, tmp_path, **{"ssh.user": "root"}).field == "ssh.user"


def test_gcp_missing_project_refused(tmp_path):
    err = refused("gcp", tmp_path, provider_options={"zone": "europe-west4-a"})
    assert err.field == "provider_options.project" and "required" in err.allowed


@pytest.mark.parametrize(("options", "field"), [
    ({"zone": "europe-west4"}, "provider_options.zone"),
    ({"zone": "europe-west4-a", "region": "us-central1"}, "provider_options.region"),
    ({"preemptible": "yes"}, "provider_options.preemptible"),
    ({"disk_size_gb": "5"}, "provider_options.disk_size_gb"),
    ({"subnetwork": "s"}, "provider_options.subnetwork"),
    ({"service_account_email": "me@example.com"}, "provider_options.service_account_email"),
])
def test_gcp_bad_option_values_refused(tmp_path, options, field):
    assert refused("gcp", tmp_path, provider_options={"project": "my-project-123", **options}).field == field


@pytest.mark.parametrize(("options", "field", "fragment"), [
    ({"public_ip": "false"}, "provider_options.public_ip", "Cloud NAT"),
    ({"public_ip": "false", "network": "shared"}, "provider_options.network_has_nat", "network shared has Cloud NAT"),
    ({"public_ip": "false", "network": "shared", "network_has_nat": "yes"}, "provider_options.network_has_nat",
     '"true" or "false"'),
])
def test_gcp_nodes_without_external_addresses_need_nat(tmp_path, options, field, fragment):
    err = refused("gcp", tmp_path, provider_options={"project": "my-project-123", **options})
    assert (err.field, err.exit_code) == (field, 2) and fragment in err.allowed
    provider("gcp", tmp_path).check(spec_for("gcp", provider_options={
        "project": "my-project-123", "public_ip": "false", "network": "shared", "network_has_nat": "true"}))


def test_gcp_storage_endpoint_must_be_named(tmp_path):
    err = refused("gcp", tmp_path, **{"storage.endpoint": "auto"})
    assert err.field == "storage.endpoint" and "storage.googleapis.com" in err.allowed


def test_gcp_ssh_sources_must_be_ipv4(tmp_path):
    err = refused("gcp", tmp_path, **{"network.allowed_ssh_cidrs": ["2001:db8::/48"]})
    assert err.field == "network.allowed_ssh_cidrs" and "IPv4" in err.allowed


def test_gcp_gpu_rules(tmp_path):
    assert refused("gcp", tmp_path, **{"nodes.worker.gpus": 3}).field == "nodes.worker.gpus"
    bad_type = {"nodes.worker.gpus": 1, "nodes.worker.instance_type": "e2-standard-8"}
    assert refused("gcp", tmp_path, **bad_type).field == "nodes.worker.instance_type"
    assert refused("gcp", tmp_path, **{"nodes.worker.instance_type": "a2-highgpu-1g"}).field == "nodes.worker.gpus"
    ok = provider("gcp", tmp_path)
    ok.check(spec_for("gcp", **{"nodes.worker.gpus": 1}))
    ok.check(spec_for("gcp", **{"nodes.worker.gpus": 1, "nodes.worker.instance_type": "g2-standard-4"}))


def test_openstack_external_network_required_unless_private_existing_network(tmp_path):
    err = refused("openstack", tmp_path, provider_options={"cloud": "mysite"})
    assert err.field == "provider_options.external_network"
    err = refused("openstack", tmp_path, provider_options={"network": "lab"})
    assert err.field == "provider_options.external_network"
    provider("openstack", tmp_path).check(
        spec_for("openstack", provider_options={"network": "lab", "floating_ip": "false"}))


def test_openstack_gpus_need_a_flavor_and_the_store_an_endpoint(tmp_path):
    assert refused("openstack", tmp_path, **{"nodes.worker.gpus": 1}).field == "nodes.worker.instance_type"
    provider("openstack", tmp_path).check(
        spec_for("openstack", **{"nodes.worker.gpus": 1, "nodes.worker.instance_type": "g1.gpu"}))
    assert refused("openstack", tmp_path, **{"storage.endpoint": "auto"}).field == "storage.endpoint"


@pytest.mark.parametrize("name", CLASSES)
def test_inputs_follow_the_shared_interface(name, tmp_path):
    p = provider(name, tmp_path)
    inputs = p.inputs(spec_for(name), "ssh-ed25519 AAAA test")
    assert set(inputs) == SHARED_INPUTS
    assert inputs["provider_options"] == GOOD[name]["provider_options"]
    assert inputs["allowed_ssh_cidrs"] == SSH
    p.module().write_root(inputs)
    root = json.loads((tmp_path / "exp1" / "terraform" / "main.tf.json").read_text())
    assert root["module"]["cluster"]["source"] == str(TERRAFORM_DIR / name)
