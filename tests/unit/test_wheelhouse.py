"""The harness bundle is reproducible, so an unchanged harness is not copied again."""

from __future__ import annotations

import tarfile
import urllib.request

from tfcluster import wheelhouse
from tfcluster.paths import TRAIN_DIR


def test_bundle_is_reproducible_and_complete(tmp_path):
    a, id_a = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "a")
    b, id_b = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "b")
    assert id_a == id_b and a.read_bytes() == b.read_bytes()
    names = tarfile.open(a).getnames()
    assert "tfc_harness/__init__.py" in names and "models/digits.py" in names
    assert not any("__pycache__" in n for n in names)


def test_bundle_changes_with_a_user_model(tmp_path):
    user = tmp_path / "mymodel.py"
    user.write_text("def build_model():\n    pass\n")
    _, plain = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "a")
    bundle, with_user = wheelhouse.harness_bundle(TRAIN_DIR, tmp_path / "b", str(user))
    assert plain != with_user
    assert "models/mymodel.py" in tarfile.open(bundle).getnames()


def test_serve_exposes_the_directory_on_the_given_host_only_while_open(tmp_path):
    (tmp_path / "x-1.0-py3-none-any.whl").write_bytes(b"wheel")
    with wheelhouse.serve(tmp_path, "127.0.0.1") as url:
        assert url.startswith("http://127.0.0.1:")
        assert urllib.request.urlopen(url + "x-1.0-py3-none-any.whl", timeout=5).read() == b"wheel"
    try:
        urllib.request.urlopen(url, timeout=2)
        raise AssertionError("server still answering after the block")
    except OSError:
        pass


def test_the_package_rule_is_the_tensorflow_roles_table():
    """One home: the wheelhouse downloads what the tensorflow role installs, both read roles/tensorflow/vars."""
    import platform

    import pytest
    import yaml

    from tests.conftest import REPO
    from tfcluster import tfsupport, wheelhouse
    from tfcluster.errors import ConfigError

    table = yaml.safe_load((REPO / "roles" / "tensorflow" / "vars" / "main.yml").read_text())
    assert tfsupport.package_for(2, "x86_64") == table["_tensorflow_gpu_package"] == "tensorflow[and-cuda]"
    for arch, package in table["_tensorflow_packages_by_arch"].items():
        assert tfsupport.package_for(0, arch) == package
    assert tfsupport.package_for(0, "aarch64") == "tensorflow"     # tensorflow-cpu has no aarch64 wheels
    with pytest.raises(ConfigError, match="s390x"):
        tfsupport.package_for(0, "s390x")
    assert wheelhouse.packages_for([0, 0, 1]) == sorted({table["_tensorflow_packages_by_arch"][platform.machine()],
                                                        "tensorflow[and-cuda]"})


# -- hash-pinned wheels (issue 14, item 5) ------------------------------------------------------------------
def _lock_for(tmp_path, **wheels):
    """A lock file pinning each fake wheel ({file name: content}) with its sha256, and the wheels."""
    import hashlib

    lines = []
    for name, data in wheels.items():
        (tmp_path / name).write_bytes(data)
        dist, version = name.split("-")[:2]
        lines += [f"{dist.replace('_', '-')}=={version} ; sys_platform == 'linux' \\",
                  f"    --hash=sha256:{hashlib.sha256(data).hexdigest()} \\",
                  f"    --hash=sha256:{'0' * 64}"]
    lock = tmp_path / "x.lock"
    lock.write_text("\n".join(lines) + "\n")
    return lock


def test_read_lock_parses_pins_markers_and_hashes_of_a_real_node_lock():
    from tfcluster import tfsupport

    pins = wheelhouse.read_lock(tfsupport.lock_file("tensorflow-cpu", "2.21.0"))
    assert len(pins[("tensorflow-cpu", "2.21.0")]) >= 1
    assert all(len(h) == 64 for hashes in pins.values() for h in hashes)
    assert {v for (name, v) in pins if name == "numpy"} >= {"2.4.6"}  # one entry per marker fork


def test_verify_accepts_the_locked_wheels_and_refuses_an_altered_one(tmp_path):
    import pytest

    from tfcluster.errors import TfclusterError

    house = tmp_path / "wh"
    house.mkdir()
    lock = _lock_for(house, **{"pkg_a-1.0-py3-none-any.whl": b"a", "pkg_b-2.0-py3-none-any.whl": b"b"})
    (house / "other-9.9-py3-none-any.whl").write_bytes(b"a wheel no lock pins: not installable, ignored")
    wheelhouse.verify(house, [lock])
    (house / "pkg_b-2.0-py3-none-any.whl").write_bytes(b"tampered")
    with pytest.raises(TfclusterError, match="pkg_b-2.0-py3-none-any.whl: its sha256 is not one"):
        wheelhouse.verify(house, [lock])


def test_ensure_downloads_each_lock_with_require_hashes_then_verifies(tmp_path, monkeypatch):
    """pip download is told to check hashes; what it left is checked again before the wheelhouse counts as
    complete; a complete one of the same locks is not downloaded again."""
    import subprocess

    import pytest

    from tfcluster import tfsupport
    from tfcluster.errors import TfclusterError

    locks = tmp_path / "locks"
    locks.mkdir()
    _lock_for(locks, **{"tensorflow_cpu-2.21.0-cp311-none-any.whl": b"tf"}).rename(
        locks / "tensorflow-cpu-2.21.0.txt")
    monkeypatch.setattr(tfsupport, "LOCKS", locks)
    monkeypatch.setenv("TFCLUSTER_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        dest = cmd[cmd.index("-d") + 1]
        wheel = "tensorflow_cpu-2.21.0-cp311-none-any.whl"
        (locks / wheel).replace(f"{dest}/{wheel}")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_pip)
    target = wheelhouse.ensure("2.21.0", ["tensorflow-cpu"], log=lambda *_: None)
    assert len(calls) == 1
    assert calls[0][-4:] == ["-r", str(locks / "tensorflow-cpu-2.21.0.txt"), "-d", str(target)]
    assert "--require-hashes" in calls[0] and "--only-binary=:all:" in calls[0]
    assert wheelhouse.ensure("2.21.0", ["tensorflow-cpu"], log=lambda *_: None) == target and len(calls) == 1
    # a wheel altered in the cache after a lock change: refused, the wheelhouse is not marked complete
    (target / "tensorflow_cpu-2.21.0-cp311-none-any.whl").write_bytes(b"tampered")
    (locks / "tensorflow-cpu-2.21.0.txt").write_text((locks / "tensorflow-cpu-2.21.0.txt").read_text() + "\n")
    monkeypatch.setattr(wheelhouse.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    with pytest.raises(TfclusterError, match="sha256 is not one"):
        wheelhouse.ensure("2.21.0", ["tensorflow-cpu"], log=lambda *_: None)
    with pytest.raises(TfclusterError, match="no lock file .*tensorflow-cpu-2.20.7.txt"):
        wheelhouse.ensure("2.20.7", ["tensorflow-cpu"], log=lambda *_: None)


def test_a_second_ensure_waits_for_the_one_filling_the_shared_wheelhouse(tmp_path, monkeypatch):
    """The cache is the machine's: while another checkout holds the wheelhouse's lock (filling it), ensure
    waits, then finds it complete and downloads nothing."""
    import fcntl
    import subprocess
    import threading
    import time

    from tfcluster import tfsupport

    locks = tmp_path / "locks"
    locks.mkdir()
    lock = locks / "tensorflow-cpu-2.21.0.txt"
    _lock_for(locks, **{"tensorflow_cpu-2.21.0-cp311-none-any.whl": b"tf"}).rename(lock)
    monkeypatch.setattr(tfsupport, "LOCKS", locks)
    monkeypatch.setenv("TFCLUSTER_CACHE", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(wheelhouse.subprocess, "run",
                        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    target = wheelhouse.path_for("2.21.0", ["tensorflow-cpu"])
    target.mkdir(parents=True)
    done = []
    with open(target.parent / f".{target.name}.lock", "w") as other:   # the other checkout, mid-download
        fcntl.flock(other, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: done.append(wheelhouse.ensure("2.21.0", ["tensorflow-cpu"],
                                                                               log=lambda *_: None)))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and calls == [] and done == []         # waiting, not downloading beside it
        (target / ".complete").write_text(f"{lock.name} {wheelhouse._sha256(lock)}\n")
    waiter.join(timeout=10)
    assert done == [target] and calls == []
