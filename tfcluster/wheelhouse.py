"""The controller-side wheelhouse: TensorFlow and the harness's packages, downloaded once.

Nodes install from their copy of it with ``pip --no-index``, so a cluster of N nodes downloads the
~270 MB TensorFlow wheel once, not N times, and nodes need no route to a package index. What is downloaded
is the node lock file of each package (``roles/tensorflow/files/locks/``, :func:`tfsupport.lock_file`):
pip downloads with ``--require-hashes``, :func:`verify` checks every wheel against the locks once more,
and the nodes install from the same lock with ``--require-hashes``, so a wheel altered in the cache or
on its way over the bridge is refused.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import platform
import re
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.utils import canonicalize_name

from . import tfsupport
from .errors import TfclusterError
from .paths import cache_root, made_once


def packages_for(gpus: list[int]) -> list[str]:
    """The TensorFlow packages nodes of this controller's platform install (the wheelhouse serves nodes
    like the controller; the tensorflow role picks one per node from the same table)."""
    return sorted({tfsupport.package_for(g, platform.machine()) for g in gpus})


def path_for(version: str, packages: list[str]) -> Path:
    kind = "+".join("gpu" if "cuda" in p else "cpu" for p in packages)
    return cache_root() / "_wheelhouse" / f"tf-{version}-{kind}-py{sys.version_info.major}{sys.version_info.minor}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def read_lock(path: Path) -> dict[tuple[str, str], set[str]]:
    """A hash-pinned requirements file: ``{(canonical name, version): {sha256, ...}}``."""
    pins: dict[tuple[str, str], set[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        m = _REQUIREMENT.match(line)
        if m:
            current = pins.setdefault((canonicalize_name(m.group(1)), m.group(2)), set())
        if current is not None:
            current.update(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return pins


def node_packages(version: str, gpus: list[int]) -> dict:
    """What the nodes of a run install (TensorFlow ``version`` on nodes with these GPU counts): ``{"packages":
    [canonical distribution names], "locks": [the lock files' names]}``, for the job check of the model
    module's imports (:func:`tfc_harness.prepare.check_imports`)."""
    locks = [tfsupport.lock_file(p, version) for p in packages_for(gpus)]
    names = sorted({name for lock in locks if lock.is_file() for name, _ in read_lock(lock)})
    return {"packages": names, "locks": [lock.name for lock in locks]}


def verify(directory: Path, locks: list[Path]) -> None:
    """Every wheel in ``directory`` of a version the locks pin must have one of the hashes they list."""
    pins: dict[tuple[str, str], set[str]] = {}
    for lock in locks:
        for key, hashes in read_lock(lock).items():
            pins.setdefault(key, set()).update(hashes)
    for wheel in sorted(directory.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        allowed = pins.get((canonicalize_name(name), version))
        if allowed is not None and _sha256(wheel) not in allowed:
            raise TfclusterError(f"{wheel}: its sha256 is not one the lock files "
                                 f"({', '.join(str(lock) for lock in locks)}) list: remove it and run again")


def ensure(version: str, packages: list[str] = ("tensorflow-cpu",), log=print) -> Path:
    """Download the wheels of each package's lock file (hash-checked) unless a complete wheelhouse of the
    same locks is there already; return its directory."""
    packages = list(packages)
    target = path_for(version, packages)
    marker = target / ".complete"
    locks = [tfsupport.lock_file(p, version) for p in packages]
    for lock in locks:
        if not lock.is_file():
            raise TfclusterError(f"no lock file {lock} for TensorFlow {version}: `make lock` writes it "
                                 "(scripts/lock.py --release)")
    wanted = [f"{lock.name} {_sha256(lock)}" for lock in locks]

    def download() -> Path:
        target.mkdir(parents=True, exist_ok=True)
        _download(target, locks, log)
        marker.write_text("\n".join(wanted) + "\n")
        return target

    def complete() -> bool:
        return marker.exists() and marker.read_text().splitlines() == wanted

    return made_once(target.parent / f".{target.name}.lock", lambda: target if complete() else None, download)


def _download(target: Path, locks: list[Path], log) -> None:
    """pip download what each lock pins into ``target`` (hash-checked), then check every wheel once more."""
    for lock in locks:
        log(f"downloading the wheels {lock.name} pins into {target} (once; wheels already there are checked)")
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
               "--require-hashes", "-r", str(lock), "-d", str(target)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise TfclusterError(f"could not download what {lock} pins: {res.stderr.strip()[-1500:]}")
    verify(target, locks)


@contextmanager
def serve(directory: Path, host: str) -> Iterator[str]:
    """Serve the wheelhouse over HTTP on host (the cluster bridge's address) while the block runs.

    Local nodes have no route beyond their bridge; pip on each of them reads the controller's
    wheelhouse from this short-lived server instead of a copy per node.
    """
    import http.server  # here: every command imports this module, few serve (~14 ms)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((host, 0), functools.partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def harness_bundle(train_dir: Path, dest_dir: Path, model_file: str = "") -> tuple[Path, str]:
    """A reproducible tar.gz of the harness (its sub-packages too) and the models (plus a user's model file),
    with their folders.

    The same sources give the same bytes, so the copy to the nodes is skipped when nothing changed.
    Returns the bundle's path and its content id.
    """
    members = sorted((p.relative_to(train_dir).as_posix(), p) for p in (train_dir / "tfc_harness").rglob("*.py"))
    members += sorted((f"models/{p.name}", p) for p in (train_dir / "models").glob("*.py"))
    if model_file:
        members.append((f"models/{Path(model_file).name}", Path(model_file)))
    contents = [(name, path.read_bytes()) for name, path in members]
    digest = hashlib.sha256(b"".join(name.encode() + b"\0" + data for name, data in contents)).hexdigest()[:16]
    contents.append((f".bundle-{digest}", digest.encode()))  # the node unpacks once per content id
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # its folders first, 0755: the node removes the previous bundle's before unpacking (roles/tf_node)
        for folder in sorted({parent for name, _ in contents for parent in Path(name).parents} - {Path(".")}):
            info = tarfile.TarInfo(folder.as_posix())
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name, data in contents:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    dest_dir.mkdir(parents=True, exist_ok=True)
    bundle = dest_dir / "harness.tar.gz"
    bundle.write_bytes(packed.getvalue())
    return bundle, digest
