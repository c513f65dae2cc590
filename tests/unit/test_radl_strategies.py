"""RADL for a cluster without parameter servers (``strategy: multi_worker_mirrored``): rendering only."""

from __future__ import annotations

import pytest

from tfcluster import radl_render
from tfcluster.config import resolve

parse_radl = pytest.importorskip("radl.radl_parse").parse_radl


def test_multi_worker_mirrored_has_no_ps_system_nor_ps_in_the_cluster_spec():
    spec = resolve(overrides={"cluster": "tfct-im", "provider": "im", "strategy": "multi_worker_mirrored",
                              "provider_options": {"im_url": "http://127.0.0.1:9",
                                                   "image_url": "ost://cloud.example.org:5000/3f1c-image"},
                              "network.allowed_ssh_cidrs": ["203.0.113.0/24"], "storage.bucket": "my-team-runs"})
    parsed = parse_radl(radl_render.render(spec, contextualize="im"))
    assert parsed.check()
    assert {d.id: d.vm_number for d in parsed.deploys} == {"worker": 2, "chief": 1}
    assert {s.name for s in parsed.systems} == {"worker", "chief"}
    for role in ("worker", "chief"):
        recipe = parsed.get_configure_by_name(role).recipes
        assert "tf_node_count: 3" in recipe and "\n      ps:" not in recipe
        assert "\n      worker:" in recipe and "\n      chief:" in recipe
    # the security rules do not depend on the strategy: from outside, SSH from the allowed networks only;
    # the TensorFlow port only on the private network between members
    outside = {n.id: [(o.get_remote_cidr(), o.get_remote_port(), o.get_protocol()) for o in n.getOutPorts() or []]
               for n in parsed.networks}
    assert outside == {"public": [("203.0.113.0/24", 22, "tcp")], "private": []}
    assert not parsed.get_network_by_id("private").isPublic()
    for system in parsed.systems:
        assert [system.getValue(f"net_interface.{i}.connection") for i in range(3)] == ["public", "private", None]
