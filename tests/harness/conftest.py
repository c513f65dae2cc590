"""Fixtures for the harness tests: a moto S3 server on loopback, an S3 client, node processes.

Every process a fixture starts is killed at teardown, also when the test fails.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_support import S3_CREDENTIALS, Processes, free_port, node_env, wait_for_port  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: starts real TensorFlow processes and a moto S3 server")


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory):
    """A moto S3 server on a free loopback port for the module; yields its URL."""
    pytest.importorskip("moto.server", reason="needs moto[server]")
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, env=node_env(),
                                start_new_session=True)
    try:
        wait_for_port(port, 30, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture
def s3_client(moto_endpoint, monkeypatch):
    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    from tfc_harness import s3io
    return s3io.make_client(moto_endpoint, "us-east-1")


_buckets = itertools.count()


@pytest.fixture
def bucket(s3_client):
    """A new, empty bucket in the module's moto server."""
    name = f"bucket-{next(_buckets)}"
    s3_client.create_bucket(Bucket=name)
    return name
