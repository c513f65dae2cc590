"""The controller's checks of a user's job, run in a subprocess before nodes are asked to do anything.

``python -m tfc_harness.prepare check '<json>'`` imports the model module and checks its interface:
``build_model`` builds a Keras model (with ``hparams`` when it takes them), a data source exists
(``make_dataset()`` or ``data.train``; TFRecord data needs ``decode``), ``loss`` and ``metrics()`` resolve.
Nothing is read from storage.  ``validate`` and ``up`` run it.

``python -m tfc_harness.prepare run '<json>'`` prepares a run's data and proves the job fits it:

* module arrays: calls ``make_dataset()``, stores the arrays under their content hash
  (:func:`tfc_harness.data.ensure_dataset`);
* files in storage: lists ``data.train``/``data.test``, assigns the training files to the training tasks
  (disjoint, balanced by size), reads the start of every file (a CSV header and first row, a TFRecord's first record);

then reads a few test and training examples (and each file's first record, a CSV file's first row: an error
there names the file, :func:`_check_first_records`), builds the model and runs it, its loss and its metrics on
them (:func:`tfc_harness.usermodel.check_batch`).  ``train`` runs it when a run starts (on the local store
``validate``, ``plan`` and ``up`` already did, for files).  A passed check
leaves a stamp in ``probe_cache`` (when the job names one) keyed by the module, the hparams, the examples
checked (module arrays) or the data settings, the number of training tasks and every file's key, ETag and
size (files), the harness files that check them and the TensorFlow, Keras and NumPy releases: a later run of
the same job finds it and does not import TensorFlow (~3 s here); for files the stamp holds the whole result,
so only the listing runs again.  A change to any of those checks again (not a change to another file the
module imports or reads: see :func:`_probe_stamp`).

The JSON argument: ``{"module": path, "hparams": {}, "data": {"train", "test", "format", "label"} | null,
"workers": n, "bucket", "endpoint", "region", "whole_object_gets": bool (optional: the local store, see
:data:`tfc_harness.s3io.WHOLE_OBJECT_CONFIG`), "dataset_base": "datasets/<model>", "probe_cache": dir | null,
"every_hparam_read": bool (optional, default true), "hparams_variants": [{...}] (optional: a sweep's)}``
(S3 credentials from the environment); ``workers`` is the number of training tasks
(:func:`tfc_harness.strategies.training_tasks`), each of which gets its own files.  The result is one JSON
line on stdout.  A problem in the user's module or data is one line ``ERROR: ...`` on stderr and exit status
2; a storage failure exit status 1.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from . import data, ending, formats, s3io, tfimport, usermodel
from .errors import HarnessError, ModelModuleError, cause
from .inputs import PROBE_EXAMPLES


class DataError(HarnessError):
    """The data the cluster file names cannot be used; the message names the file or field."""


class DataMissing(DataError):
    """Nothing the cluster file's data URL names is in the store yet: no such bucket, no object matching."""


def check(job: dict, module: ModuleType | None = None, every_hparam_read: bool = True) -> dict:
    """The module's interface (``module``: the module already imported from ``job["module"]``), without
    reading any data. ``every_hparam_read``: :func:`check_hparams_read` (not in a sweep's trial: the sweep
    checked that over all of its trials)."""
    module = module or load(job["module"])
    tfimport.import_tensorflow()      # the check builds the model (a no-op where load or the module imported it)
    check_imports(module, job.get("node_packages"))
    _check_data_source(job, module)
    loss = usermodel.loss_fn(module)
    metrics = usermodel.metric_objects(module, loss)
    usermodel.build_model(module, None, job.get("hparams"))
    if every_hparam_read:
        check_hparams_read(module, job.get("hparams_variants") or [job.get("hparams")])
    return {"module": usermodel.label(module), "data": "files" if job.get("data") else "make_dataset",
            "loss": usermodel.loss_name(loss),
            "metrics": [m.name for m in metrics]}


#: a model module importing one of these when it loads imports TensorFlow with it (by name: a package that imports
#: TensorFlow itself, ``tensorflow_probability`` say, gets the usual import, with scikit-learn)
TENSORFLOW_PACKAGES = frozenset({"tensorflow", "keras"})


def load(model_module: str) -> ModuleType:
    """:func:`tfc_harness.usermodel.load`, TensorFlow imported the lean way first (:mod:`tfc_harness.tfimport`:
    without scikit-learn, ~0.45 s of CPU less here) where the module imports it or Keras when it loads, so that
    its own import does not import it the usual way. Not where the source does not parse, imports a top-level
    package that is not installed or has a relative import (the model module has no package: it fails): that
    error comes first, without TensorFlow's ~2 s. (A missing submodule, or a package that is found but fails to
    import, fails after it.)"""
    import ast

    path = usermodel.resolve_path(model_module)
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError, OSError):     # usermodel.load reports it
        return usermodel.load(model_module)
    tops = {dotted.split(".")[0] for _, dotted, _ in _load_time_imports(tree)}
    relative = any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
    if tops & TENSORFLOW_PACKAGES and not relative and all(_installed(top) for top in tops):
        tfimport.import_tensorflow()
    return usermodel.load(model_module)


def _installed(package: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


#: what a model module may import when it loads besides the nodes' installed packages: the harness (the bundle
#: ships it with the module)
SHIPPED = frozenset({"tfc_harness"})


def check_imports(module: ModuleType, nodes: dict | None) -> None:
    """The packages the module imports when it loads (its top-level imports, and those of its classes' bodies:
    not a function's) are on the nodes: the standard library, :data:`SHIPPED`, or a distribution of
    ``nodes["packages"]`` (:func:`tfcluster.wheelhouse.node_packages`). The controller's venv has more (it runs
    ``make_dataset()``: scikit-learn, say), so a module importing one of those at its top loads here and
    fails on every node. A name no installed distribution provides is left to the import itself."""
    path = getattr(module, "__file__", None)
    if not nodes or not path:
        return
    import ast

    from packaging.utils import canonicalize_name

    provided = importlib.metadata.packages_distributions()
    installed = set(nodes["packages"])
    tensorflow = set(TENSORFLOW_DISTRIBUTIONS)     # one TensorFlow as another (cpu here, and-cuda on GPU nodes)
    if installed & tensorflow:
        installed |= tensorflow
    for name, dotted, line in _load_time_imports(ast.parse(Path(path).read_bytes(), path)):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in SHIPPED or top not in provided:
            continue
        dists = sorted({canonicalize_name(d) for d in _owners(dotted, provided[top])})
        if not installed & set(dists):
            raise ModelModuleError(
                f"model module {usermodel.label(module)} imports {name} ({', '.join(dists)}) when it loads (line "
                f"{line}), which the nodes do not install (they have TensorFlow's packages, "
                f"{', '.join(nodes['locks'])} in roles/tensorflow/files/locks/): import it inside make_dataset(), "
                "which runs on the controller only")


def _owners(name: str, dists: list[str]) -> list[str]:
    """The distributions of ``dists`` (those providing ``name``'s top-level package) that hold ``name``: the
    ones with files under its deepest dotted path any of them holds. A namespace package (``google``: protobuf,
    google-cloud-storage, ...) is shared, so ``google.cloud.storage`` is judged by google-cloud-storage alone,
    not passed because protobuf is on the nodes."""
    dists = list(dict.fromkeys(dists))
    parts = name.split(".")
    if len(dists) < 2 or len(parts) < 2:
        return dists
    files = {d: [str(f) for f in importlib.metadata.distribution(d).files or []] for d in dists}
    for depth in range(len(parts), 1, -1):
        path = "/".join(parts[:depth])
        owners = [d for d in dists if any(f.startswith((path + "/", path + ".")) for f in files[d])]
        if owners:
            return owners
    return dists


#: what an ``except`` that guards an import catches (the import may fail: the module has a way without it)
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _load_time_imports(tree) -> list[tuple[str, str, int]]:
    """``(name as imported, dotted path, line)`` of each absolute import that runs when the module loads and
    must succeed (``from a.b import c``: ``a.b`` and ``a.b.c``, which may be a module or a name in ``a.b``):
    not inside a function (a class body runs), nor under ``if TYPE_CHECKING:`` or ``if __name__ ==
    "__main__":``, nor in a ``try`` whose ``except`` catches ImportError or a ``with
    contextlib.suppress(ImportError)`` (the module copes without it)."""
    import ast

    def name(node) -> str:
        return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")

    def guarded(node) -> bool:
        if isinstance(node, ast.If):
            test = node.test
            main = isinstance(test, ast.Compare) and name(test.left) == "__name__" and \
                [type(op) for op in test.ops] == [ast.Eq] and \
                [getattr(c, "value", None) for c in test.comparators] == ["__main__"]
            return main or name(test) == "TYPE_CHECKING"
        if isinstance(node, ast.With):      # with contextlib.suppress(ImportError):
            return any(isinstance(item.context_expr, ast.Call) and name(item.context_expr.func) == "suppress"
                       and {name(a) for a in item.context_expr.args} & _IMPORT_ERRORS for item in node.items)
        if isinstance(node, ast.Try):
            caught = [h.type for h in node.handlers]
            names = {name(n) for t in caught if t is not None for n in (t.elts if isinstance(t, ast.Tuple) else [t])}
            return None in caught or bool(names & _IMPORT_ERRORS)
        return False

    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if guarded(node):
            todo += list(getattr(node, "orelse", [])) + list(getattr(node, "finalbody", []))
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:     # a name may be a module
            found += [(node.module, f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
        else:
            todo += list(ast.iter_child_nodes(node))
    return found


def check_hparams_read(module: ModuleType, variants: list[dict | None]) -> None:
    """Every name of ``training.hparams`` is looked up by ``build_model`` with at least one of ``variants`` (a
    run's hparams; a sweep's, one per trial): a misspelt name would be passed, ignored, and a sweep over it
    would rank noise. Each variant is built once (a variant's own error names its values). Not checked where
    :func:`tfc_harness.usermodel.hparams_reads` cannot tell."""
    reads = []
    for hparams in (v for v in variants if v):
        try:
            got = usermodel.hparams_reads(module, hparams)
        except ModelModuleError as exc:
            raise ModelModuleError(f"{exc} (training.hparams {hparams})" if len(variants) > 1 else str(exc)) \
                from None
        if got is None:
            return
        reads.append(got)
    given = list(dict.fromkeys(k for got in reads for k in got.given))
    read = set().union(*(got.read for got in reads))
    unread = [k for k in given if k not in read]
    if not unread:
        return
    hint = f"it reads {', '.join(sorted(str(k) for k in read if k in given)) or 'none of them'}"
    asked = sorted(str(k) for k in read if k not in given)
    hint += f"; it looks up {', '.join(asked)}, not set" if asked else ""
    where = " with any trial's values" if len(variants) > 1 else ""
    raise usermodel.fail(module, "build_model", f"never reads training.hparams {', '.join(map(repr, unread))}"
                         f"{where} ({hint}): a misspelt name, or one this model does not use; remove it, or read "
                         f"it in build_model")


def _check_data_source(job: dict, module: ModuleType) -> None:
    """The module has what its data source needs (no TensorFlow)."""
    files = job.get("data")
    if files and formats.get(files["format"]).needs_decode and getattr(module, "decode", None) is None:
        raise ModelModuleError(f"model module {usermodel.label(module)} has no decode(record) function"
                               f"{usermodel.slip_hint(module, 'decode', (1,))}; data.format {files['format']} needs "
                               "one to turn a record into (features, label)")
    if not files and not usermodel.has_dataset(module):
        raise ModelModuleError(f"model module {usermodel.label(module)} has no data: define make_dataset() "
                               "or name files in the cluster file's data.train and data.test")


def run(job: dict) -> dict:
    """Prepare the run's data; returns ``{"data": settings data | None, "dataset_prefix", "describe",
    "probe"}`` (``probe``: ``checked``, or ``cached`` when this job's check had passed before), and for files
    ``interface``, what :func:`check` returned.  Nothing is stored before the model, its loss and its metrics
    have worked on a few real examples.  For module arrays ``make_dataset()`` runs before that check (its
    examples are part of the stamp's key); for files the listing does (their keys, ETags and sizes are), and
    the module's interface is checked first (``validate``, ``plan`` and ``up`` of files on the local store run
    this instead of ``check``)."""
    source = usermodel.resolve_path(job["module"]).read_bytes()   # the bytes imported are the bytes keyed
    if job.get("data"):
        return _run_files(job, source)
    module = load(job["module"])   # imported once: the user's module-level code runs once
    return _run_arrays(job, module, source)


def _run_files(job: dict, source: bytes) -> dict:
    """A stamp of the same job on the same listing holds the whole result: neither the module nor
    TensorFlow is imported, and no file is read.  The result's ``interface`` is what :func:`check` returned
    (the module's interface is checked first, so its errors come before the data's)."""
    client = _client(job)
    listing = _listing(client, job)
    # the nodes' packages and whether every hparam must be read are keyed too: the result stands for check()
    keyed = [job["data"], job["workers"], listing, job.get("node_packages"), job.get("every_hparam_read", True)]
    stamp = _probe_stamp(job, source, json.dumps(keyed, sort_keys=True).encode())
    cached = _read_stamp(stamp)
    if cached is not None:
        return dict(cached, probe="cached")
    module = load(job["module"])
    interface = check(job, module, job.get("every_hparam_read", True))
    result, (x, y) = _files(client, job, module, listing)
    _check_on(module, job, x, y)
    result["interface"] = interface     # what `check` says: the controller need not run it apart
    if stamp is not None:
        _write_stamp(stamp, json.dumps(result))
    return dict(result, probe="checked")


def _run_arrays(job: dict, module: ModuleType, source: bytes) -> dict:
    _check_data_source(job, module)
    splits = data.splits_from_module(module)
    x, y = (a[:PROBE_EXAMPLES] for a in splits["test"])
    labels = [split[1] for split in splits.values()]     # every label is checked, not only the probe's
    stamp = _probe_stamp(job, source, *(f"{a.dtype.str}{a.shape}".encode() + a.tobytes() for a in (x, y, *labels)))
    cached = stamp is not None and stamp.exists()
    if not cached:
        check(job, module, job.get("every_hparam_read", True))
        loss = usermodel.loss_fn(module)
        for split in labels:
            usermodel.check_probability_labels(module, loss, split, None)
        _check_on(module, job, x, y)
    result = _store_arrays(_client(job), job, splits)
    if stamp is not None and not cached:
        _write_stamp(stamp)     # once the arrays are stored too: the whole of this step passed
    return dict(result, probe="cached" if cached else "checked")


def _client(job: dict):
    return s3io.make_client(job.get("endpoint"), job.get("region"), whole_objects=job.get("whole_object_gets", False))


def _check_on(module: ModuleType, job: dict, x, y) -> None:
    """The model (built for these examples), its loss and its metrics on ``x``, ``y``."""
    model = usermodel.build_model(module, tuple(x.shape[1:]), job.get("hparams"))
    usermodel.check_batch(module, model, x, y, usermodel.loss_fn(module), (job.get("data") or {}).get("format"))


#: the harness files (and folders: each of their modules) whose code checks a job (here and in the
#: controller's cached interface check, ``tfcluster.job``): a change to any of them checks it again
CHECK_CODE = ("prepare.py", "usermodel.py", "data.py", "inputs.py", "formats", "sources.py")
#: the distributions a TensorFlow release may come as, the first installed one named in the key
TENSORFLOW_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-intel", "tf-nightly", "tf-nightly-cpu")


def code_digest(source: bytes):
    """A sha256 of a module file's ``source`` and of :data:`CHECK_CODE` (the code that checks it), to extend
    with what else a cached check depends on."""
    digest = hashlib.sha256(source)
    here = Path(__file__).parent
    for name in CHECK_CODE:
        for path in sorted((here / name).rglob("*.py")) if (here / name).is_dir() else [here / name]:
            digest.update(path.read_bytes())
    return digest


def _probe_stamp(job: dict, source: bytes, *examples: bytes) -> Path | None:
    """Where a passed check of this job on these ``examples`` is recorded (the module's arrays; for files,
    the data settings, the number of training tasks and the listing); None without ``probe_cache``.

    The key is the module file's ``source``, the hparams, the examples, :data:`CHECK_CODE`, Python's,
    TensorFlow's, Keras's and NumPy's releases and ``KERAS_BACKEND``; not other files the module imports or
    reads (a change there alone is not checked again until the module file changes)."""
    if not job.get("probe_cache"):
        return None
    digest = code_digest(source)
    digest.update(json.dumps(job.get("hparams") or {}, sort_keys=True).encode())
    for part in examples:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    digest.update(f"{sys.version_info[:2]} {_release(*TENSORFLOW_DISTRIBUTIONS)} {_release('keras')} "
                  f"{_release('numpy')} {os.environ.get('KERAS_BACKEND', '')}".encode())
    return Path(job["probe_cache"]) / f"{digest.hexdigest()}.passed"


def _release(*names: str) -> str:
    for name in names:
        try:
            return f"{name}=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def _write_stamp(stamp: Path, content: str = "") -> None:
    """Record a passed check (with ``content``: what it found); a stamp that cannot be written (a read-only or
    full cache) only means the next run checks again."""
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=stamp.parent, prefix=".stamp.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.replace(tmp, stamp)
    except OSError as exc:
        print(f"warning: could not record the passed check in {stamp.parent}: {exc}", file=sys.stderr, flush=True)


def _read_stamp(stamp: Path | None) -> dict | None:
    """What a passed check of files recorded, or None (no stamp, or one that cannot be read: check again)."""
    if stamp is None:
        return None
    try:
        return json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None


def _store_arrays(client, job: dict, splits: dict) -> dict:
    info = data.store_splits(client, job["bucket"], job["dataset_base"], splits)
    describe = {"source": "arrays", "bucket": job["bucket"], "prefix": info["prefix"], "sha256": info["sha256"],
                "rows": info["rows"]}
    return {"data": None, "dataset_prefix": info["prefix"], "uploaded": info["uploaded"], "describe": describe}


#: what a listing refused for the bucket itself means to the user (a storage failure stays one: exit status 1)
_BUCKET_REFUSALS = {
    "NoSuchBucket": "the bucket s3://{bucket}/ does not exist in the object store (a typo, or data not uploaded yet)",
    "AccessDenied": "listing s3://{bucket}/ is refused (AccessDenied): the credentials in use may not read "
                    "that bucket",
}


def _listed(client, field: str, url: str) -> tuple[str, list[dict]]:
    from . import sources

    try:
        bucket, _ = sources.parse_url(url)
    except ValueError as exc:
        raise DataError(f"{field}: {exc}") from None
    try:
        files = sources.list_files(client, url)
    except s3io.TransferError as exc:
        code = getattr(exc.__cause__, "response", {}).get("Error", {}).get("Code")
        if code not in _BUCKET_REFUSALS:
            raise
        refused = DataMissing if code == "NoSuchBucket" else DataError
        raise refused(f"{field}: {url}: {_BUCKET_REFUSALS[code].format(bucket=bucket)}") from None
    if not files:
        hint = _folder_hint(client, url) or _nearest_folder_hint(client, url)
        raise DataMissing(f"{field}: {url} matches no object in s3://{bucket}/{hint}")
    return bucket, files


#: the most entries of a folder a hint names
HINT_ENTRIES = 8


def _nearest_folder_hint(client, url: str) -> str:
    """A URL that names no object: the deepest folder above the URL's literal part that holds something, and what
    (a mistyped folder, ``s3://b/set/rg/train/``: `` (s3://b/set/ holds set/reg/, set/reg2/)``)."""
    from . import sources

    bucket, prefix = sources.listed_prefix(url)
    folders = prefix.split("/")[:-1]
    for depth in range(len(folders), -1, -1):
        folder = "".join(f"{name}/" for name in folders[:depth])
        try:
            names = sources.folder_entries(client, bucket, folder, HINT_ENTRIES + 1)
        except s3io.TransferError:  # no hint, rather than another error in place of the one that matters
            return ""
        if names:
            more = ", …" if len(names) > HINT_ENTRIES else ""
            return f" (s3://{bucket}/{folder} holds {', '.join(names[:HINT_ENTRIES])}{more})"
    return ""


def _folder_hint(client, url: str) -> str:
    """A URL that names no object but a folder without its '/' (``s3://b/data/train``): what that folder holds."""
    if url.endswith("/") or any(c in url for c in "*?["):
        return ""
    from . import sources

    try:
        under = sources.list_files(client, url + "/")
    except s3io.TransferError:      # no hint, rather than another error in place of the one that matters
        return ""
    return f" (but {url}/ holds {len(under)} file(s): a folder's URL ends with '/')" if under else ""


def _listing(client, job: dict) -> dict:
    """The files of both splits: ``{"bucket", "train": [...], "test": [...]}`` (:func:`sources.list_files`),
    each split matching something, both in one bucket, no file in both."""
    spec = job["data"]
    bucket, train = _listed(client, "data.train", spec["train"])
    test_bucket, test = _listed(client, "data.test", spec["test"])
    if test_bucket != bucket:
        raise DataError(f"data.test: s3://{test_bucket}/ is not the bucket of data.train (s3://{bucket}/); "
                        "keep both splits in one bucket")
    shared = sorted({f["key"] for f in train} & {f["key"] for f in test})
    if shared:
        raise DataError(f"data.train and data.test both match s3://{bucket}/{shared[0]}: the splits must be disjoint")
    return {"bucket": bucket, "train": train, "test": test}


def check_listing(client, job: dict) -> dict:
    """The first part of the files' check on its own (no module, no TensorFlow): both splits listed
    (:func:`_listing`), a share of the training files for every training task and, for CSV files, the
    start of every file (:func:`_each_file`: a ranged GET each). The controller runs it before anything is
    created where the store is on its own machine."""
    listing = _listing(client, job)
    _assigned(listing["train"], job["workers"])
    _each_file(client, job["data"], listing)
    return listing


def _assigned(train: list[dict], workers: int) -> list[list[dict]]:
    from . import sources

    try:
        return sources.assign(train, workers)
    except ValueError as exc:
        raise DataError(f"data.train: {exc}") from None


def _files(client, job: dict, module: ModuleType, listing: dict):
    spec = job["data"]
    bucket, train, test = listing["bucket"], listing["train"], listing["test"]
    assigned = _assigned(train, job["workers"])
    columns, starts = _each_file(client, spec, listing)
    named = formats.get(spec["format"]).named_columns
    settings_data = {"source": "files", "format": spec["format"], "bucket": bucket,
                     "label": spec.get("label") if named else None, "columns": columns,
                     "train": assigned, "test": test}
    x, y = _probe_files(client, bucket, settings_data, module, test[0])
    _probe_files(client, bucket, settings_data, module, train[0])
    _check_first_records(client, bucket, settings_data, module, train + test, starts, test[0], (x, y))
    describe = {"source": "files", "format": spec["format"], "bucket": bucket,
                "label": settings_data["label"], "columns": columns,
                "train": [{k: f[k] for k in ("key", "etag", "size")} for f in train],
                "test": [{k: f[k] for k in ("key", "etag", "size")} for f in test]}
    return {"data": settings_data, "dataset_prefix": None, "describe": describe}, (x, y)


def _each_file(client, spec: dict, listing: dict) -> tuple[list[str] | None, list]:
    """Every file of both splits starts as ``data.format`` says (:meth:`formats.Format.start`: a ranged GET
    each, 8 at once) and the starts agree (:meth:`formats.Format.columns`: CSV files one header, the label
    among its columns). Returns the column names (None for a format without named columns) and each file's
    start (the training files', then the test files')."""
    from concurrent.futures import ThreadPoolExecutor

    fmt = formats.get(spec["format"])
    bucket, files = listing["bucket"], listing["train"] + listing["test"]

    def start(f: dict):
        try:
            return fmt.start(client, bucket, f["key"])
        except ValueError as exc:   # the message names the file
            raise DataError(str(exc)) from None

    pool = ThreadPoolExecutor(max_workers=min(8, len(files)))
    try:        # in order: the earliest file's error first; then the reads not started yet are dropped
        starts = [future.result() for future in [pool.submit(start, f) for f in files]]
    finally:
        pool.shutdown(cancel_futures=True)
    try:
        return fmt.columns(bucket, [f["key"] for f in files], starts, spec.get("label")), starts
    except ValueError as exc:
        raise DataError(str(exc)) from None


def _reader(settings_data: dict, module: ModuleType):
    """The workers' reader of these files (:func:`formats.reader`), with the module's ``decode``."""
    return formats.reader(settings_data["format"], decode=getattr(module, "decode", None),
                          columns=settings_data["columns"], label=settings_data["label"])


def _probe_files(client, bucket: str, settings_data: dict, module: ModuleType, first: dict):
    """The first examples of one file, read as the workers will read them."""
    import tensorflow as tf

    where = f"s3://{bucket}/{first['key']}"
    read = _reader(settings_data, module)
    with tempfile.TemporaryDirectory(prefix="tfc-probe-") as tmp:
        path = s3io.download_file(client, bucket, first["key"], Path(tmp) / "probe")
        try:
            dataset = read(tf.data.Dataset.from_tensor_slices([str(path)]))
            element = dataset.element_spec
            if not isinstance(element, tuple) or len(element) != 2 or \
                    not all(isinstance(e, tf.TensorSpec) for e in element):
                raise ModelModuleError(f"model module {usermodel.label(module)}: decode() must return a pair "
                                       f"(features, label) of tensors (got {element})")
            batch = next(iter(dataset.batch(PROBE_EXAMPLES)), None)
        except HarnessError:
            raise
        except ValueError as exc:
            if "decode(record)" not in str(exc):
                raise DataError(f"{where}: {cause(str(exc))}") from None
            raise ModelModuleError(f"model module {usermodel.label(module)}: decode() returns the wrong "
                                   f"structure: {cause(str(exc))}") from None
        except Exception as exc:
            raise _read_error(where, path, "first records", formats.get(settings_data["format"]), exc) from None
    if batch is None:
        raise DataError(f"{where} holds no examples")
    return batch[0].numpy(), batch[1].numpy()


def _check_first_records(client, bucket: str, settings_data: dict, module: ModuleType, files: list[dict],
                         starts: list, probed: dict, examples: tuple) -> None:
    """Each file's first record, read as the workers will read it, where the format gives one
    (:meth:`formats.Format.first_record_file`: a TFRecord file's first record, a CSV file's first row): an
    error reading it (another schema for ``decode``, a record cut short, a cell that is not a number) or an
    example whose shapes differ from ``probed``'s ``examples`` (the batches stack them) is named with its file
    before any node trains, not in the middle of a run.  The records are fetched (8 at once, where the start
    does not hold them) and read :data:`FIRST_RECORDS_AT_ONCE` files at a time."""
    from concurrent.futures import ThreadPoolExecutor

    fmt = formats.get(settings_data["format"])
    read = _reader(settings_data, module)
    want = tuple(tuple(part.shape[1:]) for part in examples)
    pending = list(zip(files, starts, strict=True))
    with ThreadPoolExecutor(max_workers=8) as pool:
        while pending:
            batch, pending = pending[:FIRST_RECORDS_AT_ONCE], pending[FIRST_RECORDS_AT_ONCE:]
            records = list(pool.map(lambda fs: fmt.first_record_file(client, bucket, fs[0]["key"], fs[1]), batch))
            found = [(f, record) for (f, _), record in zip(batch, records, strict=True) if record is not None]
            for f, shapes in _first_examples(read, found, bucket, fmt):
                if shapes != want:
                    raise DataError(f"s3://{bucket}/{f['key']}: its first {fmt.record} gives features of shape "
                                    f"{shapes[0]} and a label of shape {shapes[1]}, where s3://{bucket}/"
                                    f"{probed['key']}'s give {want[0]} and {want[1]}: every example must have "
                                    f"the same shapes (batches stack them)")


#: files whose first records one dataset reads (their bytes are on disk meanwhile)
FIRST_RECORDS_AT_ONCE = 256


def _first_examples(read, records: list[tuple[dict, bytes]], bucket: str, fmt: formats.Format):
    """``(file, shapes of its example)`` for each of ``records`` (a file and a file of its first record, of
    format ``fmt``), read with ``read`` in one dataset; DataError naming the file whose record fails."""
    import tensorflow as tf

    if not records:
        return
    with tempfile.TemporaryDirectory(prefix="tfc-first-records-") as tmp:
        paths = [Path(tmp) / str(i) for i in range(len(records))]
        for path, (_, record) in zip(paths, records, strict=True):
            path.write_bytes(record)
        got = iter(read(tf.data.Dataset.from_tensor_slices([str(p) for p in paths])))
        for (f, _), path in zip(records, paths, strict=True):      # one example a file, in the files' order
            where = f"s3://{bucket}/{f['key']}"
            try:
                example = next(got)
            except StopIteration:
                raise DataError(f"{where}: its first {fmt.record} gives no example") from None
            except Exception as exc:
                raise _read_error(where, path, f"first {fmt.record}", fmt, exc) from None
            yield f, tuple(tuple(part.shape) for part in example)


def _read_error(where: str, path, what: str, fmt, exc: Exception) -> DataError:
    """The DataError naming ``where`` (an S3 file) for ``exc``, raised reading ``what`` of its local copy
    ``path`` with ``fmt``'s reader: the CSV reader's own message about a cell as it is, with ``where`` for the
    path; another with what the file's first record holds, where the format says (a TFRecord's features)."""
    line = cause(str(exc))
    own = _ASSERTED.search(line)
    if own and own.group(1).startswith(f"{path}: "):
        return DataError(where + own.group(1).removeprefix(str(path)))
    summary = fmt.first_record_summary(path)
    return DataError(f"{where}: reading its {what} with {fmt.parsing} failed: {type(exc).__name__}: {line}"
                     + (f" ({summary})" if summary else ""))


#: a failed ``tf.debugging.Assert``'s message in TensorFlow's error
_ASSERTED = re.compile(r"assertion failed: \[(.*)\]$")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("check", "run"):
        print("usage: python -m tfc_harness.prepare check|run JSON", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        result = (check if args[0] == "check" else run)(json.loads(args[1]))
    except HarnessError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        return 2
    except (s3io.TransferError, s3io.CredentialsMissing) as exc:
        print(f"ERROR: object storage: {exc}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    ending.exit_now(main())   # the caller waits for the exit: not for the teardown of TensorFlow
