"""What the tasks are doing, for ``make status`` (a line per node) and ``make logs`` (a node's log: from the
node while it answers, else the copy fetched at the run's end)."""

from __future__ import annotations

import re
import sys

from . import remote, runrecord
from .errors import ConfigError, TfclusterError
from .paths import ClusterState, state_root
from .providers.base import Node, read_nodes


def task_states(state: ClusterState, nodes: list[Node]) -> dict[str, str]:
    """Each node's task as ``make status`` shows it: its supervisor's state, the chief's step, a worker's data
    stream, the chief's notes; a task its supervisor was not started with the latest run's deadline is marked
    as an earlier run's (the latest one's start was cut short). The deadline is the controller's number, which
    the node only keeps: no node clock is compared with the controller's."""
    out = {}
    deadline = runrecord.read(state).get("deadline")
    for n in nodes:
        try:
            got = remote.task_status(state, n, timeout=10)
        except remote.NodeCommandError as exc:
            out[n.name] = f"error: {exc}"
            continue
        if got is None:
            out[n.name] = "no answer"
            continue
        sup, task = got.get("supervisor") or {}, got.get("task") or {}
        text = sup.get("state", "idle")
        restarts = ([f"restarts {sup['restarts']}"] if sup.get("restarts") else []) + \
            ([f"not restarted: {sup['why']}"] if sup.get("why") else [])
        if restarts:
            text += f" ({'; '.join(restarts)})"
        if n.role == "chief" and task:
            text += f", {task.get('phase', '?')} step {task.get('step', 0)}/{task.get('total', 0)}"
            if task.get("examples_per_sec"):
                text += f", {task['examples_per_sec']:.0f} examples/s"
        if task.get("data"):
            text += _stream_text(task["data"])
        if deadline and sup.get("deadline") and abs(sup["deadline"] - deadline) > 0.01:
            text += " (an earlier run's task)"
        out[n.name] = text + _notes_text(task.get("notes") or [])
    return out


def _notes_text(notes: list[str]) -> str:
    """The chief's notes for the user (a warning on its optimizer, say) in `make status`: a line each, below
    its node's row, as `train` printed them."""
    return "".join(f"\n    {note}" for note in notes)


def _megabytes(count: int | None) -> str:
    """``12 MB``, ``0.4 MB``, ``20 kB``: a small data set's files are not "0 MB"."""
    count = count or 0
    if count >= 10e6 or not count:
        return f"{count / 1e6:.0f} MB"
    return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.0f} kB"


def _stream_text(d: dict) -> str:
    """A worker's data stream in `make status`: rate, epoch, bytes read, and its error if it stopped."""
    if d.get("all_kept"):
        files = d.get("files", 0)
        what = "its file was" if files == 1 else f"its {files} files were"
        text = (f", data from its disk: {what} downloaded once ({_megabytes(d.get('bytes'))}), "
                f"{d.get('reused', 0)} reads of {'it' if files == 1 else 'them'} since (epoch {d.get('epoch', 0)})")
    else:
        text = (f", data from S3 {d.get('mb_per_s') or 0:.1f} MB/s (epoch {d.get('epoch', 0)}, "
                f"{_megabytes(d.get('bytes'))} read)")
    return text + (f", error: {d['error']}" if d.get("error") else "")


def show_log(cluster: str, node_name: str | None, lines: int = 200) -> int:
    """Print a node of the cluster's (or of one of its sweep groups') log: the live one while the node
    answers, else the copy fetched at its last run's end."""
    places = [_node_log(c) for c in _with_groups(cluster)]
    found = _holding(places, node_name)
    named = _cluster_of(node_name)
    if found is None and named not in (None, cluster):     # CLUSTER left out (or another): the node's own cluster
        cluster, places = named, [_node_log(c) for c in _with_groups(named)]
        found = _holding(places, node_name)
        if found is not None:
            print(f"(node {node_name} of cluster {found['cluster']})")
    if node_name is None or found is None:
        raise ConfigError("node (make logs NODE=...)", node_name or "", _known_nodes(cluster, places))
    state, node = found["state"], found["nodes"].get(node_name)
    if node is not None:
        text = remote.task_log(state, node, lines)
        if text is not None:
            sys.stdout.write(text)
            return 0
    fetched = found["fetched"].get(node_name)
    if fetched is not None:
        print(f"(node not reachable or without a log now; fetched log {fetched})")
        sys.stdout.write("\n".join(fetched.read_text(errors="replace").splitlines()[-lines:]) + "\n")
        return 0
    raise TfclusterError(f"node {node_name} does not answer (or has no log yet) and no log of it was fetched")


def _holding(places: list[dict], node_name: str | None) -> dict | None:
    return next((where for where in places if node_name in where["nodes"] or node_name in where["fetched"]), None)


def _cluster_of(node_name: str | None) -> str | None:
    """The cluster a node's name says it is of (``<cluster>-<role>-<index>``), if its state is here."""
    m = re.fullmatch(r"(.+)-(?:ps|worker|chief)-\d+", node_name or "")
    return m.group(1) if m and ClusterState(m.group(1)).dir.is_dir() else None


def _with_groups(cluster: str) -> list[str]:
    """The cluster and its sweep groups (``<cluster>-g<k>``, :func:`tfcluster.groups.spec_for`) whose state is
    here: those up, and those taken down with their fetched logs (``down`` forgets a group once it is gone,
    so the state folders, not the group record, say which there are)."""
    group = re.compile(rf"{re.escape(cluster)}-g\d+")
    return [cluster, *sorted(p.name for p in state_root().glob(f"{cluster}-g*") if group.fullmatch(p.name))]


def _node_log(cluster: str) -> dict:
    """A cluster's nodes that are up, and the logs its last run fetched (by node name)."""
    state = ClusterState(cluster)
    fetched_dir = state.logs / runrecord.read(state).get("run_id", "-")
    return {"cluster": cluster, "state": state, "nodes": {n.name: n for n in read_nodes(state.nodes)},
            "fetched": {p.parent.name: p for p in fetched_dir.glob("*/node.log")}}


def _known_nodes(cluster: str, places: list[dict]) -> str:
    """What ``make logs NODE=`` may name: each group's nodes that are up, else its last run's fetched logs."""
    parts = []
    for where in places:
        if where["nodes"]:
            parts.append(f"a node of cluster {where['cluster']}: {', '.join(sorted(where['nodes']))}")
        elif where["fetched"]:
            parts.append(f"a node of cluster {where['cluster']}'s last run, whose logs were fetched: "
                         f"{', '.join(sorted(where['fetched']))}")
    return "; ".join(parts) or f"a node of cluster {cluster}, which is not up and has no fetched log"
