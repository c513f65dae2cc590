"""Each local node's TensorFlow thread pools: its share of the machine's cores unless the user says otherwise;
cloud providers keep TensorFlow's defaults."""

from __future__ import annotations

import jinja2
import pytest

from tfcluster.config import resolve
from tfcluster.errors import ConfigError
from tfcluster.paths import ClusterState
from tfcluster.providers import local
from tfcluster.providers.base import get_provider


@pytest.mark.parametrize("cores, tasks, share", [(2, 2, 1), (2, 3, 1), (8, 2, 4), (8, 3, 2), (1, 4, 1), (16, 1, 16)])
def test_share_of_cores(cores, tasks, share):
    assert local.share_of_cores(cores, tasks) == share


def _threads(monkeypatch, cores=8, **overrides):
    monkeypatch.setattr(local.os, "cpu_count", lambda: cores)
    spec = resolve(overrides=overrides)
    return get_provider(spec.provider, ClusterState("tfcbn-unit")).task_threads(spec)


def test_local_default_is_the_share_of_the_training_tasks(monkeypatch):
    assert _threads(monkeypatch, cores=8) == {"intra_op": 4, "inter_op": 4}          # 2 workers train (ps)
    assert _threads(monkeypatch, cores=8, strategy="multi_worker_mirrored",
                    **{"nodes.ps.count": 0}) == {"intra_op": 2, "inter_op": 2}      # chief + 2 workers
    assert _threads(monkeypatch, cores=2) == {"intra_op": 1, "inter_op": 2}          # inter-op: never 1


def test_the_user_overrides_it_or_asks_for_tensorflows_defaults(monkeypatch):
    assert _threads(monkeypatch, provider_options={"task_threads": "3"}) == {"intra_op": 3, "inter_op": 3}
    assert _threads(monkeypatch, provider_options={"task_threads": "1"}) == {"intra_op": 1, "inter_op": 2}
    assert _threads(monkeypatch, provider_options={"task_threads": "0"}) == {}
    with pytest.raises(ConfigError, match="task_threads: got 'many'"):
        _threads(monkeypatch, provider_options={"task_threads": "many"})


def test_it_is_not_a_terraform_input(monkeypatch):
    monkeypatch.setattr(local.os, "cpu_count", lambda: 8)
    spec = resolve(overrides={"provider_options": {"task_threads": "3"}})
    assert "task_threads" not in get_provider("local", ClusterState("tfcbn-unit")).provider_options(spec)


def test_cloud_providers_keep_tensorflows_defaults(tmp_path):
    from tests.unit.test_cloud_defaults import cloud_spec
    from tfcluster.providers.base import REGISTRY

    for name in ("aws", "gcp", "openstack"):
        assert REGISTRY[name](ClusterState("x", root=tmp_path)).task_threads(cloud_spec(name)) == {}


def test_the_start_task_puts_them_in_the_nodes_settings_or_null():
    """tf_node's entry script gets ``threads``: the controller's sizes, or null (TensorFlow's defaults)."""
    import yaml
    from ansible.plugins.filter.core import combine

    from tests.conftest import REPO

    tasks = yaml.safe_load((REPO / "roles" / "tf_node" / "tasks" / "start.yml").read_text())
    (render,) = [t for t in tasks if t["name"] == "Render the node's entry script"]
    expr = render["vars"]["tf_node_settings"].strip().removeprefix("{{").removesuffix("}}")
    env = jinja2.Environment()
    env.filters["combine"] = combine
    run, task = {"run_id": "r", "steps": 3}, {"role": "worker"}
    settings = env.compile_expression(expr)
    assert settings(tf_node_run=run, _tf_node_task=task, tf_node_threads={}) == dict(run, **task, threads=None)
    threads = {"intra_op": 1, "inter_op": 2}
    assert settings(tf_node_run=run, _tf_node_task=task, tf_node_threads=threads) == dict(run, **task,
                                                                                          threads=threads)
    defaults = yaml.safe_load((REPO / "roles/tf_node/defaults/main.yml").read_text())
    assert defaults["tf_node_threads"] == {}
