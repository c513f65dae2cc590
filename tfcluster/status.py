"""What the tasks are doing, for ``make status`` (a line per node) and ``make logs`` (a node's log: from the
node while it answers, else the copy fetched at the run's end)."""

from __future__ import annotations

import sys

from . import remote, runrecord
from .errors import ConfigError, TfclusterError
from .paths import ClusterState
from .providers.base import Node, read_nodes


def task_states(state: ClusterState, nodes: list[Node]) -> dict[str, str]:
    out = {}
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
        if sup.get("restarts"):
            text += f" (restarts {sup['restarts']})"
        if n.role == "chief" and task:
            text += f", {task.get('phase', '?')} step {task.get('step', 0)}/{task.get('total', 0)}"
            if task.get("examples_per_sec"):
                text += f", {task['examples_per_sec']:.0f} examples/s"
        if task.get("data"):
            text += _stream_text(task["data"])
        out[n.name] = text + _notes_text(task.get("notes") or [])
    return out


def _notes_text(notes: list[str]) -> str:
    """The chief's notes for the user (a warning on its optimizer, say) in `make status`: a line each, below
    its node's row, as `train` printed them."""
    return "".join(f"\n    {note}" for note in notes)


def _stream_text(d: dict) -> str:
    """A worker's data stream in `make status`: rate, epoch, bytes read, and its error if it stopped."""
    if d.get("all_kept"):
        text = (f", data from its disk: its {d.get('files', 0)} files were downloaded once "
                f"({(d.get('bytes') or 0) / 1e6:.0f} MB), {d.get('reused', 0)} reads of them since (epoch "
                f"{d.get('epoch', 0)})")
    else:
        text = (f", data from S3 {d.get('mb_per_s') or 0:.1f} MB/s (epoch {d.get('epoch', 0)}, "
                f"{(d.get('bytes') or 0) / 1e6:.0f} MB read)")
    return text + (f", error: {d['error']}" if d.get("error") else "")


def show_log(cluster: str, node_name: str | None, lines: int = 200) -> int:
    state = ClusterState(cluster)
    nodes = {n.name: n for n in read_nodes(state.nodes)}
    run = runrecord.read(state)
    fetched_dir = state.logs / run.get("run_id", "-")
    if node_name is None or (node_name not in nodes and not (fetched_dir / node_name / "node.log").exists()):
        up = ", ".join(sorted(nodes))
        kept = ", ".join(sorted(p.parent.name for p in fetched_dir.glob("*/node.log")))
        known = (f"a node of cluster {cluster}: {up}" if up else
                 f"a node of cluster {cluster}'s last run, whose logs were fetched: {kept}" if kept else
                 f"a node of cluster {cluster}, which is not up and has no fetched log")
        raise ConfigError("node (make logs NODE=...)", node_name or "", known)
    if node_name in nodes:
        text = remote.task_log(state, nodes[node_name], lines)
        if text is not None:
            sys.stdout.write(text)
            return 0
    fetched = fetched_dir / node_name / "node.log"
    if fetched.exists():
        print(f"(node not reachable or without a log now; fetched log {fetched})")
        sys.stdout.write("\n".join(fetched.read_text(errors="replace").splitlines()[-lines:]) + "\n")
        return 0
    raise TfclusterError(f"node {node_name} does not answer (or has no log yet) and no log of it was fetched")
