"""The verifier's sandbox: the published SavedModel is the chief's code (a graph can read and write files), so
the controller evaluates it in a process that

- has no network (a network namespace of its own, with only a loopback that is down);
- sees every file system read-only, and of this machine's writable places only a private, empty ``/tmp``;
- runs as ``nobody`` (uid 65534) with no capabilities and ``no_new_privs``, in a PID namespace of its own;
- gets its inputs (the model, the test data, the user's module, the harness and the venv's packages) bound
  read-only under ``/tmp/sandbox``, so that none of the paths that lead to them (a home directory, the
  cluster's state, other clusters' keys) need be readable by it.

It needs ``unshare`` and ``setpriv`` (util-linux) and root, as the local provider does; run as another user,
it refuses (:class:`SandboxError`) rather than evaluate without it.  :func:`run` takes the evaluator's
arguments with host paths and maps them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

INSIDE = "/tmp/sandbox"
NOBODY = 65534

#: runs as root in the new namespaces: a private /tmp with the inputs bound read-only, every other mount
#: read-only, then the evaluator as nobody without capabilities. $1.. are "host|inside" binds, "--", the command.
SCRIPT = r"""
set -eu
# the new /tmp is made on /mnt first, so that inputs under the old /tmp can still be bound into it
T=/mnt
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$T"
mkdir -p "$T/sandbox" "$T/home"
chmod 0755 "$T/sandbox"
chown 65534:65534 "$T/home"
while [ "$1" != "--" ]; do
  src=${1%%|*}; dst="$T${1#*|/tmp}"; shift
  if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; : > "$dst"; fi
  mount --bind "$src" "$dst"
  mount -o remount,bind,ro "$dst"
done
shift
mount --move "$T" /tmp
awk '{print $5}' /proc/self/mountinfo | while read -r m; do
  case "$m" in /tmp|/tmp/*|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue ;; esac
  mount -o remount,bind,ro "$(printf '%b' "$m")" 2>/dev/null || true
done
exec setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all "$@"
"""


class SandboxError(RuntimeError):
    """The sandbox cannot be made here."""


def available() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if os.geteuid() != 0:
        return "it needs root (namespaces and a change of user), as the local provider does"
    missing = [tool for tool in ("unshare", "setpriv", "mount", "awk") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (util-linux)"
    return None if Path("/mnt").is_dir() else "/mnt (the new /tmp's mount point) does not exist"


def open_to_all(tree: Path) -> None:
    """Let every user read ``tree`` (files a+r, directories a+rx): for the caller's own copies of the inputs,
    which the sandbox's user (nobody) must read."""
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def base_python() -> str:
    """The interpreter the venv was made from (inside the sandbox, the venv's own path may be unreadable)."""
    return getattr(sys, "_base_executable", "") or sys.executable


def _command(module: str, args: list[str], binds: dict[str, str | os.PathLike], python_path: list[str]) -> list[str]:
    why = available()
    if why:
        raise SandboxError(f"cannot sandbox the evaluation of the published model: {why}")
    inside = {name: f"{INSIDE}/{name}" for name in binds}
    pairs = [f"{Path(path).resolve()}|{inside[name]}" for name, path in binds.items()]

    def mapped(text: str) -> str:
        for name, where in inside.items():
            text = text.replace("{" + name + "}", where)
        return text

    argv = [mapped(a) for a in args]
    path = ":".join(mapped(p) for p in python_path)
    child_env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/home", "PYTHONPATH": path, "PYTHONNOUSERSITE": "1",
                 "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = ["env", "-i", *(f"{k}={v}" for k, v in child_env.items()), base_python(), "-m", module, *argv]
    return ["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
            "--kill-child", "/bin/sh", "-c", SCRIPT, "sandbox", *pairs, "--", *command]


def run(module: str, args: list[str], binds: dict[str, str | os.PathLike], *, python_path: list[str],
        timeout_s: float) -> subprocess.CompletedProcess:
    """``python -m module *args`` in the sandbox.  ``binds`` maps a name to a host path, seen inside as
    ``/tmp/sandbox/<name>``; ``args`` and ``python_path`` may name them as ``{name}``."""
    return subprocess.run(_command(module, args, binds, python_path), capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)


def start(module: str, args: list[str], binds: dict[str, str | os.PathLike], *,
          python_path: list[str], nice: int = 0) -> subprocess.Popen:
    """:func:`run`'s process, started and left running with a pipe to its stdin (its output piped too), at
    ``nice`` (see :func:`renice`). A bound directory is bound as it is then: files put into it later are
    seen inside, read-only."""
    return subprocess.Popen(["nice", "-n", str(nice), *_command(module, args, binds, python_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def renice(pid: int, nice: int) -> None:
    """Every thread of ``pid`` and of its descendants to ``nice`` (a process's niceness is its threads':
    TensorFlow's pools started at the old one)."""
    pending = [pid]
    while pending:
        proc = Path(f"/proc/{pending.pop()}")
        try:
            threads = [int(t.name) for t in (proc / "task").iterdir()]
            for tid in threads:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                pending += [int(c) for c in (proc / "task" / str(tid) / "children").read_text().split()]
        except (OSError, ValueError):   # the process or a thread ended meanwhile
            continue
