"""A down right after an interrupted up, while IM still adds the infrastructure's resources (no server:
clients that answer as IM does right after an asynchronous create): found by its token though its RADL
still reads empty, and destroyed though IM refuses (HTTP 409) until it has added them."""

from __future__ import annotations

import time

import pytest

from tfcluster.errors import ProvisionError
from tfcluster.paths import ClusterState
from tfcluster.providers import im
from tfcluster.providers.im import ImClient, ImProvider

OURS = "description d (\n    tfcluster_cluster = 'tfct-tok' and\n    tfcluster_token = 'feedface'\n)\nsystem ps ( )\n"


class FillingClient:
    """IM lists each infrastructure at once; each one's RADL reads empty for its first ``empty_reads`` reads
    (IM's thread has not added the resources yet), then reads ``text``."""

    def __init__(self, radls: dict[str, tuple[int, str]]):
        self.radls, self.reads = radls, dict.fromkeys(radls, 0)

    def list_ids(self) -> list[str]:
        return list(self.radls)

    def radl(self, inf_id: str) -> str:
        self.reads[inf_id] += 1
        empty_reads, text = self.radls[inf_id]
        return "" if self.reads[inf_id] <= empty_reads else text


def test_an_infrastructure_whose_radl_is_still_empty_is_read_again_until_it_names_the_token(tmp_path):
    provider = ImProvider(ClusterState("tfct-tok", root=tmp_path))
    client = FillingClient({"ours": (2, OURS), "other": (0, OURS.replace("feedface", "beefcafe"))})
    assert provider._find_by_token(client, "feedface", "tfct-tok") == ["ours"]
    assert client.reads == {"ours": 3, "other": 1}


def test_one_that_stays_empty_is_not_ours_after_the_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(im, "RADL_FILL_WAIT_S", 0.5)
    provider = ImProvider(ClusterState("tfct-tok", root=tmp_path))
    client = FillingClient({"empty": (10**6, OURS)})
    assert provider._find_by_token(client, "feedface", "tfct-tok") == []
    assert client.reads["empty"] >= 2


class Answer:
    def __init__(self, status_code: int):
        self.status_code = status_code


def refusing_client(tmp_path, monkeypatch, refusals: int) -> tuple[ImClient, list[str]]:
    """A client whose DELETE IM answers 409 ``refusals`` times, then 200."""
    monkeypatch.setattr(im, "POLL_S", 0.01)
    auth = tmp_path / "auth.dat"
    auth.write_text("id = im; type = InfrastructureManager; username = u; password = p\n")
    client, calls = ImClient("http://127.0.0.1:1", auth), []

    def call(method, path, ok=(200,), **kwargs):
        calls.append(method)
        code = 409 if len(calls) <= refusals else 200
        assert code in ok
        return Answer(code)

    monkeypatch.setattr(client, "_call", call)
    return client, calls


def test_destroy_asks_again_while_im_still_adds_the_resources(tmp_path, monkeypatch):
    client, calls = refusing_client(tmp_path, monkeypatch, refusals=3)
    waits = []
    assert client.destroy("inf", timeout=60, on_wait=lambda: waits.append(1)) is True
    assert calls == ["DELETE"] * 4 and waits == [1]


def test_destroy_names_the_refusal_once_the_timeout_passes(tmp_path, monkeypatch):
    client, calls = refusing_client(tmp_path, monkeypatch, refusals=10**6)
    with pytest.raises(ProvisionError, match=r"DELETE /infrastructures/inf: HTTP 409 for 0s: IM was still adding"):
        client.destroy("inf", timeout=0.05)
    assert len(calls) >= 2


def test_each_delete_gets_what_is_left_of_the_wait_not_a_whole_timeout_of_its_own(tmp_path, monkeypatch):
    """IM answers a DELETE once the VMs are gone: a request that hangs must not get the whole timeout again
    after refusals that took most of it."""
    client, calls = refusing_client(tmp_path, monkeypatch, refusals=3)
    given = []
    refuse = client._call

    def call(method, path, ok=(200,), **kwargs):
        given.append(kwargs["timeout"])
        time.sleep(0.2)
        return refuse(method, path, ok, **kwargs)

    monkeypatch.setattr(im, "MIN_REQUEST_S", 0.01)
    monkeypatch.setattr(client, "_call", call)
    assert client.destroy("inf", timeout=2.0) is True
    assert len(given) == 4 and given[0] <= 2.0
    assert all(later < earlier for earlier, later in zip(given, given[1:], strict=False)), given
    assert given[-1] <= 2.0 - 3 * 0.2 + 0.05, given
