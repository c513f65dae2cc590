"""configure, train, publish/verify: the run on an up cluster.

The run's record and its states are in :mod:`tfcluster.runrecord`; commands on the nodes outside
Ansible in :mod:`tfcluster.remote`; its progress lines in :mod:`tfcluster.progress`; ``down`` in
:mod:`tfcluster.teardown`; ``status`` and ``logs`` in :mod:`tfcluster.status`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from tfc_harness import strategies

from . import access, ansible_run, collected, configured, job, progress, remote, runrecord, store, wheelhouse
from .cluster import check_fits_the_cluster_up, ctrl_c_ignored, phase, say, used_alone
from .config import ROLES, RunSpec
from .errors import TfclusterError
from .paths import TRAIN_DIR, ClusterState, artifacts_root
from .providers import get_provider
from .providers.base import Node, read_nodes
from .runrecord import RunState


# -- helpers -----------------------------------------------------------------------------------
def _nodes_or_fail(state: ClusterState) -> list[Node]:
    nodes = read_nodes(state.nodes)
    if not nodes:
        raise TfclusterError(f"cluster {state.cluster} is not up (no {state.nodes}); run 'make up' first")
    return nodes


def s3_env(spec: RunSpec) -> dict[str, str]:
    """Credentials for the nodes' env file, passed to Ansible through its environment only, when the tasks
    start (tf_node writes them on the nodes whose task uses storage; the run's finish removes them)."""
    env = store.process_env(spec)
    return {"TFCLUSTER_S3_ACCESS_KEY_ID": env.get("AWS_ACCESS_KEY_ID", ""),
            "TFCLUSTER_S3_SECRET_ACCESS_KEY": env.get("AWS_SECRET_ACCESS_KEY", "")}


def _extra_vars(state: ClusterState, name: str, data: dict) -> Path:
    (state.dir / "vars").mkdir(exist_ok=True)
    path = state.dir / "vars" / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


# -- configure ---------------------------------------------------------------------------------
def configure(spec: RunSpec, full: bool = False) -> None:
    """Run playbooks/site.yml on every node (idempotent). Skipped when every node was configured with exactly
    this content already, or its image holds it (:mod:`tfcluster.configured`), unless ``full``. The run's own
    part (the harness bundle with the user's model) goes to the nodes when the run starts (:func:`_run_tasks`)."""
    state = ClusterState(spec.cluster)
    nodes = _nodes_or_fail(state)
    provider = get_provider(spec.provider, state)
    offline = provider.offline_nodes(spec)
    wheels = None
    if offline:
        with phase("prepare the wheelhouse"):
            wheels = wheelhouse.ensure(spec.tensorflow.version,
                                       wheelhouse.packages_for([n.gpus for n in nodes]), log=say)
    image_keys = provider.image_keys(spec)
    variables = {
        "tensorflow_version": spec.tensorflow.version,
        "tensorflow_source": "wheelhouse" if offline else "index",
        "tensorflow_wheelhouse_src": str(wheels or ""),
        "tfcluster_image_keys": image_keys,
    }
    variables["tfcluster_configure_digest"] = wanted = configured.digest(state, variables)
    before = state.dir / "vars" / "configure-vars.json"   # written by an earlier configure of these nodes
    earlier = before.exists() and before.stat().st_mtime > state.nodes.stat().st_mtime
    if not full and (earlier or image_keys):   # nodes fresh from a bare image have neither stamp nor key
        with phase(f"check whether {len(nodes)} nodes are configured with this content (digest {wanted}, "
                   "or their image's key)"):
            current = configured.up_to_date(state, nodes, wanted, image_keys)
        if current:
            say("every node is configured with this content already (its image holds it, or its last configure "
                "applied it): nothing to change ('tfcluster configure --full' runs playbooks/site.yml anyway)")
            return
    state.logs.mkdir(parents=True, exist_ok=True)
    host = provider.wheelhouse_host(spec)
    with phase(f"configure {len(nodes)} nodes (playbooks/site.yml)"), \
            (wheelhouse.serve(wheels, host) if host else nullcontext()) as url:
        if url:
            variables["tensorflow_wheelhouse_url"] = url
        extra = _extra_vars(state, "configure-vars.json", variables)
        recap = ansible_run.playbook(state, "site.yml", extra, forks=len(nodes),
                                     log_file=state.logs / "configure.log")
    ansible_run.check_reported(recap, [n.name for n in nodes], "configure")


# -- train -------------------------------------------------------------------------------------
def run_settings(spec: RunSpec, run_id: str, run: dict) -> dict:
    """The settings every node gets (``run`` holds what :func:`tfcluster.job.prepare` found: the data)."""
    prefix = access.run_prefix(spec, run_id)
    return {
        "run_id": run_id,
        "model_module": job.model_name(spec),
        "hparams": spec.training.hparams,
        "data": run.get("settings_data"),
        "strategy": spec.strategy,
        "steps": spec.training.steps,
        "batch_size": spec.training.batch_size,
        "learning_rate": spec.training.learning_rate,
        "checkpoint_every": spec.training.checkpoint_every,
        "checkpoint_min_interval_s": spec.training.checkpoint_min_interval_seconds,
        "max_runtime_s": spec.max_runtime_minutes * 60,
        "start_timeout_s": spec.training.start_timeout_seconds,
        "stall_timeout_s": spec.training.stall_timeout_seconds,
        "s3": {
            "endpoint": store.endpoint_for(spec),
            "region": spec.storage.region,
            "bucket": spec.storage.bucket,
            "run_prefix": prefix,
            "checkpoint_prefix": f"{prefix}/checkpoints",
            "dataset_prefix": run.get("dataset_prefix") or job.dataset_base(spec),
            "whole_object_gets": store.is_local_store(spec),
        },
    }


#: after a Ctrl-C, how long the chief's stop first waits for its task to save the step it reached and end (a
#: preemption notice's save: the next chunk's end, a checkpoint written and uploaded); then it is stopped anyway
SAVE_BEFORE_STOP_S = 60


def stop_serving_and_fetch_logs(state: ClusterState, run_id: str, forks: int, console: bool = True,
                                stop_chief: bool = False, save_first: bool = False) -> bool:
    """Stop ps and workers (``stop_chief``: every task, as after a Ctrl-C or a failure; ``save_first``: the
    chief first saves the step it reached, for :data:`SAVE_BEFORE_STOP_S` at most), fetch every node's log
    and state to .tfcluster/<cluster>/logs/<run-id>/ and remove the tasks' credentials file; best effort: a
    failure is reported, not raised. True when every node's log was fetched. ``console=False``: beside other
    work that has the console, out of reach of its Ctrl-C, and the playbook's output only in train.log.

    A run's usual end goes over the cluster's SSH masters (:func:`_finish_over_ssh`); after a Ctrl-C or a
    failure (``stop_chief``), or on the nodes where that failed, playbooks/finish.yml does it, with its
    chief-first stop and its rescue (the credentials removed, the task stopped where the supervisor's finish
    fails)."""
    dest = state.logs / run_id
    dest.mkdir(parents=True, exist_ok=True)
    nodes = read_nodes(state.nodes)
    left = nodes if stop_chief else _finish_over_ssh(state, nodes, dest, own_session=not console)
    fetched = True
    if left:
        extra = _extra_vars(state, "finish-vars.json", {"tf_node_logs_dest": str(dest),
                                                        "tfcluster_stop_chief": stop_chief,
                                                        "tfcluster_stop_saves": SAVE_BEFORE_STOP_S if save_first
                                                        else 0})
        try:
            ansible_run.playbook(state, "finish.yml", extra, forks=forks, log_file=state.logs / "train.log",
                                 console=console, mitogen=False,
                                 limit=None if left == nodes else [*(n.name for n in left), "localhost"])
        except TfclusterError as exc:
            say(f"warning: could not fetch every node's log: {exc}")
            fetched = False
    problems = collected.unpack(dest)    # each node's one archive, also those fetched before a failure
    for problem in problems:
        say(f"warning: {problem}")
    return fetched and not problems


def _finish_over_ssh(state: ClusterState, nodes: list[Node], dest: Path, own_session: bool) -> list[Node]:
    """A run's usual end without Ansible's start (~0.3 s on 4 local nodes against ~3.5 s for
    playbooks/finish.yml): on every node at once, the supervisor's finish (the one command of
    roles/tf_node/tasks/finish.yml: stop the task but the chief's, remove its credentials file, archive its log
    and state), then that archive read into ``dest/<node>/`` (``own_session``: :func:`remote.call`'s). Returns
    the nodes where either failed, for the playbook; train.log says what each printed. A node that does not
    answer costs its wait here before the playbook's own: SSH's connect timeout (10 s) for a new connection,
    the master's keep-alives (~30 s) for one that went silent, :data:`remote.FINISH_TIMEOUT` for a node that
    answers and then hangs (whose finish may then still run beside the playbook's)."""
    def one(node: Node) -> tuple[bool, str]:
        try:
            res = remote.run(state, node, remote.finish_command(stop=node.role != "chief"), remote.FINISH_TIMEOUT,
                             own_session=own_session)
            if res is None or res.returncode != 0:
                said = "no answer" if res is None else f"exit {res.returncode}: {(res.stderr or res.stdout).strip()}"
                return False, f"finish failed ({said[-500:]})"
            archive = remote.read_archive(state, node, own_session=own_session)
            if archive is None or not collected.readable(archive):
                return False, f"{res.stdout.strip()}\nno readable archive of its log and state"
            (dest / node.name).mkdir(exist_ok=True)
            (dest / node.name / collected.ARCHIVE).write_bytes(archive)
            return True, res.stdout.strip()
        except Exception as exc:      # e.g. a full disk here: the playbook tries, and says what fails
            return False, f"{type(exc).__name__}: {exc}"

    done = remote.on_each(nodes, one)
    _note_in_train_log(state, "".join(f"finish over ssh: {name}: {'ok' if ok else 'FAILED'}\n"
                                      + "".join(f"    {line}\n" for line in said.splitlines())
                                      for name, (ok, said) in done.items()))
    return [n for n in nodes if not done[n.name][0]]


def _note_in_train_log(state: ClusterState, text: str) -> None:
    """Append ``text`` to the cluster's train.log (what the end over SSH did), if it can be written: the log is a
    record of it, not a condition of it."""
    try:
        with open(state.logs / "train.log", "a") as log:
            log.write(text)
    except OSError:
        pass


def train(spec: RunSpec, configure_first: bool = True, trial: str = "") -> dict:
    """Check the job and its data, configure, start the tasks, wait with progress, stop ps/workers, fetch
    logs, verify. ``trial`` (``<sweep>/<trial id>``) names a sweep's trial: the run carries it, and resumes
    only a run of the same trial. One ``train`` of a cluster at a time: a second is refused (Busy), and so is
    one of a cluster a sweep runs on, but the sweep's own trials."""
    state = ClusterState(spec.cluster)
    nodes = _nodes_or_fail(state)
    with used_alone(spec.cluster, "a train now would stop its tasks or train on nodes going away",
                    by_sweep=bool(trial)):
        return _train(spec, state, nodes, configure_first, trial)


def _train(spec: RunSpec, state: ClusterState, nodes: list[Node], configure_first: bool, trial: str) -> dict:
    _check_can_train(spec, state)
    run = runrecord.read(state)
    if run.get("state") == RunState.UNVERIFIED:
        say(f"run {run['run_id']} was published but not verified yet: verifying it")
        if run.get("logs_fetched") is False:   # its finish was cut short: tasks may still serve, keys be there
            _finish(spec, state, nodes, run, stop_chief=False)
        return verify(spec, run)
    with phase("check the training job and its data"):   # before the slow configure: bad data fails fast
        prepared = job.prepare(spec, every_hparam_read=not trial)   # a sweep's trial: checked over all trials
        say(_data_line(spec, prepared))
    if run.get("state") in runrecord.RESUMABLE and run.get("logs_fetched") is not True and \
            not run.get("nodes_gone"):
        # its finish never ran (a lost controller) or failed: its tasks may still run, and each node's next
        # start begins a new log (the old one kept as node.log.1 until the start after): fetch them now. Not
        # once down took its nodes (these are new ones: none of its tasks is on them)
        say(f"run {run['run_id']} is '{run['state']}' without every node's log fetched: stopping its tasks "
            f"and fetching them first")
        # no save first: these nodes may run an earlier tfcluster's supervisor (configure comes after this)
        _finish(spec, state, nodes, run, stop_chief=True)
    if configure_first:
        configure(spec)
    run, settings = _open_run(spec, state, run, prepared, trial)
    if run["resumed"] and _published(spec, settings):
        # stopped (Ctrl-C, a lost controller) after the chief had published: the model is whole in S3, and a
        # chief started again would refuse to publish over it. Verify it instead of training again.
        run["state"] = RunState.UNVERIFIED
        runrecord.write(state, run)
        say(f"run {run['run_id']} was published before it was stopped: verifying it instead of training again")
        return verify(spec, run)
    kept = keep_earlier_attempt_logs(state, run["run_id"]) if run["resumed"] else None
    if kept:    # its tasks start again: each node begins a new log, fetched to the same folder at the end
        say(f"the node logs of run {run['run_id']}'s earlier attempt: {kept}")
    with _AheadEvaluator(_local_copy(spec, run)) as ahead:    # its TensorFlow import beside the tasks' start
        final = _run_tasks(spec, state, nodes, run, settings)
        return _conclude(spec, state, nodes, run, final, ahead.warm)


class _AheadEvaluator:
    """The verifier's evaluator (``tfc_harness.verify.WarmEvaluator``), started as the run's tasks start: its
    TensorFlow import (~3 s of CPU here, at nice 19) overlaps playbooks/train.yml, which leaves the cores
    partly idle between its SSH round trips, and is then not between the chief's exit and 'model verified'.
    Not later: an import during the training loop slowed the loop by about what it saved (``make bench``,
    digits under parameter_server, 2 runs each: loop 6.5/9.5 s against 5.1/6.0 s; at nice 19, 7.6/5.7 s
    against 5.5/5.0 s). Measured on 4 local nodes (2026-11-29, interleaved 200-step digits trains), against
    an evaluator started once the loop had ended: on a warm cluster (6 pairs, the finish by playbook in both)
    verify 1.5-2.3 s against 4.8-5.3 s, the whole `train` 17.5 s against 18.4 s on average; a fresh cluster's
    first train (4 pairs, the finish over SSH in both) verify 1.2-1.4 s against 2.2-3.1 s, starting the tasks
    10.2 s against 9.3 s, the whole `train` 19.7 s against 20.8 s. It holds ~500 MB of the controller's memory
    until then. None where the sandbox cannot run (the verification then says why); ended whatever happens."""

    def __init__(self, dest: Path):
        self.dest, self.warm = dest, None

    def start(self) -> None:
        from tfc_harness import sandbox
        from tfc_harness import verify as harness_verify

        if self.warm is None and sandbox.available() is None:
            try:
                self.warm = harness_verify.WarmEvaluator(self.dest)
            except OSError as exc:      # the verification starts its own evaluator instead
                say(f"warning: could not start the evaluator ahead of verification ({exc}); it starts one then")

    def __enter__(self) -> _AheadEvaluator:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.warm is not None:
            self.warm.close()


def _published(spec: RunSpec, settings: dict) -> bool:
    from tfc_harness import publish

    try:
        return publish.published(store.client(spec), spec.storage.bucket, settings["s3"]["run_prefix"])
    except Exception:   # S3 unreachable now: the chief finds out itself (and refuses to publish twice)
        return False


def _checkpoint_reached(spec: RunSpec, run_id: str) -> int:
    """The step of the run's newest checkpoint in S3 (0: none, or S3 cannot tell now: the chief finds out)."""
    from tfc_harness import checkpoints

    prefix = run_settings(spec, run_id, {})["s3"]["checkpoint_prefix"]
    try:    # one try, quietly: S3 failing now is the chief's to find out (it refuses a checkpoint beyond steps)
        steps = checkpoints.saved_steps(store.client(spec), spec.storage.bucket, prefix, tries=1, log=None)
    except Exception:
        return 0
    return steps[-1] if steps else 0


def _check_can_train(spec: RunSpec, state: ClusterState) -> None:
    """The nodes that are up were made for this provider, strategy and shape, and (where a cloud identity
    limits them) were granted the storage this run uses; the local store, where the run uses it, is running."""
    up_spec = check_fits_the_cluster_up(spec, state)
    if up_spec and get_provider(spec.provider, state).limits_storage_access:
        access.check_granted(access.storage_access(up_spec), access.storage_access(spec), spec.cluster)
    if store.is_local_store(spec) and not store.is_running():
        raise TfclusterError(f"the local S3 store at {store.local_endpoint()} is not running ('make clean' stops it, "
                             "and its objects go with it: data uploaded to it, checkpoints); '.venv/bin/python -m "
                             "tfcluster store start' starts it again (empty), then upload your data again if it "
                             "was there, and 'make train'")


#: fingerprint keys that records of earlier tfcluster releases lack: such a run still resumes
FINGERPRINT_ADDED = frozenset({"learning_rate"})


def _open_run(spec: RunSpec, state: ClusterState, previous: dict, prepared: dict,
              trial: str = "") -> tuple[dict, dict]:
    """Resume the previous run when it can be (same model, batch size, learning rate, hparams and data, as
    ``prepared`` by :func:`tfcluster.job.prepare`; its newest checkpoint in S3 not past ``training.steps``, or
    its model published or held), else start one; write the record. Returns the record and the nodes'
    settings."""
    # the learning rate too: a checkpoint restores the optimizer's, so a resume could not change it
    fingerprint = {"model": job.model_name(spec), "module_sha256": job.module_sha256(spec),
                   "batch_size": spec.training.batch_size, "learning_rate": spec.training.learning_rate,
                   "hparams": spec.training.hparams, "data": _data_identity(prepared["describe"])}
    if trial:   # a sweep's trial resumes only itself (trials differ in values the other keys do not cover)
        fingerprint["trial"] = trial
    resume = previous.get("state") in runrecord.RESUMABLE
    before = previous.get("fingerprint", fingerprint)
    changed = [k for k in {*before, *fingerprint} if before.get(k) != fingerprint.get(k)
               and not (k in FINGERPRINT_ADDED and k not in before)]
    if resume and changed:
        say(f"run {previous['run_id']} differs in {', '.join(sorted(changed))}; starting a new run instead of "
            f"resuming")
        resume = False
    if resume and previous.get("state") != RunState.UNPUBLISHED:    # (a held model: its chief publishes it)
        reached = _checkpoint_reached(spec, previous["run_id"])
        if reached > spec.training.steps and not _published(spec, run_settings(spec, previous["run_id"], {})):
            # its chief would refuse the checkpoint, be restarted and refuse again
            say(f"run {previous['run_id']} reached step {reached} (its checkpoint in S3), beyond training.steps "
                f"{spec.training.steps}; starting a new run instead of resuming (its checkpoints stay in S3)")
            resume = False
    run_id = previous["run_id"] if resume else runrecord.new_id()
    run = {"run_id": run_id, "state": RunState.STARTED, "started": time.time(), "trial": trial,
           "resumed": resume, "fingerprint": fingerprint, "data": prepared["describe"],
           "settings_data": prepared["data"], "dataset_prefix": prepared["dataset_prefix"]}
    settings = run_settings(spec, run_id, run)
    run.update(steps=settings["steps"], s3_prefix=f"s3://{spec.storage.bucket}/{settings['s3']['run_prefix']}/",
               deadline=time.time() + settings["max_runtime_s"])
    runrecord.write(state, run)
    say(("resuming" if resume else "starting") + f" run {run_id}: {settings['steps']} steps on "
        f"{roles_text(spec)} ({spec.strategy}); model → {run['s3_prefix']}")
    return run, settings


def keep_earlier_attempt_logs(state: ClusterState, run_id: str) -> Path | None:
    """A run resumed: the node logs fetched when its earlier attempt ended move to
    ``logs/<run-id>/attempt-<n>/`` (the resumed tasks' logs are fetched to ``logs/<run-id>/`` again, and each
    node starts a new log). Returns where they went, or None when none were fetched."""
    dest = state.logs / run_id
    folders = [p for p in dest.iterdir() if p.is_dir()] if dest.is_dir() else []
    attempts = {p: int(p.name.removeprefix("attempt-")) for p in folders if re.fullmatch(r"attempt-\d+", p.name)}
    nodes = sorted(p for p in folders if p not in attempts and p.name.startswith(f"{state.cluster}-"))
    if not nodes:
        return None
    kept = dest / f"attempt-{max(attempts.values(), default=0) + 1}"
    kept.mkdir()
    for node in nodes:
        node.rename(kept / node.name)
    return kept


def roles_text(spec: RunSpec) -> str:
    """``1 ps, 2 workers, 1 chief``: the nodes of each role the strategy uses."""
    return ", ".join(f"{spec.count(r)} {r}{'s' if r == 'worker' and spec.count(r) != 1 else ''}"
                     for r in ROLES if spec.count(r))


def _data_identity(describe: dict) -> str:
    """One hash naming exactly the data a run uses: the arrays' sha256, or every file with its ETag and how
    they are read (format, label column, header)."""
    if describe["source"] == "arrays":
        return describe["sha256"]
    import hashlib

    return hashlib.sha256(json.dumps(describe, sort_keys=True).encode()).hexdigest()


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _readers(spec: RunSpec) -> str:
    """The tasks that read the training files: ``2 workers``, or ``3 tasks (chief, worker)``."""
    jobs = strategies.TRAINING_JOBS[spec.strategy]
    n = strategies.training_task_count(spec.strategy, {r: spec.count(r) for r in ROLES})
    return f"{n} workers" if jobs == ("worker",) else f"{n} tasks ({', '.join(jobs)})"


def _data_line(spec: RunSpec, prepared: dict) -> str:
    d = prepared["describe"]
    if d["source"] == "arrays":
        return (f"data: make_dataset() of {job.model_name(spec)}, {d['rows']['train']} training and "
                f"{d['rows']['test']} test examples, sha256 {d['sha256'][:12]}, s3://{d['bucket']}/{d['prefix']}/ "
                + ("uploaded" if prepared.get("uploaded") else "already there (same content)")
                + ("; the model's check on it passed before" if prepared.get("probe") == "cached" else ""))
    return (f"data: {job.files_text(d['train'], 'training')} ({_size(sum(f['size'] for f in d['train']))}) and "
            f"{job.files_text(d['test'], 'test')} ({d['format']}) in s3://{d['bucket']}/, spread over {_readers(spec)}")


#: a stand-in instance metadata service speaking AWS's API (tests inject a spot notice through it)
METADATA_URL_ENV = "TFCLUSTER_METADATA_URL"


def preemption_vars(provider) -> dict:
    """What the nodes' supervisors watch for a preemption notice: the provider's metadata, or a stand-in."""
    url = os.environ.get(METADATA_URL_ENV, "")
    return {"tf_node_preemption_notice": provider.preemption_notice or ("aws" if url else ""),
            "tf_node_metadata_url": url}


def _run_tasks(spec: RunSpec, state: ClusterState, nodes: list[Node], run: dict, settings: dict) -> dict:
    """Start ps and workers, then the chief; follow the chief until its task ends. On Ctrl-C or a failure
    every task is stopped and the logs fetched before the error goes on."""
    provider = get_provider(spec.provider, state)
    model = spec.training.model
    bundle, bundle_id = wheelhouse.harness_bundle(TRAIN_DIR, state.dir / "vars",
                                                  model if model.endswith(".py") else "")
    extra = _extra_vars(state, "train-vars.json", {"tf_node_run": settings, "tf_node_deadline": run["deadline"],
                                                   "tf_node_bundle": str(bundle), "tf_node_bundle_id": bundle_id,
                                                   "tf_node_max_restarts": spec.training.max_restarts,
                                                   "tf_node_vm_halt_minutes": provider.vm_halt_minutes(spec),
                                                   "tf_node_threads": provider.task_threads(spec),
                                                   "tf_node_warm_start": provider.warm_start(spec),
                                                   **preemption_vars(provider)})
    chief = next(n for n in nodes if n.role == "chief")
    try:
        with phase(f"start the tasks: {roles_text(spec)}, the chief last "
                   f"(playbooks/train.yml, harness {bundle_id})"):
            recap = ansible_run.playbook(state, "train.yml", extra, forks=len(nodes),
                                         log_file=state.logs / "train.log", env=s3_env(spec))
            ansible_run.check_reported(recap, [n.name for n in nodes], "start")
        with phase("training"):
            readers = strategies.TRAINING_JOBS[spec.strategy]     # the tasks that stream their own files
            streamers = [n for n in nodes if n.role in readers] if settings.get("data") else []
            return progress.wait_for_chief(state, chief, settings["max_runtime_s"] + 120, streamers=streamers)
    except (KeyboardInterrupt, TfclusterError) as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        run["state"] = RunState.INTERRUPTED if interrupted else RunState.FAILED
        runrecord.write(state, run)
        if not interrupted:
            _finish(spec, state, nodes, run, stop_chief=True)
            raise
        say(f"interrupted: the chief saves the step it reached (at most {SAVE_BEFORE_STOP_S} s), then every task "
            "stops and the logs are fetched; Ctrl-C is ignored until this is done")
        # a second Ctrl-C (an impatient user, a wrapper passing the signal on) must not cut the stop short:
        # the chief would train on, unattended, and publish a model no train verifies
        with ctrl_c_ignored():
            _save_and_stop_chief(state, chief)
            # the playbook's chief play saves first too: for a chief the command above did not reach
            logs = _finish(spec, state, nodes, run, stop_chief=True, save_first=True)
            _say_where_it_resumes(state, run, logs / chief.name)
        raise


def _save_and_stop_chief(state: ClusterState, chief: Node) -> None:
    """After a Ctrl-C, the chief's stop that saves first, over its SSH master at once: through
    playbooks/finish.yml the notice came only after Ansible's start (3-6 s on a loaded machine), while the
    chief trained on and, under multi_worker_mirrored, a chief paused that long (a test's) broke its workers'
    collectives. Best effort: what fails here (train.log says what) the playbook's chief play does."""
    try:
        res = remote.run(state, chief, remote.save_and_stop_command(SAVE_BEFORE_STOP_S), SAVE_BEFORE_STOP_S + 30)
        said = "no answer" if res is None else f"exit {res.returncode}: {(res.stdout + res.stderr).strip()}"
    except Exception as exc:      # e.g. the node's address gone: the playbook tries, and says what fails
        said = f"{type(exc).__name__}: {exc}"
    _note_in_train_log(state, f"save and stop over ssh: {chief.name}: {said[-1000:]}\n")


def _say_where_it_resumes(state: ClusterState, run: dict, chief_logs: Path) -> None:
    """After a Ctrl-C's stop, what the next train does, from the chief's status.json of this run (one an earlier
    run left is not this run's): resume from the step the chief saved before it ended (recorded as
    ``stopped_step``), verify the model it had published, or resume from the newest checkpoint there is."""
    task = collected.read_json(chief_logs / "status.json")
    if task.get("run_id") != run["run_id"]:
        task = {}
    phase, step = task.get("phase"), task.get("step")
    if phase == "done":
        say(f"the chief had published run {run['run_id']}'s model before the stop reached it: the next 'make train' "
            "of this cluster verifies it")
        return
    if phase == "preempted" and isinstance(step, int):
        run["stopped_step"] = step
        runrecord.write(state, run)
        where = f"step {step}, which the chief saved before it stopped"
    elif phase in ("evaluating", "publishing"):
        where = f"the newest checkpoint in S3 (the chief had trained every step and was {phase} when it was stopped)"
    elif not task:
        where = "the newest checkpoint in S3 (no state of this run's chief was fetched: it may not have started)"
    else:
        where = (f"the newest checkpoint in S3 (the chief, {phase}, did not save the step it reached within "
                 f"{SAVE_BEFORE_STOP_S} s: its log says why)")
    say(f"the next 'make train' of this cluster resumes run {run['run_id']} from {where}; after 'make up' "
        "if the cluster is taken down meanwhile")


def _conclude(spec: RunSpec, state: ClusterState, nodes: list[Node], run: dict, final: dict,
              warm=None) -> dict:
    """The chief's task has ended: a published model is verified while the other tasks are stopped and the
    logs fetched; otherwise the logs are fetched first, then what the chief left is recorded (a model kept on
    the node, a preemption, a failure)."""
    chief = next(n for n in nodes if n.role == "chief")
    sup, held = final.get("supervisor", {}), final.get("unpublished") or {}
    if sup.get("state") == "succeeded":
        # logs_fetched False until the finish beside the verification says otherwise: a run left so (a second
        # Ctrl-C) is finished by the next train before it is verified, and down fetches its logs again
        run.update(state=RunState.UNVERIFIED, publish_seconds=(final.get("task") or {}).get("publish_seconds"),
                   logs_fetched=False)
        runrecord.write(state, run)
        with _finishing_beside(state, nodes, run):
            return verify(spec, run, warm)
    logs = _finish(spec, state, nodes, run, stop_chief=False)
    if held.get("run_id") == run["run_id"]:
        run.update(state=RunState.UNPUBLISHED, held_on=chief.name, held_step=held.get("step"),
                   held_reason=held.get("reason"), held_path=held.get("checkpoints"))
        runrecord.write(state, run)
        raise TfclusterError(
            f"training reached step {held.get('step')} but the result could not be stored in S3 "
            f"({held.get('reason')}); it is kept on {chief.name} in {held.get('checkpoints')}. "
            f"'make down' will refuse to destroy it: fix the storage and run 'make train' to publish it "
            f"(it resumes from that checkpoint), or 'make down FORCE=1' to give it up")
    if sup.get("state") == "preempted":
        step = (final.get("task") or {}).get("step")
        run.update(state=RunState.PREEMPTED, preempted_step=step)
        runrecord.write(state, run)
        raise TfclusterError(
            f"the run was preempted at step {step}: {(final.get('task') or {}).get('error', 'a notice')}. That step "
            f"is checkpointed in S3; run 'make train' to resume from it (if the provider took nodes away: "
            f"'make down' and 'make up' first, then 'make train')")
    run["state"] = RunState.FAILED
    runrecord.write(state, run)
    why = f"; not restarted: {sup['why']}" if sup.get("why") else ""
    raise TfclusterError(f"training failed: the chief's task ended '{sup.get('state')}' "
                         f"(exit {sup.get('exit_code')}, restarts {sup.get('restarts', 0)}{why})"
                         f"{_first_line((final.get('task') or {}).get('error'))}; logs in {logs}\n"
                         + _log_tail(logs / chief.name / "node.log"))


def _first_line(error: str | None, limit: int = 400) -> str:
    """``: <the first line of the chief's error>`` (TensorFlow's run to many lines; the log tail follows), or ''."""
    line = (error or "").strip().split("\n", 1)[0]
    return f": {line[:limit]}{'…' if len(line) > limit else ''}" if line else ""


#: TensorFlow's lines a coordinator logs by the dozen once a peer has gone (its remote functions cannot be removed):
#: they say nothing about why the task failed, and buried the one line that did in a failed run's log tail
_REMOTE_CLEANUP_NOISE = re.compile(r"^E\d{4} .*Failed to remove function remotely")


def _log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a node's log, without blank lines (TensorFlow puts one after each line of an op's
    stack: they halved the tail) and without :data:`_REMOTE_CLEANUP_NOISE` (counted instead)."""
    try:
        text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return f"(no log at {path})"
    kept = [line for line in text if not _REMOTE_CLEANUP_NOISE.match(line)]
    left_out = len(text) - len(kept)
    return "\n".join(kept[-lines:] + ([f"({left_out} lines of TensorFlow's 'Failed to remove function remotely' "
                                       f"left out; the whole log is {path})"] if left_out else []))


def _finish(spec: RunSpec, state: ClusterState, nodes: list[Node], run: dict, stop_chief: bool,
            save_first: bool = False) -> Path:
    """Stop ps and workers (and the chief when asked, after it saved the step it reached with ``save_first``),
    then fetch every node's log (:func:`stop_serving_and_fetch_logs`); the record says whether every log was
    fetched (and every credentials file removed), which ``down`` then need not do again."""
    with phase("stop the tasks still serving, fetch logs"):
        run["logs_fetched"] = stop_serving_and_fetch_logs(state, run["run_id"], len(nodes), stop_chief=stop_chief,
                                                          save_first=save_first)
    runrecord.write(state, run)
    return state.logs / run["run_id"]


@contextmanager
def _finishing_beside(state: ClusterState, nodes: list[Node], run: dict):
    """Stop the tasks still serving and fetch every node's log in a thread while the body runs (the published
    model's verification: it reads S3 only). Its SSH commands and the playbook that may follow them are out
    of reach of a Ctrl-C meant for the verification, and the playbook's console output is held back
    (train.log has it); the record says whether every log was fetched once both are done. The thread never
    touches ``run``: only this one writes it."""
    outcome: dict = {}

    def work() -> None:
        started = time.monotonic()
        try:
            outcome["fetched"] = stop_serving_and_fetch_logs(state, run["run_id"], len(nodes), console=False)
        except Exception as exc:   # not a failed playbook (that one reports it): e.g. a full disk
            outcome["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            outcome["seconds"] = time.monotonic() - started

    say("stopping the tasks still serving and fetching logs while the model is verified")
    worker = threading.Thread(target=work, name="finish", daemon=True)
    worker.start()
    try:
        yield
    finally:
        worker.join()
        run["logs_fetched"] = outcome.get("fetched", False)
        runrecord.write(state, run)
        if outcome.get("error"):
            say(f"warning: could not fetch every node's log: {outcome['error']}")
        say(f"stop the tasks still serving, fetch logs: done in {outcome.get('seconds', 0.0):.1f}s "
            f"({'every node' if run['logs_fetched'] else 'not every node'}: {state.logs / run['run_id']})")


# -- publish / verify --------------------------------------------------------------------------
def _local_copy(spec: RunSpec, run: dict) -> Path:
    """Where the verification keeps its copy of the run (the model, manifest and metrics)."""
    return artifacts_root() / spec.cluster / run["run_id"]


def verify(spec: RunSpec, run: dict, warm=None) -> dict:
    """Read the published model back from S3, check every hash, evaluate it in a fresh process (``warm``: one
    started for this run before the chief's exit, see :class:`_AheadEvaluator`)."""
    state = ClusterState(spec.cluster)
    settings = run_settings(spec, run["run_id"], run)
    dest = _local_copy(spec, run)
    with phase(f"verify the model in {run['s3_prefix']}"):
        try:
            from tfc_harness import verify as harness_verify

            result = harness_verify.verify_run(store.client(spec), spec.storage.bucket,
                                                 settings["s3"]["run_prefix"], dest, str(job.model_path(spec)),
                                                 settings["s3"]["dataset_prefix"], run.get("settings_data"),
                                                 warm=warm)
        except TfclusterError:
            raise
        except Exception as exc:  # a bad hash, a missing file, S3 errors: the published run is not usable
            run.update(state=RunState.VERIFY_FAILED, error=f"{type(exc).__name__}: {exc}")
            runrecord.write(state, run)
            raise TfclusterError(f"verification of {run['s3_prefix']} failed: {type(exc).__name__}: {exc}; "
                                 f"the next 'make train' starts a new run") from None
    metrics = result["metrics"]
    headline = metrics["headline"]
    run.update({"state": RunState.VERIFIED, "artifacts": str(dest), "metrics": result["published"],
                "verified_metrics": metrics, "headline": headline, headline: metrics[headline]})
    runrecord.write(state, run)
    for line in harness_verify.metric_lines(metrics):
        print(line, flush=True)
    ahead = " (started before the chief's exit)" if warm is not None and warm.used else ""
    say(f"model verified: {run['s3_prefix']} (copy in {dest}); the metrics above were recomputed from it "
        f"in a fresh process{ahead} and match the chief's")
    return run
