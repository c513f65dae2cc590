"""Every task's gRPC channels ping a silent peer (runner.GRPC_ENV): a call to a worker whose link is cut fails
in seconds and the coordinator trains on with the others (tests/reliability/test_faults.py's link cut checks
that on a local cluster)."""

from __future__ import annotations

import os

from tfc_harness import runner

KEY = "TF_GRPC_DEFAULT_OPTIONS"


def _options(value: str) -> dict[str, int]:
    return {name: int(number) for name, number in (option.split("=") for option in value.split(","))}


def test_a_task_pings_a_silent_peer_after_seconds(monkeypatch):
    monkeypatch.setattr(os, "environ", {})     # the task's environment, not this process's
    runner.set_tf_env()
    options = _options(os.environ[KEY])
    assert options["grpc.keepalive_time_ms"] <= 10_000 and options["grpc.keepalive_timeout_ms"] <= 10_000, options
    assert options["grpc.keepalive_timeout_ms"] >= 2_000, options   # a busy peer's answer is not a loss


def test_an_operators_grpc_options_are_kept(monkeypatch):
    monkeypatch.setattr(os, "environ", {KEY: "grpc.keepalive_time_ms=60000"})
    runner.set_tf_env()
    assert os.environ[KEY] == "grpc.keepalive_time_ms=60000"
