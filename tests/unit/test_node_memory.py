"""Local nodes' memory limit: provider_options.node_memory_mb, checked before anything is created, and the
memory cgroups of tfcluster.cgroup (written here into stand-in cgroup trees; tests/integration/
test_node_memory.py limits real nodes)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import QUIET_SUBNET
from tfcluster import cgroup, config
from tfcluster.errors import ConfigError
from tfcluster.paths import ClusterState
from tfcluster.providers.local import LocalProvider

FIELD = "provider_options.node_memory_mb"
UNIT = "tfcmemunit"  # nothing of it is made


@pytest.mark.parametrize("value", ["256", "1024", "65536", 512])
def test_node_memory_accepted_and_passed_to_the_module(tmp_path, value):
    spec = config.resolve(overrides={"provider_options": {"node_memory_mb": value}})
    options = LocalProvider(ClusterState("x", root=tmp_path)).provider_options(spec)
    assert options["node_memory_mb"] == str(value)
    assert options["cgroup_parent"] == "tfcluster/" + spec.cluster


def test_no_node_memory_means_no_limit(tmp_path):
    options = LocalProvider(ClusterState("x", root=tmp_path)).provider_options(config.resolve())
    assert "node_memory_mb" not in options


@pytest.mark.parametrize("value", ["255", "65537", "0", "", "1G", "512M", "-512", "+512", " 512", "512.0", "½"])
def test_bad_node_memory_refused_naming_field_value_and_range(value):
    with pytest.raises(ConfigError) as err:
        LocalProvider.parse_options({"node_memory_mb": value})
    assert err.value.field == FIELD and err.value.value == value
    assert "256 to 65536" in err.value.allowed and "MiB" in err.value.allowed
    assert f"{FIELD}: got {value!r}" in str(err.value)


def test_node_memory_refused_where_there_is_no_memory_cgroup(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroup, "hierarchy", lambda fs=cgroup.CGROUP_FS: None)
    spec = config.resolve(overrides={"provider_options": {"node_memory_mb": "512"},
                                     "network.subnet": QUIET_SUBNET})
    with pytest.raises(ConfigError) as err:
        LocalProvider(ClusterState("x", root=tmp_path)).check(spec)
    assert err.value.field == FIELD and "no writable memory cgroup controller" in err.value.allowed


def _made_with(state: ClusterState, *memory: str) -> None:
    """A Terraform state as terraform/local leaves it, with nodes made with these limits ('' = none)."""
    state.terraform_dir.mkdir(parents=True)
    instances = [{"index_key": f"{UNIT}-worker-{i}", "attributes": {"input": {"value": {"memory_mb": m}}}}
                 for i, m in enumerate(memory)]
    resources = [{"type": "terraform_data", "name": "network", "instances": [{"attributes": {}}]},
                 {"type": "terraform_data", "name": "node", "instances": instances}]
    (state.terraform_dir / "terraform.tfstate").write_text(json.dumps({"resources": resources}))


@pytest.mark.parametrize(("made", "asked", "was"), [("512", "1024", "'512'"), ("", "512", "unset"),
                                                   ("512", None, "'512'")])
def test_node_memory_of_nodes_already_made_cannot_change(tmp_path, made, asked, was):
    state = ClusterState(UNIT, root=tmp_path)
    _made_with(state, made, made)
    options = {"node_memory_mb": asked} if asked else {}
    spec = config.resolve(overrides={"cluster": UNIT, "provider_options": options})
    with pytest.raises(ConfigError) as err:
        LocalProvider(state).check(spec)
    assert err.value.field == FIELD and err.value.value == (asked or "")
    assert err.value.allowed.startswith(f"{was}, as when the nodes of cluster {UNIT} were made")
    assert "make down, then make up" in err.value.allowed


def test_node_memory_as_the_nodes_were_made_passes(tmp_path):
    state = ClusterState(UNIT, root=tmp_path)
    _made_with(state, "512")
    LocalProvider(state).check(config.resolve(overrides={"cluster": UNIT, "provider_options": {"node_memory_mb": 512}}))


# --- tfcluster.cgroup on stand-in trees (plain directories: no control files appear by themselves) ----------

def test_cgroup_v1_limit_without_swap(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")
    assert cgroup.hierarchy(tmp_path) == cgroup.Hierarchy(1, tmp_path / "memory")
    node = tmp_path / "memory" / "tfcluster" / "c1" / "c1-worker-0"
    node.mkdir(parents=True)
    (node / "memory.memsw.limit_in_bytes").write_text("9223372036854771712")
    assert cgroup.create("tfcluster/c1/c1-worker-0", 300, fs=tmp_path) == node
    assert (node / "memory.limit_in_bytes").read_text() == str(300 << 20)
    assert (node / "memory.memsw.limit_in_bytes").read_text() == str(300 << 20)


def test_cgroup_v2_limit_without_swap_and_the_controller_enabled_down_to_the_node(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "memory").mkdir()  # ignored: v2 comes first
    assert cgroup.hierarchy(tmp_path) == cgroup.Hierarchy(2, tmp_path)
    node = tmp_path / "tfcluster" / "c1" / "c1-worker-0"
    node.mkdir(parents=True)
    (node / "memory.swap.max").write_text("max")
    assert cgroup.create("tfcluster/c1/c1-worker-0", 256, fs=tmp_path) == node
    assert (node / "memory.max").read_text() == str(256 << 20)
    assert (node / "memory.swap.max").read_text() == "0"
    for parent in (tmp_path, tmp_path / "tfcluster", tmp_path / "tfcluster" / "c1"):
        assert (parent / "cgroup.subtree_control").read_text() == "+memory"
    assert not (node / "cgroup.subtree_control").exists()


def test_cgroup_v2_without_the_memory_controller_nor_v1_fails_clearly(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu pids\n")
    assert cgroup.hierarchy(tmp_path) is None
    with pytest.raises(cgroup.CgroupError, match="no writable memory cgroup controller"):
        cgroup.create("tfcluster/c1/c1-worker-0", 256, fs=tmp_path)
    assert list(tmp_path.iterdir()) == [tmp_path / "cgroup.controllers"]


def test_cgroup_remove_takes_the_cluster_and_the_parents_it_leaves_empty(tmp_path):
    top = tmp_path / "memory" / "tfcluster"
    for node in ("c1/c1-ps-0", "c1/c1-worker-0", "c2/c2-worker-0"):
        (top / node).mkdir(parents=True)
    assert cgroup.leftovers("c1", fs=tmp_path) == [str(top / "c1")]
    assert set(cgroup.remove(cgroup.cluster_path("c1"), fs=tmp_path)) == {top / "c1", top / "c1" / "c1-ps-0",
                                                                         top / "c1" / "c1-worker-0"}
    assert cgroup.leftovers("c1", fs=tmp_path) == [] and (top / "c2").is_dir()
    cgroup.remove("tfcluster/c2/c2-worker-0", fs=tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["memory"]
    assert cgroup.remove("tfcluster/c2/c2-worker-0", fs=tmp_path) == []
