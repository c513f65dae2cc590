"""``tfcluster tensorboard``: a cluster's runs side by side in TensorBoard, served on 127.0.0.1.

Each run's chief copies its event files to ``s3://<bucket>/<prefix>/<cluster>/<run-id>/tensorboard/``
(:mod:`tfc_harness.summaries`), also while it trains and when it fails. This fetches them for every run of
the cluster that has some in S3 (or for the one ``--run``) into ``artifacts/<cluster>/_tensorboard/<run-id>/``
(only files that are new or grew since the last fetch), then serves TensorBoard from the controller's own
venv on 127.0.0.1 over a folder that links exactly the chosen runs (so they are named by their run ids),
prints the URL and serves until Ctrl-C (the folder of links is a temporary one). The cluster need not be
up: the runs are read from S3.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from . import store
from .cluster import say
from .config import RunSpec
from .errors import ConfigError, TfclusterError
from .paths import artifacts_root

HOST = "127.0.0.1"        # never another address: TensorBoard has no authentication
EVENTS_FOLDER = "tensorboard"   # under a run's prefix (tfc_harness.summaries.S3_FOLDER)
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")   # a folder name that is safe as a local one


def local_dir(cluster: str) -> Path:
    """Where the fetched event files of a cluster's runs are kept, one folder per run."""
    return artifacts_root() / cluster / "_tensorboard"


def cluster_prefix(spec: RunSpec) -> str:
    return f"{spec.storage.prefix}/{spec.cluster}"


def runs_with_events(client, bucket: str, prefix: str) -> list[str]:
    """The run ids under ``prefix/`` (a cluster's folder) that hold TensorBoard event files, oldest first."""
    from tfc_harness import s3io

    return [run for run in s3io.list_folders(client, bucket, prefix) if _RUN_ID.fullmatch(run)
            and any(True for _ in s3io.list_keys(client, bucket, f"{prefix}/{run}/{EVENTS_FOLDER}"))]


def choose(available: list[str], wanted: str | None, where: str) -> list[str]:
    """The runs to serve: all of ``available``, or ``wanted``; an unknown one is a ConfigError naming what is
    allowed; none at all is an error saying where it looked."""
    if wanted:
        if wanted not in available:
            raise ConfigError("run", wanted, f"a run with TensorBoard events in {where}: "
                                             f"{', '.join(available) or 'none has any'}")
        return [wanted]
    if not available:
        raise TfclusterError(f"no run has TensorBoard events in {where} (a run's chief copies them there "
                             f"while it trains)")
    return available


def fetch(client, bucket: str, prefix: str, runs: list[str], dest: Path) -> Fetched:
    """Copy each run's event files to ``dest/<run>/``, skipping files whose local copy has the same size
    (event files only grow); returns what it did."""
    from tfc_harness import s3io

    fetched, unchanged = [], 0
    for run in runs:
        folder = f"{prefix}/{run}/{EVENTS_FOLDER}"
        for obj in s3io.list_objects(client, bucket, folder):
            target = (dest / run / obj["Key"][len(folder) + 1:]).resolve()
            if dest.resolve() not in target.parents:
                raise TfclusterError(f"refusing s3://{bucket}/{obj['Key']}: it would land outside {dest}")
            if target.is_file() and target.stat().st_size == obj["Size"]:
                unchanged += 1
                continue
            s3io.download_file(client, bucket, obj["Key"], target)
            fetched.append(obj["Size"])
    return Fetched(len(fetched), sum(fetched), unchanged)


class Fetched(NamedTuple):
    """What :func:`fetch` did; ``str``: ``2 file(s) fetched (14.1 kB), 1 unchanged``."""
    files: int
    size: int
    unchanged: int

    def __add__(self, other: Fetched) -> Fetched:
        return Fetched(*(a + b for a, b in zip(self, other, strict=True)))

    def __str__(self) -> str:
        return f"{self.files} file(s) fetched ({self.size / 1e3:.1f} kB), {self.unchanged} unchanged"


def link_view(source: Path, runs: list[str], view: Path) -> Path:
    """A folder in which each chosen run is a link to its fetched copy: TensorBoard names runs by folder."""
    for run in runs:
        (view / run).symlink_to(source / run, target_is_directory=True)
    return view


def serve(logdir: Path, port: int, announce: Callable[[str], None]) -> None:
    """Serve TensorBoard over ``logdir`` on 127.0.0.1:``port`` (0: a free one) in this process; call
    ``announce(url)`` once it listens; return after Ctrl-C (or SIGTERM)."""
    with _stderr_held_back():       # TensorFlow's C++ start lines (oneDNN, CPU features), which no level stops
        from tensorboard import program

        board = program.TensorBoard()
        board.configure(logdir=str(logdir), host=HOST, port=port, load_fast="false", reload_interval=5)
        try:
            url = board.launch()
        except program.TensorBoardServerException as exc:
            raise TfclusterError(f"TensorBoard could not listen on {HOST}:{port}: {exc.msg}") from None
    announce(url)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:                  # until Ctrl-C
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _stderr_held_back():
    """File descriptor 2 into a temporary file while the block runs; what was written there is shown after all
    when the block fails (its error may need it)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def sweep_runs(spec: RunSpec, sweep_file: str, client) -> list[tuple[str, str, str]]:
    """``(group, run id, name)`` of each trial of the sweep that has a run: from the sweep's record on this
    machine (current while it runs), else its ``sweep.json`` in S3. Named ``<trial>-<values>``."""
    import json

    from . import sweep

    name = sweep.sweep_name(sweep_file)
    local = sweep.record_dir(spec.cluster, name) / "sweep.json"
    key = f"{spec.storage.prefix}/{spec.cluster}/sweeps/{name}/sweep.json"
    try:
        data = json.loads(local.read_text())
    except (OSError, ValueError):
        try:
            data = json.loads(client.get_object(Bucket=spec.storage.bucket, Key=key)["Body"].read())
        except Exception:
            raise ConfigError("SWEEP", sweep_file, f"a sweep run on cluster {spec.cluster} (no record of sweep "
                                                   f"{name} on this machine nor in s3://{spec.storage.bucket}/{key})"
                              ) from None
    runs = []
    for t in data.get("trials", []):
        if t.get("run_id") and t.get("group") and _RUN_ID.fullmatch(t["run_id"]):
            values = sweep.params_text(t["params"], sep=",")
            runs.append((t["group"], t["run_id"], re.sub(r"[^A-Za-z0-9._=,+-]", "_", f"{t['id']}-{values}")))
    if not runs:
        raise TfclusterError(f"no trial of sweep {name} has a run yet")
    return runs


def _fetch_sweep(spec: RunSpec, sweep_file: str, client, dest: Path) -> tuple[list[str], Fetched, Path]:
    """Fetch every trial's events into ``dest/<group>/<run>`` and link them by trial name."""
    names, done = [], Fetched(0, 0, 0)
    links = dest / "_sweep"
    shutil.rmtree(links, ignore_errors=True)
    links.mkdir(parents=True)
    for group, run_id, name in sweep_runs(spec, sweep_file, client):
        done += fetch(client, spec.storage.bucket, f"{spec.storage.prefix}/{group}", [run_id], dest / group)
        (dest / group / run_id).mkdir(parents=True, exist_ok=True)
        (links / name).symlink_to(dest / group / run_id, target_is_directory=True)
        names.append(name)
    return names, done, links


def show(spec: RunSpec, run: str | None = None, port: int = 0, sweep: str | None = None) -> int:
    """Fetch the cluster's runs (or ``run``, or a sweep's trials) from S3 and serve them until Ctrl-C."""
    from tfc_harness import s3io

    bucket, prefix = spec.storage.bucket, cluster_prefix(spec)
    where = f"s3://{bucket}/{prefix}/"
    dest = local_dir(spec.cluster)
    if store.is_local_store(spec) and not store.is_running():
        kept = f"; the copies fetched before are in {dest}" if dest.is_dir() else ""
        raise TfclusterError(f"the local S3 store is not running, so {where} cannot be read (its objects "
                             f"live in memory: 'make clean' ended them){kept}")
    client = store.client(spec)
    try:
        if sweep:
            runs, done, source = _fetch_sweep(spec, sweep, client, dest)
        else:
            runs = choose(runs_with_events(client, bucket, prefix), run, where)
            done, source = fetch(client, bucket, prefix, runs, dest), dest
    except s3io.TransferError as exc:
        raise TfclusterError(f"reading the TensorBoard events in {where}: {exc}") from None
    what = f"trial(s) of sweep {sweep}" if sweep else f"run(s) of cluster {spec.cluster} from {where}"
    say(f"TensorBoard events of {len(runs)} {what}: {done}, in {dest}")
    view = Path(tempfile.mkdtemp(prefix="tfc-tensorboard-"))
    try:
        def announce(url: str) -> None:
            say(f"TensorBoard at {url} : {', '.join(runs)} (Ctrl-C to stop)")

        serve(link_view(source, runs, view), port, announce)
    finally:
        shutil.rmtree(view, ignore_errors=True)
    print("TensorBoard stopped", file=sys.stderr, flush=True)
    return 0
