"""Inputs that used to pass but should not (issue 14's list): each refused, naming what was wrong."""

from __future__ import annotations

import pytest

from tfcluster import config
from tfcluster.errors import ConfigError, ProvisionError
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node
from tfcluster.providers.im import ImProvider

NODE = {"name": "c-ps-0", "role": "ps", "index": 0, "private_ip": "10.0.0.10", "public_ip": "203.0.113.9",
        "ssh_user": "debian", "ssh_port": 22, "gpus": 0}


@pytest.mark.parametrize(("cidr", "meant"), [("203.0.113.7/0", "203.0.113.7/32"), ("10.0.0.5/24", "10.0.0.0/24")])
def test_an_ssh_cidr_with_host_bits_is_refused_not_widened(cidr, meant):
    with pytest.raises(ConfigError) as err:
        config.resolve(overrides={"network.allowed_ssh_cidrs": [cidr]})
    assert err.value.field == "network.allowed_ssh_cidrs" and err.value.value == cidr
    assert meant in err.value.allowed
    assert config.resolve(overrides={"network.allowed_ssh_cidrs": ["203.0.113.7/32", "10.0.0.0/8"]}) \
        .network.allowed_ssh_cidrs == ["203.0.113.7/32", "10.0.0.0/8"]


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "64.0.0.0/2", "2000::/8", "::/0"])
def test_an_ssh_cidr_wider_than_a_slash_8_is_refused_unless_explicitly_allowed(cidr):
    with pytest.raises(ConfigError) as err:
        config.resolve(overrides={"network.allowed_ssh_cidrs": ["203.0.113.0/24", cidr]})
    assert err.value.field == "network.allowed_ssh_cidrs" and err.value.value == cidr
    assert "network.allow_wide_ssh_cidrs: true" in err.value.allowed
    spec = config.resolve(overrides={"network.allowed_ssh_cidrs": [cidr], "network.allow_wide_ssh_cidrs": "true"})
    assert spec.network.allowed_ssh_cidrs == [cidr]


@pytest.mark.parametrize(("key", "value"), [
    ("private_ip", "10.0.0.1 -oProxyCommand=touch /tmp/x"), ("public_ip", "-oProxyCommand=sh"),
    ("ssh_user", "root;id"), ("ssh_port", 0), ("name", "a b"),
])
def test_a_node_record_a_provider_returns_is_checked(key, value):
    assert Node.from_dict(NODE).public_ip == "203.0.113.9"
    assert Node.from_dict({**NODE, "public_ip": "ec2-203-0-113-9.compute-1.amazonaws.com"})
    with pytest.raises(ProvisionError, match=f"bad {key}"):
        Node.from_dict({**NODE, key: value})


def _im_spec(tmp_path, **options):
    auth = tmp_path / "auth.dat"
    if not auth.exists():
        auth.write_text("id = im; type = InfrastructureManager; username = u; password = SECRETPASS\n")
        auth.chmod(0o600)
    opts = {"im_url": "https://im.example.org:8800", "auth_file": str(auth), "image_url": "ost://k/img", **options}
    return config.resolve(overrides={"provider": "im", "storage.bucket": "my-runs", "provider_options": opts,
                                     "network.allowed_ssh_cidrs": ["203.0.113.0/24"],
                                     "storage.endpoint": "https://s3.example.org"})


def im_refuses(tmp_path, **options) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        ImProvider(ClusterState("tfct-im", root=tmp_path)).check(_im_spec(tmp_path, **options))
    return err.value


def test_im_url_plain_http_only_on_this_machine(tmp_path):
    err = im_refuses(tmp_path, im_url="http://im.example.org:8800")
    assert err.field == "provider_options.im_url" and "https://" in err.allowed
    ImProvider(ClusterState("tfct-im", root=tmp_path)).check(_im_spec(tmp_path, im_url="http://127.0.0.1:8800"))


def test_im_auth_file_readable_by_others_is_refused(tmp_path):
    auth = tmp_path / "auth.dat"
    auth.write_text("id = im; type = InfrastructureManager; username = u; password = SECRETPASS\n")
    auth.chmod(0o644)
    err = im_refuses(tmp_path)
    assert err.field == "provider_options.auth_file" and "chmod 600" in err.allowed
    assert "SECRETPASS" not in str(err)


@pytest.mark.parametrize("key", ["roles_url", "wheelhouse_url"])
def test_urls_im_passes_to_its_ansible_take_no_template_braces(tmp_path, key):
    err = im_refuses(tmp_path, **{key: "https://example.org/{{ansible_env.HOME}}/"})
    assert err.field == f"provider_options.{key}" and "braces" in err.allowed


def test_the_local_store_keys_file_must_be_the_owners_alone(tmp_path, monkeypatch):
    from tfcluster import store
    from tfcluster.errors import TfclusterError

    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    keys = store.credentials()
    path = store.store_dir() / "credentials.env"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and keys["AWS_ACCESS_KEY_ID"].startswith("tfc")
    path.chmod(0o644)
    with pytest.raises(TfclusterError, match=r"mode 0o644\): chmod 600 it"):
        store.credentials()
