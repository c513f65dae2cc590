"""The user's training job (the model module and its data), checked and prepared on the controller.

Both steps run :mod:`tfc_harness.prepare` in a subprocess (the module is the user's code: it must not run
inside tfcluster, and a crash in it must not take tfcluster down):

* :func:`check` (``validate`` and ``up``, before anything is created): the module's interface; the
  result is cached under the cache root, keyed by the module's and the harness's content and the job's
  settings, so a second ``up`` with the same module does not import TensorFlow again;
* :func:`check_files` and :func:`check_with_data` (``validate``, ``plan`` and ``up``, on the local store): the
  data files listed and checked as ``train`` checks them (the module's interface first, in the same
  process), before anything is created;
* :func:`prepare` (``train``, when a run starts): the run's data (stored by content, or listed and
  assigned to workers) and a check of model, loss and metrics on a few real examples; a passed check is
  recorded under the cache root (``_jobchecks/probes``), so a later run of the same module and hparams on
  the same examples (module arrays), or with the same data settings and number of training tasks on the
  same files (keys, ETags and sizes), skips it and its TensorFlow import.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tfc_harness import strategies
from tfc_harness.errors import counted

from . import store, wheelhouse
from .config import ROLES, RunSpec
from .errors import DataNotReady, JobError, TfclusterError
from .paths import TRAIN_DIR, cache_root

CHECK_TIMEOUT_S = 300
PREPARE_TIMEOUT_S = 3600


def model_path(spec: RunSpec) -> Path:
    """The model module's file: a bundled model in train/models/, or the user's .py file."""
    model = spec.training.model
    return Path(model) if model.endswith(".py") else TRAIN_DIR / "models" / f"{model}.py"


def model_name(spec: RunSpec) -> str:
    return model_path(spec).stem


def dataset_base(spec: RunSpec) -> str:
    """Where the module's make_dataset() arrays are stored, each version under ``<base>-<sha12>/``."""
    return f"datasets/{model_name(spec)}"


def module_sha256(spec: RunSpec) -> str:
    """The model module's content: a changed module starts a new run instead of resuming the old one."""
    return hashlib.sha256(model_path(spec).read_bytes()).hexdigest()


def job_args(spec: RunSpec) -> dict:
    """What :mod:`tfc_harness.prepare` needs to know about the run (no secrets)."""
    data = spec.data
    return {
        "module": str(model_path(spec)),
        "hparams": spec.training.hparams,
        "data": {"train": data.train, "test": data.test, "format": data.format, "label": data.label}
        if data.train else None,
        # each training task (strategies.training_tasks: ps workers; chief + workers under all-reduce) gets
        # its own share of the files
        "workers": strategies.training_task_count(spec.strategy, {r: spec.count(r) for r in ROLES}),
        "bucket": spec.storage.bucket,
        "endpoint": store.endpoint_for(spec),
        "region": spec.storage.region,
        "whole_object_gets": store.is_local_store(spec),
        "dataset_base": dataset_base(spec),
        "probe_cache": str(cache_root() / "_jobchecks" / "probes"),
        "node_packages": wheelhouse.node_packages(spec.tensorflow.version,
                                                  [spec.nodes[r].gpus for r in ROLES if spec.count(r)]),
    }


def _call(mode: str, args: dict, env: dict, timeout_s: int) -> dict:
    # a temporary directory of its own, removed when it ends: AutoGraph writes a file for each function it
    # converts (a CSV or TFRecord parser, the user's decode) and Python its bytecode in __pycache__ beside it,
    # which TensorFlow's exit leaves in /tmp
    with tempfile.TemporaryDirectory(prefix="tfcluster-jobcheck-", ignore_cleanup_errors=True) as tmp:
        proc_env = dict(os.environ, **env, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=tmp)
        try:
            proc = subprocess.run([sys.executable, "-m", "tfc_harness.prepare", mode, json.dumps(args)],
                                  capture_output=True, text=True, env=proc_env, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise JobError(f"checking the model module {args['module']} took longer than {timeout_s}s") from None
    errors = [ln.removeprefix("ERROR: ") for ln in proc.stderr.splitlines() if ln.startswith("ERROR: ")]
    if proc.returncode == 2 and errors:
        raise JobError(errors[-1])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        detail = errors[-1] if errors else proc.stderr.strip()[-1500:]
        raise TfclusterError(f"preparing the training job failed (exit {proc.returncode}): {detail}")
    return json.loads(lines[-1])


def _check_key(args: dict) -> str:
    from tfc_harness.prepare import code_digest  # here: importing prepare (numpy, boto3) costs ~0.2 s

    digest = code_digest(Path(args["module"]).read_bytes())
    digest.update(json.dumps(args, sort_keys=True).encode())
    return digest.hexdigest()


def check(spec: RunSpec, hparams_variants: list[dict] | None = None) -> dict:
    """The model module's interface for this configuration (raises :class:`JobError` naming the problem).
    ``hparams_variants``: a sweep's trials' hparams, each built, every name read in one of them at least
    (:func:`tfc_harness.prepare.check_hparams_read`)."""
    every = job_args(spec)      # once: it reads the nodes' lock files
    args = {k: every[k] for k in ("module", "hparams", "data", "node_packages")}
    if hparams_variants:
        args["hparams_variants"] = hparams_variants
    cache = cache_root() / "_jobchecks" / f"{_check_key(args)}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    result = _call("check", args, {}, CHECK_TIMEOUT_S)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, cache)
    return result


def check_files(spec: RunSpec) -> str | None:
    """Before anything is created (``plan``, ``up``; ``validate`` reports it), where the run's store is local:
    the files ``data.train`` and ``data.test`` name are listed as ``train`` lists them and the start of each
    read, so a mistyped glob or bucket, or a header without the label, is refused (exit status 2) before any
    node boots (:func:`check_with_data` then checks them with TensorFlow).  Returns what was found, or None when
    nothing is listed here: data from ``make_dataset()``, or a store elsewhere, whose files ``train`` lists
    (``validate`` and ``plan`` of a cloud's configuration need no network and no credentials of it)."""
    if not spec.data.train or not store.is_local_store(spec):
        return None
    if not store.is_running():
        raise DataNotReady(f"data.train: {spec.data.train}: the local object store is not running, so it holds "
                           "no files (its objects live in memory): 'tfcluster store start', then upload them (see "
                           "README, \"Your own model\")")
    from tfc_harness import prepare as harness_prepare  # numpy and boto3: ~0.2 s, only where files are named
    from tfc_harness import s3io

    try:
        with contextlib.redirect_stdout(sys.stderr):    # the retries' lines: validate's stdout is its JSON
            listing = harness_prepare.check_listing(store.client(spec), job_args(spec))
    except harness_prepare.DataMissing as exc:
        raise DataNotReady(str(exc)) from None
    except harness_prepare.DataError as exc:
        raise JobError(str(exc)) from None
    except (s3io.TransferError, s3io.CredentialsMissing) as exc:
        raise TfclusterError(f"object storage: {exc}") from None
    return f"{files_text(listing['train'], 'training')} and {files_text(listing['test'], 'test')} in s3://{listing['bucket']}/"


def files_text(listed: list, kind: str) -> str:
    """``1 test file``, ``2 training files``"""
    return counted(len(listed), f"{kind} file")


def check_with_data(spec: RunSpec, found: str | None) -> dict:
    """The model module's interface (what :func:`check` returns) and, once :func:`check_files` found the
    files (``found``: what it returned), ``train``'s own check of them, what needs TensorFlow (``decode`` on the
    first records, the model, loss and metrics on real examples). That check checks the interface first, in
    the same process, so TensorFlow is imported once, not once for each; its record makes a later
    ``train``'s check of the same job and files instant, so the import moves here."""
    if not found:
        return check(spec)
    return prepare(spec)["interface"]


def prepare(spec: RunSpec, every_hparam_read: bool = True) -> dict:
    """The run's data for the nodes' settings: ``{"data": ... | None, "dataset_prefix": ..., "describe":
    ...}`` (see :func:`tfc_harness.prepare.run`). ``every_hparam_read``: see
    :func:`tfc_harness.prepare.check_hparams_read` (a sweep checked it over all of its trials' values, where
    a name one trial's model never reads may be another's)."""
    args = dict(job_args(spec), every_hparam_read=every_hparam_read)
    return _call("run", args, store.process_env(spec), PREPARE_TIMEOUT_S)
