"""Inventory and ClusterSpec rendering from the provider's nodes, for several cluster shapes."""

from __future__ import annotations

import pytest
import yaml

from tfcluster import inventory
from tfcluster.errors import ProvisionError
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node


def make_nodes(ps: int, workers: int, chief: int) -> list[Node]:
    nodes, pos = [], 0
    for role, count in (("ps", ps), ("worker", workers), ("chief", chief)):
        for i in range(count):
            nodes.append(Node(f"c-{role}-{i}", role, i, f"10.0.0.{10 + pos}", f"203.0.113.{10 + pos}",
                              "ubuntu", 22, 0))
            pos += 1
    return nodes


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 2, 1), (2, 4, 1), (3, 8, 1), (1, 1, 0)])
def test_inventory_groups_and_hostvars(tmp_path, shape):
    ps, workers, chief = shape
    nodes = make_nodes(*shape)
    state = ClusterState("c", root=tmp_path)
    state.dir.mkdir()
    inventory.write(state, nodes, 2222, "parameter_server")
    inv = yaml.safe_load(state.inventory.read_text())
    children = inv["all"]["children"]
    assert {r: len(children[r]["hosts"]) for r in ("ps", "worker", "chief")} == \
        {"ps": ps, "worker": workers, "chief": chief}
    for n in nodes:
        hv = children[n.role]["hosts"][n.name]
        assert hv["ansible_host"] == n.public_ip           # Ansible goes to the public address
        assert (hv["tf_role"], hv["tf_index"], hv["ansible_user"]) == (n.role, n.index, "ubuntu")
    allvars = inv["all"]["vars"]
    assert "StrictHostKeyChecking=accept-new" in allvars["ansible_ssh_common_args"]
    assert str(state.known_hosts) in allvars["ansible_ssh_common_args"]
    assert allvars["ansible_ssh_private_key_file"] == str(state.ssh_key)
    assert allvars["tf_cluster_spec"]["worker"] == [f"{n.private_ip}:2222" for n in nodes   # TensorFlow
                                                    if n.role == "worker"]               # uses private IPs


def test_cluster_spec_of_each_role():
    nodes = make_nodes(2, 3, 1)
    assert inventory.cluster_spec(nodes, 2222) == {
        "ps": ["10.0.0.10:2222", "10.0.0.11:2222"],
        "worker": ["10.0.0.12:2222", "10.0.0.13:2222", "10.0.0.14:2222"],
        "chief": ["10.0.0.15:2222"],
    }


def test_cluster_spec_orders_by_index_not_by_listing():
    nodes = list(reversed(make_nodes(1, 3, 1)))
    assert inventory.cluster_spec(nodes, 1)["worker"] == ["10.0.0.11:1", "10.0.0.12:1", "10.0.0.13:1"]


def test_gapped_indexes_are_a_provisioning_error_naming_the_role():
    nodes = make_nodes(1, 2, 1)
    gapped = [n for n in nodes if n.name != "c-worker-0"]
    with pytest.raises(ProvisionError, match=r"worker nodes with indexes \[1\], not 0..0"):
        inventory.cluster_spec(gapped, 2222)
