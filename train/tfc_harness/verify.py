"""Reading a published run back from S3 and evaluating it in a fresh Python process (controller side).

``verify_run`` refuses a run without ``_SUCCESS``, downloads ``manifest.json``, ``metrics.json``,
``_SUCCESS`` and every model file the manifest lists (not the run's checkpoints), checks each against the
manifest (sha256 and size; a file under ``model/`` that the manifest does not list is also an error),
downloads the test split the *caller* names (the controller's own record of the run's data, not anything
the chief wrote), runs ``python -m tfc_harness.evaluate`` in a sandbox (:mod:`tfc_harness.sandbox`: the model
is the chief's code) and compares every ``test_*`` figure with the chief's ``metrics.json``
(:data:`TOLERANCE`).

CLI::

    python -m tfc_harness.verify --bucket B --run-prefix runs/c/ID --dest DIR --module PATH
        (--dataset-prefix datasets/NAME-HASH | --data-json FILE) [--endpoint URL] [--region R]

prints ``test <metric>: <value>`` for each metric and exits 0, or prints the problem and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import inputs, manifest, publish, s3io, sandbox

HARNESS_PARENT = Path(__file__).resolve().parent.parent   # the dir holding tfc_harness/
EVAL_TIMEOUT_S = 600
#: the niceness a WarmEvaluator waits at: its TensorFlow import takes only CPU the training leaves idle (on the
#: local provider the controller shares its cores with the nodes: at the same priority, the import slowed the
#: training loop by about what it saved the verification)
WAIT_NICE = 19
TOLERANCE = 1e-3      # |verifier - chief| <= TOLERANCE * max(1, |chief|) for every test_* figure


class VerificationError(RuntimeError):
    """The run is not published, incomplete, corrupted, or its model does not load."""


def _download(s3_client, bucket: str, run_prefix: str, rel: str, dest: Path) -> Path:
    target = (dest / rel).resolve()
    if dest not in target.parents:
        raise VerificationError(f"refusing {rel!r}: it would land outside {dest}")
    return s3io.download_file(s3_client, bucket, s3io.join_key(run_prefix, rel), target)


def _model_keys(s3_client, bucket: str, run_prefix: str) -> list[str]:
    folder = s3io.join_key(run_prefix, manifest.MODEL_DIR) + "/"
    return sorted(key[len(run_prefix) + 1:] for key in s3io.list_keys(s3_client, bucket, folder))


def evaluate_in_subprocess(model_dir: str | os.PathLike, module_path: str, test_spec: dict,
                           timeout_s: float = EVAL_TIMEOUT_S, warm: WarmEvaluator | None = None) -> dict:
    """Run :mod:`tfc_harness.evaluate` in a fresh interpreter inside the sandbox (:mod:`tfc_harness.sandbox`:
    no network, a read-only view, uid nobody); returns its JSON result.  The test data the spec names must lie
    in one directory, ``test_spec["dir"]``.  The model and the data are this process's own copies, opened to
    every reader; the user's module file is copied, so that its own directory's permissions do not matter.
    ``warm``: a :class:`WarmEvaluator` to hand them to, when they lie in its directory (else a new process)."""
    data_dir = Path(test_spec["dir"]).resolve()
    if warm is not None and warm.serves(model_dir, data_dir):
        proc = warm.evaluate(model_dir, module_path, test_spec, timeout_s)
    else:
        proc = _evaluate_fresh(model_dir, module_path, test_spec, data_dir, timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise VerificationError(f"evaluating {model_dir} failed (exit {proc.returncode}): "
                                f"{proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def _stage(model_dir: str | os.PathLike, data_dir: Path, module_path: str, staging: Path) -> Path:
    """Open the model and the data to the sandbox's user and copy the module into ``staging``; its copy."""
    for tree in (Path(model_dir), data_dir):
        sandbox.open_to_all(tree)
    module = staging / Path(module_path).name
    shutil.copyfile(module_path, module)
    sandbox.open_to_all(staging)
    return module


def _evaluate_fresh(model_dir: str | os.PathLike, module_path: str, test_spec: dict, data_dir: Path,
                    timeout_s: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="tfc-verify-") as staging:
        module = _stage(model_dir, data_dir, module_path, Path(staging))
        return sandbox.run("tfc_harness.evaluate", ["{model}", f"{{module}}/{module.name}",
                                                    json.dumps(_inside(test_spec, data_dir, "{data}"))],
                           {"model": model_dir, "module": staging, "data": data_dir, "harness": HARNESS_PARENT,
                            "site": sandbox.site_packages()},
                           python_path=["{harness}", "{site}"], timeout_s=timeout_s)


class WarmEvaluator:
    """:func:`evaluate_in_subprocess`'s process, started before the model exists (while the run trains) so
    that its TensorFlow import is not on the verification's path: the sandbox binds the run's local copy
    ``dest`` (empty then; :func:`verify_run` downloads the model and the test data into it) and a staging
    directory for the module; the evaluator imports TensorFlow at :data:`WAIT_NICE`, then waits for its
    arguments on stdin, which it is given at the caller's priority. It serves one evaluation; :meth:`close`
    ends it, used or not (and removes ``dest`` if it made it and nothing was put there)."""

    def __init__(self, dest: str | os.PathLike):
        self.used = False
        self.dest = Path(dest).resolve()
        self._made_dest = not self.dest.exists()
        self.dest.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix="tfc-verify-"))
        sandbox.open_to_all(self.staging)
        try:
            self.proc = sandbox.start("tfc_harness.evaluate", ["--wait"],
                                      {"dest": self.dest, "module": self.staging, "harness": HARNESS_PARENT,
                                       "site": sandbox.site_packages()}, python_path=["{harness}", "{site}"],
                                      nice=WAIT_NICE)
        except BaseException:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise

    def serves(self, model_dir: str | os.PathLike, data_dir: str | os.PathLike) -> bool:
        """Whether the model and the data lie in the bound directory and the process still waits."""
        inside = all(self.dest in Path(p).resolve().parents for p in (model_dir, data_dir))
        return inside and self.proc.poll() is None

    def evaluate(self, model_dir: str | os.PathLike, module_path: str, test_spec: dict,
                 timeout_s: float = EVAL_TIMEOUT_S) -> subprocess.CompletedProcess:
        module = _stage(model_dir, Path(test_spec["dir"]).resolve(), module_path, self.staging)
        sandbox.renice(self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0))    # its turn now: the caller's priority
        self.used = True
        where = f"{sandbox.INSIDE}/dest"
        args = [f"{where}/{Path(model_dir).resolve().relative_to(self.dest)}", f"{sandbox.INSIDE}/module/{module.name}",
                json.dumps(_inside(test_spec, self.dest, where))]
        try:
            out, err = self.proc.communicate(json.dumps(args) + "\n", timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()     # unshare --kill-child takes the evaluator with it
        self.proc.communicate()
        shutil.rmtree(self.staging, ignore_errors=True)
        if self._made_dest and self.dest.is_dir() and not any(self.dest.iterdir()):
            self.dest.rmdir()


def _inside(spec: dict, data_dir: Path, inside: str) -> dict:
    """The spec with its paths (below ``data_dir``) as the sandbox sees them."""
    def moved(path: str) -> str:
        return f"{inside}/{Path(path).resolve().relative_to(data_dir)}"

    out = {k: v for k, v in spec.items() if k != "dir"}
    if "npz" in out:
        out["npz"] = moved(out["npz"])
    if "paths" in out:
        out["paths"] = [moved(p) for p in out["paths"]]
    return out


def compare(recomputed: dict, published: dict) -> list[str]:
    """The ``test_*`` figures on which the verifier and the chief disagree (or that one of them lacks)."""
    problems = []
    if "n" in recomputed and "test_examples" in published and recomputed["n"] != published["test_examples"]:
        problems.append(f"test examples: recomputed on {recomputed['n']}, the chief evaluated "
                        f"{published['test_examples']}")
    for key in sorted({k for k in (*recomputed, *published) if k.startswith("test_") and k != "test_examples"}):
        mine, theirs = recomputed.get(key), published.get(key)
        if mine is None or theirs is None:
            problems.append(f"{key}: {'missing from metrics.json' if theirs is None else 'not recomputed'}")
        elif abs(mine - theirs) > TOLERANCE * max(1.0, abs(theirs)):
            problems.append(f"{key}: recomputed {mine:.6g}, the chief published {theirs:.6g}")
    return problems


def verify_run(s3_client, bucket: str, run_prefix: str, dest_dir: str | os.PathLike, module_path: str,
               dataset_prefix: str, files: dict | None = None, warm: WarmEvaluator | None = None) -> dict:
    """Verify the run at ``s3://bucket/run_prefix`` and evaluate its model on the test split the caller
    names (``files``: the run settings' ``data``; None: the arrays under ``dataset_prefix``); ``warm``: an
    evaluator started for ``dest_dir`` while the run trained (:class:`WarmEvaluator`).

    Returns ``{"metrics" (recomputed: test_loss, test_<metric>..., n, headline), "published" (the chief's
    metrics.json), "files" (checked manifest keys), "model_dir"}``.  Raises :class:`VerificationError` or
    :class:`tfc_harness.manifest.ManifestMismatch` (naming the bad file).
    """
    run_prefix = run_prefix.strip("/")
    if not publish.published(s3_client, bucket, run_prefix):
        raise VerificationError(f"s3://{bucket}/{run_prefix}/{publish.SUCCESS} is missing: the run was "
                                "not published completely; refusing to use it")
    dest = Path(dest_dir).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for name in (publish.MANIFEST, publish.METRICS, publish.SUCCESS):   # the local copy mirrors the run
        if not s3io.exists(s3_client, bucket, s3io.join_key(run_prefix, name)):
            raise VerificationError(f"s3://{bucket}/{run_prefix}/{name} is missing")
        _download(s3_client, bucket, run_prefix, name, dest)
    doc = json.loads((dest / publish.MANIFEST).read_text())
    listed = doc.get("files") if isinstance(doc.get("files"), dict) else {}
    unlisted = [k for k in _model_keys(s3_client, bucket, run_prefix) if k not in listed]
    if unlisted:
        raise manifest.ManifestMismatch(f"{unlisted[0]}: not listed in the manifest")
    for rel in sorted(listed):
        _download(s3_client, bucket, run_prefix, rel, dest)
    checked = manifest.check_files(doc, dest)
    try:
        spec = inputs.verify_spec(s3_client, bucket, dataset_prefix, files, dest / "_verify")
        recomputed = evaluate_in_subprocess(dest / manifest.MODEL_DIR, module_path, spec, warm=warm)
    finally:
        shutil.rmtree(dest / "_verify", ignore_errors=True)   # the copy of the run keeps no test data
    published_metrics = json.loads((dest / publish.METRICS).read_text())
    problems = compare(recomputed, published_metrics)
    if problems:
        raise VerificationError("the model read back from S3 does not reproduce the chief's metrics: "
                                + "; ".join(problems))
    return {"metrics": recomputed, "published": published_metrics, "files": checked,
            "model_dir": str(dest / manifest.MODEL_DIR)}


def metric_lines(metrics: dict) -> list[str]:
    """``test <metric>: <value>`` for every figure: the headline first, the other metrics in the module's order
    (as ``metrics`` holds them), the loss last."""
    keys = sorted((k for k in metrics if k.startswith("test_")),
                  key=lambda k: (k != metrics.get("headline"), k == "test_loss"))     # (a stable sort)
    return [f"test {k.removeprefix('test_')}: {metrics[k]:.4f}" for k in keys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfc_harness.verify", description=__doc__.split("\n")[0])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--run-prefix", required=True)
    parser.add_argument("--dest", required=True, help="local directory to download the run into")
    parser.add_argument("--endpoint", default=None, help="S3-compatible endpoint URL (default: AWS)")
    parser.add_argument("--region", default=None)
    parser.add_argument("--whole-object-gets", action="store_true",
                        help="download each object in one GET (a store that reads a whole object for any range)")
    parser.add_argument("--module", required=True, help="the model module's .py file (its loss and metrics)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--dataset-prefix", help="the run's arrays (datasets/NAME-HASH)")
    group.add_argument("--data-json", help="a JSON file holding the run settings' data (files in storage)")
    args = parser.parse_args(argv)
    files = json.loads(Path(args.data_json).read_text()) if args.data_json else None
    try:
        client = s3io.make_client(args.endpoint, args.region, whole_objects=args.whole_object_gets)
        result = verify_run(client, args.bucket, args.run_prefix, args.dest, args.module,
                            args.dataset_prefix or "", files)
    except (VerificationError, manifest.ManifestMismatch, s3io.TransferError,
            s3io.CredentialsMissing) as exc:
        print(f"verification failed: {exc}", file=sys.stderr)
        return 1
    print(f"verified {len(result['files'])} files against the manifest")
    print("\n".join(metric_lines(result["metrics"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
