"""Memory limits of local nodes, as a VM's RAM: one memory cgroup per node holding every process of it.

A node's init joins its cgroup before it starts anything (:func:`enter`), so its sshd and everything Ansible
and the training task start through it are inside. A process of the node that allocates beyond the limit is
killed by the kernel's OOM killer, as on a VM of that size, while the rest of the node (its sshd) lives on;
swap is no way out (``memory.memsw.limit_in_bytes`` on cgroup v1, ``memory.swap.max`` 0 on v2).

Cgroups are named ``tfcluster/<cluster>/<node>`` (:func:`cluster_path`) under the memory hierarchy:
cgroup v2 where ``/sys/fs/cgroup/cgroup.controllers`` lists memory, else cgroup v1 at
``/sys/fs/cgroup/memory``. :func:`remove` ends what is left in one and removes it with the parents it
leaves empty.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from .errors import TfclusterError
from .poll import wait_until

CGROUP_FS = Path("/sys/fs/cgroup")
TOP = "tfcluster"
#: the range of provider_options.node_memory_mb (MiB)
MIN_MB, MAX_MB = 256, 65536
NO_CONTROLLER = (f"this machine has no writable memory cgroup controller (neither cgroup v2 with memory listed "
                 f"in {CGROUP_FS}/cgroup.controllers nor cgroup v1 at {CGROUP_FS}/memory)")


class CgroupError(TfclusterError):
    pass


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    root: Path


def hierarchy(fs: Path = CGROUP_FS) -> Hierarchy | None:
    """The memory hierarchy tfcluster can write to on this machine (v2 first), or None."""
    try:
        if "memory" in (fs / "cgroup.controllers").read_text().split():
            return Hierarchy(2, fs) if os.access(fs, os.W_OK) else None
    except OSError:
        pass
    v1 = fs / "memory"
    if (v1 / "memory.limit_in_bytes").is_file() and os.access(v1, os.W_OK):
        return Hierarchy(1, v1)
    return None


def cluster_path(cluster: str) -> str:
    """The cgroup of a cluster's nodes (each node's is below it, named after the node)."""
    return f"{TOP}/{cluster}"


def create(path: str, memory_mb: int, fs: Path = CGROUP_FS) -> Path:
    """Make the cgroup ``path`` (relative to the hierarchy) limited to memory_mb MiB without swap; its directory."""
    h = hierarchy(fs)
    if h is None:
        raise CgroupError(f"a memory limit was asked for, but {NO_CONTROLLER}")
    directory = h.root / path
    for attempt in range(3):  # a parent left empty may vanish under us (another cluster's remove)
        try:
            _make(h, directory)
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    limit = str(memory_mb * 1024 * 1024)
    if h.version == 2:
        _write(directory / "memory.max", limit)
        _write(directory / "memory.swap.max", "0", optional=True)
    else:
        _write(directory / "memory.memsw.limit_in_bytes", "-1", optional=True)  # never below the next value
        _write(directory / "memory.limit_in_bytes", limit)
        _write(directory / "memory.memsw.limit_in_bytes", limit, optional=True)
    return directory


def _make(h: Hierarchy, directory: Path) -> None:
    """mkdir -p; on v2 with the memory controller enabled for the children of the root and every parent."""
    if h.version == 1:
        directory.mkdir(parents=True, exist_ok=True)
        return
    node = h.root
    for part in directory.relative_to(h.root).parts:
        _write(node / "cgroup.subtree_control", "+memory")
        node = node / part
        node.mkdir(exist_ok=True)


def _write(path: Path, value: str, optional: bool = False) -> None:
    if optional and not path.exists():
        return
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value} to {path}: {exc.strerror or exc}") from None


def enter(directory: Path) -> None:
    """Move the calling process into the cgroup; its children are born there (a ``preexec_fn``)."""
    (directory / "cgroup.procs").write_text(f"{os.getpid()}\n")


def remove(path: str, fs: Path = CGROUP_FS) -> list[Path]:
    """End every process left in cgroup ``path`` and below it, remove those cgroups (v1 or v2) and the parents
    up to ``tfcluster`` they leave empty; returns the cgroups removed (none where there were none)."""
    removed = []
    for root in (fs, fs / "memory"):
        top = root / path
        if not top.is_dir() or top == root:
            continue
        for directory, _, _ in os.walk(top, topdown=False):
            if not wait_until(lambda d=Path(directory): _clear(d), 10, 0.05):
                raise CgroupError(f"cgroup {directory}: processes {_procs(Path(directory))} survived SIGKILL")
            removed.append(Path(directory))
        for parent in top.parents:
            if parent == root or not _rmdir(parent):
                break
    return removed


def _procs(directory: Path) -> list[int]:
    try:
        return [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _clear(directory: Path) -> bool:
    """SIGKILL what the cgroup holds and try to remove it: whether it is gone."""
    for pid in _procs(directory):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return _rmdir(directory)


def _rmdir(directory: Path) -> bool:
    try:
        directory.rmdir()
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY: processes (or dying ones) still in it; ENOTEMPTY: child cgroups
        return False
    return True


def leftovers(cluster: str, fs: Path = CGROUP_FS) -> list[str]:
    """The cluster's cgroups still present (v1 or v2)."""
    return [str(root / cluster_path(cluster)) for root in (fs, fs / "memory")
            if (root / cluster_path(cluster)).is_dir()]
