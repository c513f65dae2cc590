"""Where things live: the repository's folders and a cluster's state under ``.tfcluster/<cluster>/``."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from .errors import TfclusterError

REPO = Path(__file__).resolve().parent.parent
ROLES_DIR = REPO / "roles"
PLAYBOOKS_DIR = REPO / "playbooks"
TERRAFORM_DIR = REPO / "terraform"
TRAIN_DIR = REPO / "train"
ANSIBLE_CFG = REPO / "ansible.cfg"


def state_root() -> Path:
    """Root of all run state; ``TFCLUSTER_HOME`` moves it (tests use this)."""
    return Path(os.environ.get("TFCLUSTER_HOME", REPO / ".tfcluster")).resolve()


def cache_root() -> Path:
    """Where what every cluster of this machine shares is kept: the base and node images, the apt cache, the
    wheelhouse, the job checks' stamps, IM's venv. Each is named by what it was made from (content keys,
    releases, lock files) and built under a lock, so every checkout of the project on the machine uses the
    same (a fresh clone bakes no image another one baked).

    ``$XDG_CACHE_HOME/tfcluster`` (``~/.cache/tfcluster``) by default; ``TFCLUSTER_CACHE`` moves it.
    """
    if os.environ.get("TFCLUSTER_CACHE"):
        return Path(os.environ["TFCLUSTER_CACHE"]).resolve()
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or "")
    base = xdg if xdg.is_absolute() else Path.home() / ".cache"    # a relative one is ignored (XDG's rule)
    return (base / "tfcluster").resolve()


T = TypeVar("T")


def made_once(lock: Path, found: Callable[[], T | None], make: Callable[[], T]) -> T:
    """What ``found()`` returns, else ``make()``'s result, made by one process at a time: a cache entry of the
    machine that another checkout or test worker may be making at the same moment. ``make`` runs holding an
    exclusive lock on the file ``lock``, and only if ``found()`` still returns None once the lock is held
    (whoever held it before may have made it)."""
    done = found()
    if done is not None:
        return done
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = found()
        return done if done is not None else make()


@contextlib.contextmanager
def held_alone(lock: Path, busy: Callable[[str], Exception]) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` for the block, or raise ``busy(holder)`` at once when another
    process holds it (``holder``: its pid and command line, as it wrote them). The lock goes with the process,
    however it ends."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(lock, os.O_RDWR | os.O_CREAT, 0o644), "r+") as held:
        for attempt in range(LOCK_TRIES):    # a few tries: lock_holder's look holds it for a moment
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == LOCK_TRIES - 1:
                    raise busy(held.read().strip() or "a process that did not say which") from None
                time.sleep(0.05)
        held.write(f"pid {os.getpid()}: tfcluster {' '.join(sys.argv[1:])}\n")     # only tfcluster takes them
        held.truncate()         # after the write: a reader sees the old holder or this one, never nothing
        held.flush()
        yield


#: tries (50 ms apart) to take a lock that another process may only be looking at
LOCK_TRIES = 5


def lock_holder(lock: Path) -> str | None:
    """Who holds ``lock`` (as :func:`held_alone` wrote it), or None when nobody does."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with open(fd) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "a process that did not say which"
        return None


def artifacts_root() -> Path:
    return Path(os.environ.get("TFCLUSTER_ARTIFACTS", REPO / "artifacts")).resolve()


class ClusterState:
    """The files of one cluster. ``down`` needs nothing but these."""

    def __init__(self, cluster: str, root: Path | None = None):
        self.cluster = cluster
        self.dir = (root or state_root()) / cluster

    @property
    def spec(self) -> Path:
        return self.dir / "spec.json"

    @property
    def nodes(self) -> Path:
        return self.dir / "nodes.json"

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def ssh_dir(self) -> Path:
        return self.dir / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def terraform_dir(self) -> Path:
        return self.dir / "terraform"

    @property
    def node_root(self) -> Path:
        """Local provider: per-node overlay directories."""
        return self.dir / "nodes"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def trainer_lock(self) -> Path:
        """Held by the one ``train`` of the cluster at a time (:func:`held_alone`). Beside the clusters' state,
        not in it: taking a lock creates no state of a cluster (``_locks``: cluster names start with a letter)."""
        return self.dir.parent / "_locks" / f"{self.cluster}.train"

    @property
    def sweep_lock(self) -> Path:
        """Held by the one sweep of the cluster (and its groups) at a time."""
        return self.dir.parent / "_locks" / f"{self.cluster}.sweep"

    @property
    def run(self) -> Path:
        """The current training run's record (run id, phase, published?)."""
        return self.dir / "run.json"

    @property
    def control_dir(self) -> Path:
        """SSH ControlPath sockets. A Unix socket path has at most 107 bytes and ssh adds a 17-character
        suffix to it while connecting, so the sockets cannot live under a deep state directory: they get a
        short per-cluster directory in the temp dir, named by a hash of the state directory."""
        digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"tfc-cp-{digest}"

    def ensure_control_dir(self) -> Path:
        """Create :attr:`control_dir` (0700), refusing one that is not a directory of ours."""
        path = self.control_dir
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise TfclusterError(f"{path}: exists but is not a private directory of this user "
                                  "(it holds SSH control sockets); remove it and retry")
        return path

    def exists(self) -> bool:
        return self.dir.is_dir()
