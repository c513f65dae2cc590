"""``down`` as every caller needs it: the guard that keeps a model that is not safe yet, the node logs
fetched before the nodes go, the destroy, and the run closed after it; for a cluster and its sweep groups."""

from __future__ import annotations

import contextlib

from . import groups, runrecord, training
from .cluster import down as destroy_cluster
from .cluster import load_spec, phase, say
from .config import RunSpec
from .errors import Busy, GuardError
from .paths import ClusterState, held_alone, lock_holder
from .providers.base import read_nodes
from .runrecord import RunState


def down_guard(cluster: str, force: bool) -> None:
    """Refuse to destroy a cluster whose run may hold the only copy of a model."""
    state = ClusterState(cluster)
    run = runrecord.read(state)
    if force or run.get("state") not in runrecord.OPEN:
        return
    if run["state"] == RunState.UNVERIFIED:
        why = (f"run {run['run_id']} published a model to {run['s3_prefix']} that has not been verified; "
               f"run 'make train CLUSTER={cluster}' to verify it")
    elif run["state"] == RunState.UNPUBLISHED:
        why = (f"run {run['run_id']} trained to step {run.get('held_step')} but could not store it in S3 "
               f"({run.get('held_reason')}); the only copy is on {run.get('held_on')} in "
               f"{run.get('held_path')}; fix the storage and run 'make train CLUSTER={cluster}' to publish it")
    else:
        why = (f"run {run['run_id']} is still marked as training, but no train of it is running (its controller "
               f"was stopped: 'make train CLUSTER={cluster}' resumes it); "
               f"'make status CLUSTER={cluster}' shows the nodes")
    raise GuardError(f"refusing to destroy cluster {cluster}: {why}, or 'make down FORCE=1' to destroy anyway")


def teardown(spec: RunSpec, force: bool) -> None:
    """`down` as every caller needs it: the guard, node logs off the nodes, destroy and prove, close the run;
    for the cluster and each of its sweep groups (every group's guard is checked before any is destroyed).
    Unless ``force``, it holds each cluster's train lock throughout (a train of one of them running, or the
    cluster's sweep: refused, :class:`Busy`), so no train starts on nodes going away."""
    extra = groups.extra(spec.cluster)
    with contextlib.ExitStack() as held:
        if not force:
            sweeping = lock_holder(ClusterState(spec.cluster).sweep_lock)
            if sweeping:
                raise Busy(f"refusing to destroy cluster {spec.cluster}: it runs a sweep ({sweeping}); Ctrl-C in "
                           f"its terminal stops it (its trials stay resumable), or 'make down FORCE=1' to destroy "
                           f"anyway")
            for cluster in (spec.cluster, *extra):
                held.enter_context(held_alone(ClusterState(cluster).trainer_lock, _training(cluster)))
        for cluster in (spec.cluster, *extra):
            down_guard(cluster, force)
        for cluster in (*extra, spec.cluster):
            fetch_logs_before_down(cluster)
            destroy_cluster(cluster, provider_name=spec.provider)
            close_run_after_down(cluster)
            if cluster != spec.cluster:
                groups.forget(spec.cluster, cluster)


def _training(cluster: str):
    def busy(holder: str) -> Busy:
        return Busy(f"refusing to destroy cluster {cluster}: another tfcluster process is using it ({holder}); "
                    f"'make status CLUSTER={cluster}' shows a train's progress, and Ctrl-C in its terminal stops "
                    f"it, or 'make down FORCE=1' to destroy anyway")

    return busy


def close_run_after_down(cluster: str) -> None:
    """The cluster is gone (proven): its run's tasks went with its nodes (``nodes_gone``: a later train on new
    nodes has none of them to stop or fetch logs from), and a run it left open can no longer be resumed on it."""
    state = ClusterState(cluster)
    run = runrecord.read(state)
    if not run:
        return
    run["nodes_gone"] = True
    if run.get("state") in runrecord.OPEN:
        run.update(state=RunState.ABANDONED, abandoned_from=run["state"])
    runrecord.write(state, run)


def fetch_logs_before_down(cluster: str) -> None:
    """Best effort: a cluster with a run gets its node logs fetched, and the tasks' credentials file removed
    (a run interrupted before its finish may have left it), before it is destroyed: the run's finish
    (:func:`tfcluster.training.stop_serving_and_fetch_logs`), whose stop of ps and workers ends their logs
    before the nodes go. Without a run
    of this cluster no task was started, so no node has the file."""
    state = ClusterState(cluster)
    run, spec = runrecord.read(state), (load_spec(state) if state.spec.exists() else None)
    if not run or not spec or not read_nodes(state.nodes):
        return
    if run.get("nodes_gone"):
        return  # the record is of a run on an earlier cluster of this name, taken down since
    if run.get("logs_fetched"):
        say(f"run {run['run_id']}: every node's log was fetched (and the credentials removed) when its tasks "
            f"ended: {state.logs / run['run_id']}")
        return
    with phase("stop ps and workers, fetch node logs and remove the tasks' credentials before teardown"):
        training.stop_serving_and_fetch_logs(state, run["run_id"], spec.node_total)
