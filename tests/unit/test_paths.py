"""Cluster state paths: SSH control sockets fit a Unix socket path whatever the state root."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from tfcluster.errors import TfclusterError
from tfcluster.paths import ClusterState, made_once


@pytest.fixture
def state(tmp_path):
    root = tmp_path / ("x" * 120)
    root.mkdir()
    s = ClusterState("a-cluster-name-of-forty-characters-long", root=root)
    yield s
    if s.control_dir.is_dir() and not s.control_dir.is_symlink():
        os.rmdir(s.control_dir)


def test_control_socket_binds_under_a_deep_state_root(state):
    cp = state.ensure_control_dir()
    assert oct(cp.stat().st_mode & 0o777) == "0o700"
    # Ansible's socket name (10 hex) plus the suffix ssh appends while it connects (17 characters).
    path = cp / ("0123456789" + ".abcdefghijklmnop")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
    path.unlink()
    # ssh's own %C token is 40 hex characters (training's status probes).
    assert len(str(cp / ("f" * 40 + ".abcdefghijklmnop"))) < 108


def test_control_dir_is_per_cluster_and_stable(tmp_path):
    a, b = ClusterState("a", root=tmp_path), ClusterState("b", root=tmp_path)
    assert a.control_dir != b.control_dir
    assert ClusterState("a", root=tmp_path).control_dir == a.control_dir
    assert ClusterState("a", root=tmp_path / "other").control_dir != a.control_dir


def test_control_dir_refuses_a_directory_others_can_enter(state):
    state.control_dir.mkdir(mode=0o755)
    os.chmod(state.control_dir, 0o755)
    with pytest.raises(TfclusterError, match="not a private directory"):
        state.ensure_control_dir()


def test_control_dir_refuses_a_symlink(state, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    state.control_dir.symlink_to(target)
    try:
        with pytest.raises(TfclusterError, match="not a private directory"):
            state.ensure_control_dir()
    finally:
        state.control_dir.unlink()


def test_the_cache_is_the_machines_whatever_the_state_root(tmp_path, monkeypatch):
    """Images, wheels and apt packages are shared by every checkout: not under the state root (a clone's
    .tfcluster/) but in $XDG_CACHE_HOME/tfcluster; TFCLUSTER_CACHE moves it."""
    from tfcluster.paths import cache_root, state_root

    monkeypatch.delenv("TFCLUSTER_CACHE", raising=False)
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path / "clone" / ".tfcluster"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "tfcluster"
    assert state_root() == tmp_path / "clone" / ".tfcluster"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "tfcluster"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")            # XDG: a relative path is ignored
    assert cache_root() == tmp_path / "home" / ".cache" / "tfcluster"
    monkeypatch.setenv("TFCLUSTER_CACHE", str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere"


def test_made_once_makes_a_missing_entry_once_however_many_ask_at_the_same_time(tmp_path):
    entry, made = tmp_path / "entry", []

    def make():
        made.append(1)
        time.sleep(0.2)             # long enough for the others to be waiting on the lock
        entry.write_text("built")
        return entry

    def ask():
        results.append(made_once(tmp_path / "cache" / ".lock", lambda: entry if entry.exists() else None, make))

    results: list = []
    askers = [threading.Thread(target=ask) for _ in range(4)]
    for t in askers:
        t.start()
    for t in askers:
        t.join()
    assert made == [1] and results == [entry] * 4
    assert made_once(tmp_path / "cache" / ".lock", lambda: entry, lambda: pytest.fail("made again")) == entry


def test_made_once_lets_a_failed_make_be_tried_again(tmp_path):
    def fail():
        raise TfclusterError("download failed")

    with pytest.raises(TfclusterError, match="download failed"):
        made_once(tmp_path / ".lock", lambda: None, fail)
    assert made_once(tmp_path / ".lock", lambda: None, lambda: "made") == "made"
