"""Fixtures for the IM provider: a real IM server of its own (own venv, SQLite, 127.0.0.1) and an auth file."""

from __future__ import annotations

import importlib.util
import os
import secrets
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO


def _im_server_module():
    spec = importlib.util.spec_from_file_location("im_server", REPO / "scripts" / "im_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def im_server(tmp_path_factory):
    """An IM 2.x server on 127.0.0.1 with SQLite state, stopped when the session ends."""
    mod = _im_server_module()
    venv = Path(os.environ.get("TFCLUSTER_IM_VENV", mod.DEFAULT_VENV))
    try:
        mod.install(venv, log=lambda m: print(m, flush=True))
    except (SystemExit, subprocess.CalledProcessError, OSError) as exc:
        reason = f"IM could not be installed into {venv}: {exc}"
        print(reason)
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("im-server")
    try:
        url = mod.start(directory, free_port(), venv, log=lambda m: print(m, flush=True))
        yield {"url": url, "dir": directory, "venv": venv}
    finally:
        mod.stop(directory, log=lambda m: print(m, flush=True))


@pytest.fixture(scope="session")
def auth_file(tmp_path_factory) -> Path:
    """IM credentials for the tests' server (any user is accepted there) and the DeployedNode connector."""
    path = tmp_path_factory.mktemp("im-auth") / "auth.dat"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# tfcluster tests\n"
                f"id = im; type = InfrastructureManager; username = tfct; password = {secrets.token_hex(12)}\n"
                "id = dn; type = DeployedNode\n")
    return path


@pytest.fixture(scope="session")
def ssh_keypair(tmp_path_factory) -> tuple[str, str]:
    """(private key text, public key line) of a throwaway ed25519 key."""
    key = tmp_path_factory.mktemp("im-key") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key.read_text(), key.with_suffix(".pub").read_text().strip()
