"""``tfcluster sweep``: many trials of one model on one cluster, up to ``parallel`` at once.

The sweep file names the values to try (a grid, or a random search with a seed and a trial count) over
``training.*`` fields and the model's ``hparams``, the metric to optimise and its direction, and how many
trials run at once (``parallel: N``). Each trial runs on its own group of the cluster's nodes
(:mod:`tfcluster.groups`); the rest queue. A trial is an ordinary ``train`` on its group (its own run id,
checkpoints, metrics and verification), run as a child process whose output is shown line by line behind
the trial's name. A failed trial is recorded and the others go on.

The sweep's record, ``.tfcluster/<cluster>/sweeps/<name>/sweep.json``, is written after every change. A
trial is known by its values: running the same sweep again skips the trials that are verified, resumes an
unfinished one from its checkpoints on the group that ran it (its run is still open there), and starts the
others afresh. At the end: a table of every trial sorted by the metric, ``sweep.json`` in S3 under
``<prefix>/<cluster>/sweeps/<name>/`` (read back and compared), and the best trial's model marked as the
sweep's result there (``best.json``).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import cluster as lifecycle
from . import groups, runrecord, store
from .cluster import say
from .config import RunSpec
from .errors import Busy, TfclusterError
from .paths import ClusterState, artifacts_root, held_alone
from .providers import get_provider
from .runrecord import RunState
from .sweepfile import Sweep, load, params_text, sweep_name, trial_spec

__all__ = ["Record", "Scheduler", "Sweep", "best", "ensure_groups", "load", "params_text", "publish", "ranked",
           "record_dir", "run", "sweep_name", "table", "trial_spec"]


# -- the record --------------------------------------------------------------------------------------------
def record_dir(cluster: str, name: str) -> Path:
    return ClusterState(cluster).dir / "sweeps" / name


class Record:
    """The sweep's record: each trial's state, group, run and metric; written after every change."""

    def __init__(self, spec: RunSpec, sweep: Sweep):
        self.path = record_dir(spec.cluster, sweep.name) / "sweep.json"
        self.lock = threading.Lock()
        try:
            old = {t["key"]: t for t in json.loads(self.path.read_text()).get("trials", [])}
        except (OSError, ValueError):
            old = {}
        self.data = {"sweep": sweep.name, "cluster": spec.cluster, "file": str(sweep.path.resolve()),
                     "method": sweep.method, "seed": sweep.seed, "metric": sweep.metric,
                     "direction": sweep.direction, "parallel": sweep.parallel,
                     "trials": [{**old.get(t["key"], {"state": "pending"}), **t} for t in sweep.trials]}

    def trials(self) -> list[dict]:
        return self.data["trials"]

    def update(self, trial: dict, **values) -> None:
        with self.lock:
            trial.update(values)
            self.save()

    def save(self) -> None:
        self.data["updated"] = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        tmp.replace(self.path)


#: the lines :func:`tfcluster.ansible_run.playbook` shows of a playbook's progress (indented by 4); its errors
#: (fatal:, failed:, ERROR) are not among them
PLAYBOOK_PROGRESS = re.compile(r"^    (PLAY \[|TASK \[|PLAY RECAP|\S+\s+: ok=\d+)")
PLAYBOOK_TROUBLE = re.compile(r"\b(unreachable|failed)=[1-9]")     # a recap line of a host that failed
PLAYBOOK_FAILURE = re.compile(r"^    (fatal|failed):")


# -- groups ------------------------------------------------------------------------------------------------
def check_groups(spec: RunSpec, parallel: int, checked_already: str = "") -> tuple[list[RunSpec], dict]:
    """Every group's configuration; the groups that are up fit it, and those not up pass ``up``'s checks
    (``checked_already``: a cluster whose checks the caller ran). Returns the configurations and, for each
    group not up, the provider its checks returned. Creates nothing."""
    specs = [groups.spec_for(spec, k) for k in range(parallel)]
    get_provider(spec.provider, ClusterState(spec.cluster)).check_groups(specs)
    missing = [s for s in specs if not ClusterState(s.cluster).nodes.exists()]
    for s in specs:     # the groups that are up: the same shape as the new ones (a trial runs on any of them)
        lifecycle.check_fits_the_cluster_up(s, ClusterState(s.cluster))
    return specs, {s.cluster: lifecycle.preflight(s)[0] for s in missing if s.cluster != checked_already}


def ensure_groups(spec: RunSpec, parallel: int) -> list[RunSpec]:
    """Bring up every group the sweep needs that is not up yet (all are checked before any is created)."""
    specs, checked = check_groups(spec, parallel)
    for s in (s for s in specs if s.cluster in checked):
        if s.cluster != spec.cluster:
            groups.remember(spec.cluster, s.cluster)   # before anything exists: `down` finds it
        say(f"group {specs.index(s)} of cluster {spec.cluster}: bringing up {s.cluster}")
        lifecycle.up(s, checked[s.cluster])
    if parallel > 1:
        say(f"cluster {spec.cluster}: {parallel} groups of {sum(spec.count(r) for r in ('ps', 'worker', 'chief'))}"
            f" nodes ({', '.join(s.cluster for s in specs)}); 'make down' removes them all")
    return specs


def _open_run(group: str) -> dict | None:
    """The group's run when it is still open (a model there may not be safe yet), else None."""
    run = runrecord.read(ClusterState(group))
    return run if run.get("state") in runrecord.OPEN else None


# -- running -----------------------------------------------------------------------------------------------
class Scheduler:
    """One thread per usable group; each takes the trial its group holds open, else the next queued one."""

    def __init__(self, spec: RunSpec, sweep: Sweep, record: Record, specs: list[RunSpec]):
        self.spec, self.sweep, self.record, self.specs = spec, sweep, record, specs
        self.queue: queue.Queue = queue.Queue()
        self.owned: dict[str, dict] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopping = threading.Event()
        self.out_lock = threading.Lock()
        self.last_task: dict[str, str] = {}     # a trial's playbook task not shown yet, by its prefix

    def plan(self) -> list[str]:
        """Queue the unfinished trials; returns the groups that can take trials."""
        by_key = {t["key"]: t for t in self.record.trials()}
        usable = []
        for s in self.specs:
            run = runrecord.read(ClusterState(s.cluster))
            trial = by_key.get(run.get("trial"))
            resumable = run.get("state") in (*runrecord.RESUMABLE, RunState.UNVERIFIED)
            if trial and trial.get("state") != "verified" and resumable:
                self.owned[s.cluster] = trial      # its checkpoints are this group's: it resumes here
                usable.append(s.cluster)
            elif run.get("state") not in runrecord.OPEN:
                usable.append(s.cluster)
            else:
                say(f"group {s.cluster} is not used: its run {run.get('run_id')} is '{run.get('state')}' "
                    f"(not this sweep's); 'make train CLUSTER={s.cluster}' finishes it, 'make down' "
                    f"refuses until then")
        held = {id(t) for t in self.owned.values()}
        for trial in self.record.trials():
            if trial.get("state") != "verified" and id(trial) not in held:
                self.queue.put(trial)
        return usable

    def run(self, usable: list[str]) -> None:
        threads = [threading.Thread(target=self._group_loop, args=(g,), daemon=True) for g in usable]
        for t in threads:
            t.start()
        try:   # never Ctrl-C a join(): an interrupted join can leave is_alive() False for a running thread
            while any(t.is_alive() for t in threads):
                time.sleep(0.5)
        except KeyboardInterrupt:
            self._interrupt(threads)
            raise

    def _interrupt(self, threads) -> None:
        """Ctrl-C: no new trial starts; each running trial gets one SIGINT (its train has its chief save the step
        it reached, stops its tasks, marks its run interrupted and fetches logs); wait for them, ignoring further
        Ctrl-C meanwhile."""
        self.stopping.set()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            say("interrupted: stopping the running trials (each saves the step it reached to S3; run the same "
                "sweep again to resume them)")
            for proc in list(self.procs.values()):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            while any(t.is_alive() for t in threads):
                time.sleep(0.5)
        finally:
            signal.signal(signal.SIGINT, previous)

    def _next(self, group: str) -> dict | None:
        if self.stopping.is_set():
            return None
        if group in self.owned:
            return self.owned.pop(group)
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            return None

    def _group_loop(self, group: str) -> None:
        configured = False
        while (trial := self._next(group)) is not None:
            self._run_trial(group, trial, configure=not configured)
            configured = True
            run = _open_run(group)
            if run is not None and not self.stopping.is_set():
                say(f"group {group} takes no more trials: its run {run.get('run_id')} (trial {trial['id']}) "
                    f"is '{run.get('state')}'; 'make train CLUSTER={group}' finishes it")
                return

    def _show(self, prefix: str, line: str, log) -> None:
        """A trial's line to its log, and to the console unless it is a playbook's progress (its PLAY/TASK
        lines and recap, ~20 a trial start, which trials running at once would interleave). A failure shows
        with the task it came from, and a recap line counting failed or unreachable hosts shows."""
        log.write(line)
        log.flush()
        shown = [line]
        if PLAYBOOK_PROGRESS.match(line) and not PLAYBOOK_TROUBLE.search(line):
            if line.startswith("    TASK ["):
                self.last_task[prefix] = line
            return
        if PLAYBOOK_FAILURE.match(line) and prefix in self.last_task:
            shown.insert(0, self.last_task.pop(prefix))
        with self.out_lock:
            sys.stdout.writelines(f"{prefix} {text}" for text in shown)
            sys.stdout.flush()

    def _run_trial(self, group: str, trial: dict, configure: bool) -> None:
        folder = record_dir(self.spec.cluster, self.sweep.name)
        config_file = folder / f"{trial['id']}.json"
        gspec = next(s for s in self.specs if s.cluster == group)
        values = trial_spec(gspec, self.sweep, trial["params"]).to_dict()
        model = values["training"]["model"]
        if model.endswith(".py"):
            values["training"]["model"] = str(Path(model).resolve())
        config_file.write_text(json.dumps(values, indent=2) + "\n")
        cmd = [sys.executable, "-m", "tfcluster", "train", "-c", str(config_file), "--trial", trial["key"]]
        if not configure:
            cmd.append("--skip-configure")
        prefix = f"[{trial['id']} {group}]"
        say(f"trial {trial['id']} ({params_text(trial['params'])}) on group {group}"
            + (" (resuming its run)" if trial.get("state") not in ("pending", None) else ""))
        self.record.update(trial, state="running", group=group, started=time.time(),
                           log=str(folder / f"{trial['id']}.log"))
        started = time.monotonic()
        lines: list[str] = []
        with open(folder / f"{trial['id']}.log", "a") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            self.procs[trial["key"]] = proc
            for line in proc.stdout:
                lines.append(line)
                self._show(prefix, line, log)
            code = proc.wait()
        self.procs.pop(trial["key"], None)
        self._conclude(group, trial, code, round(time.monotonic() - started, 1), lines)

    def _conclude(self, group: str, trial: dict, code: int, seconds: float, lines: list[str]) -> None:
        run = runrecord.read(ClusterState(group))
        mine = run.get("trial") == trial["key"]
        values = {"seconds": round(trial.get("seconds", 0) + seconds, 1), "exit_code": code,
                  "run_id": run.get("run_id") if mine else trial.get("run_id"),
                  "s3_prefix": run.get("s3_prefix") if mine else trial.get("s3_prefix")}
        if code == 0 and mine and run.get("state") == RunState.VERIFIED:
            metrics = run.get("verified_metrics", {})
            self.record.update(trial, state="verified", metric=metrics.get(self.sweep.metric),
                               metrics={k: v for k, v in metrics.items() if k.startswith("test_")},
                               restored_from_step=(run.get("metrics") or {}).get("restored_from_step"),
                               error=None, **values)
            say(f"trial {trial['id']}: verified, {self.sweep.metric.removeprefix('test_')} "
                f"{_fmt(trial['metric'])} ({seconds:.0f}s)")
            return
        errors = [ln.strip() for ln in lines if ln.startswith("tfcluster: error:")]
        state = "interrupted" if code == 130 or self.stopping.is_set() else "failed"
        self.record.update(trial, state=state, error=(errors[-1] if errors else f"exit status {code}"),
                           run_state=run.get("state") if mine else None, **values)
        say(f"trial {trial['id']}: {state} ({trial['error']}); log {trial['log']}")


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


# -- the result --------------------------------------------------------------------------------------------
def ranked(trials: list[dict], direction: str) -> list[dict]:
    """Verified trials best first by the metric (equal values: the lower test loss first, as accuracy 1.0 in
    two trials says nothing about which is better), then the others in their order."""
    done = [t for t in trials if t.get("state") == "verified" and isinstance(t.get("metric"), (int, float))]
    sign = -1 if direction == "maximize" else 1

    def order(t: dict) -> tuple:
        loss = (t.get("metrics") or {}).get("test_loss")
        return sign * t["metric"], loss if isinstance(loss, (int, float)) else float("inf")

    done.sort(key=order)
    return done + [t for t in trials if t not in done]


def table(sweep: Sweep, trials: list[dict]) -> str:
    keys = list(sweep.parameters)
    heads = ["trial", *(k.rsplit(".", 1)[1] for k in keys), sweep.metric.removeprefix("test_"), "time", "state",
             "run"]
    rows = [[t["id"], *(str(t["params"][k]) for k in keys), _fmt(t.get("metric")),
             f"{t['seconds']:.0f}s" if t.get("seconds") else "-", t.get("state", "pending"),
             t.get("run_id") or "-"] for t in ranked(trials, sweep.direction)]
    widths = [max(len(r[i]) for r in [heads, *rows]) for i in range(len(heads))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [heads, *rows])


def best(sweep: Sweep, trials: list[dict]) -> dict | None:
    top = ranked(trials, sweep.direction)
    if not top or top[0].get("state") != "verified":
        return None
    t = top[0]
    return {"trial": t["id"], "params": t["params"], "metric": sweep.metric, "value": t["metric"],
            "direction": sweep.direction, "run_id": t["run_id"], "group": t["group"], "model": t["s3_prefix"]}


def publish(spec: RunSpec, sweep: Sweep, record: Record) -> str:
    """sweep.json (and best.json, the sweep's result) to S3, read back and compared; a copy in artifacts/."""
    prefix = f"{spec.storage.prefix}/{spec.cluster}/sweeps/{sweep.name}"
    client = store.client(spec)
    objects = {"sweep.json": record.data}
    if record.data.get("best"):
        objects["best.json"] = record.data["best"]
    local = artifacts_root() / spec.cluster / "sweeps" / sweep.name
    local.mkdir(parents=True, exist_ok=True)
    for key, data in objects.items():
        body = (json.dumps(data, indent=2) + "\n").encode()
        client.put_object(Bucket=spec.storage.bucket, Key=f"{prefix}/{key}", Body=body)
        back = client.get_object(Bucket=spec.storage.bucket, Key=f"{prefix}/{key}")["Body"].read()
        if back != body:
            raise TfclusterError(f"s3://{spec.storage.bucket}/{prefix}/{key} reads back different from what was "
                                 f"written")
        (local / key).write_bytes(body)
    return f"s3://{spec.storage.bucket}/{prefix}/"


def _tabulate(sweep: Sweep, record: Record) -> None:
    """The best trial recorded, and the table printed."""
    trials = record.trials()
    record.data["best"] = best(sweep, trials)
    record.save()
    print(table(sweep, trials), flush=True)


def run(spec: RunSpec, sweep: Sweep) -> int:
    """Run (or resume) the sweep (as :func:`load` read it) on the cluster's groups, bringing up those not up;
    print the table. One sweep of a cluster at a time: a second is refused (Busy)."""
    def busy(holder: str) -> Busy:
        return Busy(f"cluster {spec.cluster} runs a sweep already ({holder}); wait for it, or stop it "
                    f"(Ctrl-C in its terminal: its trials stay resumable) first")

    with held_alone(ClusterState(spec.cluster).sweep_lock, busy):
        return _run(spec, sweep)


def bring_up(spec: RunSpec, sweep: Sweep) -> list[RunSpec]:
    """The groups the sweep runs on (:func:`ensure_groups`), unless every one of its trials is verified already:
    then none is brought up (no trial would run on it) and [] is returned."""
    if all_verified(Record(spec, sweep)):
        say(f"sweep {sweep.name}: every one of its {len(sweep.trials)} trials is verified already: no group of "
            f"nodes is brought up for it")
        return []
    return ensure_groups(spec, sweep.parallel)


def all_verified(record: Record) -> bool:
    return all(t.get("state") == "verified" for t in record.trials())


def _run(spec: RunSpec, sweep: Sweep) -> int:
    record = Record(spec, sweep)
    done = [t for t in record.trials() if t.get("state") == "verified"]
    say(f"sweep {sweep.name}: {len(sweep.trials)} trials ({sweep.method}), {sweep.parallel} at once, {sweep.goal}"
        + (f"; {len(done)} already verified, skipped" if done else ""))
    if all_verified(record):
        _tabulate(sweep, record)
    else:
        specs = ensure_groups(spec, sweep.parallel)
        record.save()
        scheduler = Scheduler(spec, sweep, record, specs)
        usable = scheduler.plan()
        if not usable and not scheduler.queue.empty():
            raise TfclusterError(f"no group of cluster {spec.cluster} can take a trial (see above)")
        try:
            scheduler.run(usable)
        finally:
            _tabulate(sweep, record)
    trials = record.trials()
    where = publish(spec, sweep, record)
    verified = sum(t.get("state") == "verified" for t in trials)
    result = record.data["best"]
    if result:
        say(f"best: trial {result['trial']} ({params_text(result['params'])}), "
            f"{sweep.metric.removeprefix('test_')} {_fmt(result['value'])}, model {result['model']}")
    say(f"sweep {sweep.name}: {verified} of {len(trials)} trials verified; sweep.json"
        + (" and best.json" if result else "") + f" in {where} (read back)")
    if verified < len(trials):
        raise TfclusterError(f"{len(trials) - verified} of {len(trials)} trials did not finish (table above); "
                             f"run the same sweep again to resume them")
    return 0
