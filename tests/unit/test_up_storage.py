"""`up`'s storage step against its provisioning (tfcluster/cluster.py): a local store that is not running starts
before the nodes are provisioned and is waited for after (its start beside Terraform's work), while a running
one's bucket, and another store's, is made before any node exists; a local store that fails to start fails
`up` naming `make down`, the nodes it provisioned recorded for it. And the store's own start
(tfcluster/store.py): a server that exits is named with its log."""

from __future__ import annotations

import socket
import sys

import pytest

from tests.unit.test_inventory import make_nodes
from tfcluster import cluster, config, store
from tfcluster.config import ROLES
from tfcluster.errors import ProvisionError, TfclusterError
from tfcluster.paths import ClusterState
from tfcluster.providers.base import read_nodes


class _Provider:
    def __init__(self, events: list[str]):
        self.events = events

    def up(self, spec, public_key):
        self.events.append("provision")
        return make_nodes(*(spec.count(role) for role in ROLES))


@pytest.fixture
def events(monkeypatch, home):
    monkeypatch.setenv("TFCLUSTER_HOME", str(home))
    said: list[str] = []

    def start(log):
        said.append("store start")

        def answering():
            said.append("store answers")
            return store.local_endpoint()
        return answering

    monkeypatch.setattr(store, "start", start)
    monkeypatch.setattr(store, "client", lambda spec: None)
    monkeypatch.setattr(store, "ensure_bucket", lambda s3, bucket, region: said.append(f"bucket {bucket}"))
    monkeypatch.setattr(cluster, "wait_for_ssh", lambda state, nodes, timeout: said.append("ssh"))
    monkeypatch.setattr(cluster, "ensure_ssh_key", lambda state: "ssh-ed25519 AAAA test")
    return said


def test_a_running_local_stores_bucket_is_made_before_any_node_exists(events, monkeypatch):
    monkeypatch.setattr(store, "start", lambda log: events.append("store answers already"))   # None: running
    spec = config.resolve({"cluster": "tfct-upst"})
    cluster.up(spec, _Provider(events))
    assert events == ["store answers already", f"bucket {spec.storage.bucket}", "provision", "ssh"]


def test_the_local_store_starts_before_the_nodes_and_its_bucket_is_made_after_them(events):
    spec = config.resolve({"cluster": "tfct-upst"})
    assert store.is_local_store(spec)
    cluster.up(spec, _Provider(events))
    assert events == ["store start", "provision", "store answers", f"bucket {spec.storage.bucket}", "ssh"]


def test_another_stores_bucket_is_made_before_any_node_exists(events):
    spec = config.resolve({"cluster": "tfct-upst", "storage": {"endpoint": "http://10.9.9.9:9000"}})
    assert not store.is_local_store(spec)
    cluster.up(spec, _Provider(events))
    assert events == [f"bucket {spec.storage.bucket}", "provision", "ssh"]


def test_a_local_store_that_fails_to_start_fails_up_with_the_nodes_recorded(events, monkeypatch):
    def start(log):
        def answering():
            raise TfclusterError("the local S3 store exited (code 1); see store.log")
        return answering

    monkeypatch.setattr(store, "start", start)
    spec = config.resolve({"cluster": "tfct-upst"})
    provider = _Provider(events)
    with pytest.raises(ProvisionError, match="store exited") as failed:
        cluster.up(spec, provider)
    assert "'make down CLUSTER=tfct-upst' removes them" in str(failed.value)
    assert events == ["provision"]
    assert [n.name for n in read_nodes(ClusterState(spec.cluster).nodes)] == \
        ["c-ps-0", "c-worker-0", "c-worker-1", "c-chief-0"]  # what `down` removes


def test_a_store_server_that_exits_is_named_with_its_log(monkeypatch, home):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("TFCLUSTER_HOME", str(home))
    monkeypatch.setenv("TFCLUSTER_STORE_IP", "127.0.0.1")
    monkeypatch.setenv("TFCLUSTER_STORE_PORT", str(port))
    monkeypatch.setattr(sys, "executable", "/bin/false")     # a server that exits at once (status 1)
    said: list[str] = []
    answering = store.start(log=said.append)
    assert said == [f"starting the local S3 store (moto) at {store.local_endpoint()}"]
    assert store.pid_file().read_text().strip().isdigit()
    with pytest.raises(TfclusterError, match=r"the local S3 store exited \(code 1\); see .*store\.log"):
        answering()
