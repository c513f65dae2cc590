"""A node's log and state as a run's end fetches them (over SSH, or ``playbooks/finish.yml``): one gzipped tar
per node, which the node's supervisor made (``tfc-supervise collect``), unpacked here beside it.

A node's archive is read as data: only regular members with the names the supervisor writes are taken, each
written to its own name in the node's directory of the run's logs, never to a path the archive names.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import zlib
from pathlib import Path

ARCHIVE = "collected.tar.gz"
#: the files a node's archive holds, with the most any of them may hold (tfc-supervise's COLLECTED: the
#: log's last 64 MiB and its first line, a state file up to 1 MiB)
NAMES = {"node.log": (64 << 20) + 4096, "status.json": 1 << 20, "supervisor.json": 1 << 20}


def unpack(run_logs: Path) -> list[str]:
    """Unpack every ``<node>/collected.tar.gz`` under ``run_logs`` into ``<node>/`` and remove it; the problems,
    one line each (an archive that cannot be read is kept as it is)."""
    problems = []
    for archive in sorted(run_logs.glob(f"*/{ARCHIVE}")):
        try:
            _unpack_one(archive)
        except (tarfile.TarError, OSError) as exc:
            problems.append(f"{archive}: not a readable archive of the node's log and state ({exc}); kept")
            continue
        archive.unlink()
    return problems


def read_json(path: Path) -> dict:
    """A state file as unpacked (``status.json``, ``supervisor.json``), or {} when it is missing or not an object
    of JSON (the node's task writes status.json: it is read as data)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def readable(data: bytes) -> bool:
    """Whether ``data`` reads as a gzipped tar to its end (what a node's archive is)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.getmembers()
    except (tarfile.TarError, OSError, EOFError, zlib.error):
        return False
    return True


def _unpack_one(archive: Path) -> None:
    taken = set()
    with tarfile.open(archive) as tar:
        for member in tar:
            if not (member.isfile() and member.name in NAMES) or member.name in taken:    # each name once
                continue
            taken.add(member.name)
            if member.size > NAMES[member.name]:    # never one of the supervisor's: not written out
                raise OSError(f"{member.name} holds {member.size} bytes, over the {NAMES[member.name]} "
                              f"the supervisor writes")
            target = archive.parent / member.name
            tmp = target.with_name(f".{member.name}.tmp")
            with tar.extractfile(member) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)
            os.replace(tmp, target)
