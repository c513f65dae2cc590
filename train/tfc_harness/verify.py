"""Reading a published run back from S3 and evaluating it in a fresh Python process (controller side).

``verify_run`` refuses a run without ``_SUCCESS``, downloads every object under the run prefix, checks each
file against ``manifest.json`` (sha256 and size; a file under ``model/`` that the manifest does not list
is also an error), then runs ``python -m tfc_harness.evaluate`` with ``sys.executable`` on the test split.

CLI::

    python -m tfc_harness.verify --bucket B --run-prefix runs/c/ID --dest DIR [--endpoint URL] [--region R]

prints ``test accuracy: 0.9xxx`` and exits 0, or prints the problem and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from . import data, manifest, publish, s3io

HARNESS_PARENT = Path(__file__).resolve().parent.parent   # the dir holding tfc_harness/
EVAL_TIMEOUT_S = 300


class VerificationError(RuntimeError):
    """The run is not published, incomplete, corrupted, or its model does not load."""


def _download_run(s3_client, bucket: str, run_prefix: str, dest: Path) -> list[str]:
    rels = []
    folder = run_prefix.strip("/") + "/"
    for key in s3io.list_keys(s3_client, bucket, run_prefix):
        rel = key[len(folder):]
        target = (dest / rel).resolve()
        if dest not in target.parents:
            raise VerificationError(f"refusing key {key!r}: it would land outside {dest}")
        s3io.download_file(s3_client, bucket, key, target)
        rels.append(rel)
    return sorted(rels)


def evaluate_in_subprocess(model_dir: str | os.PathLike, test_npz: str | os.PathLike,
                           timeout_s: float = EVAL_TIMEOUT_S) -> dict:
    """Run :mod:`tfc_harness.evaluate` in a new interpreter; returns its JSON result."""
    # The evaluator needs no S3 access: keep credentials out of its environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HARNESS_PARENT), env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run([sys.executable, "-m", "tfc_harness.evaluate", str(model_dir), str(test_npz)],
                          capture_output=True, text=True, env=env, timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise VerificationError(f"evaluating {model_dir} failed (exit {proc.returncode}): "
                                f"{proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def verify_run(s3_client, bucket: str, run_prefix: str, dest_dir: str | os.PathLike,
               dataset_prefix: str | None = None) -> dict:
    """Verify the run at ``s3://bucket/run_prefix`` and evaluate its model.

    ``dataset_prefix`` defaults to the one the chief recorded in ``manifest.json``.  Returns
    ``{"test_accuracy", "test_loss", "n", "files" (checked manifest keys), "metrics" (published
    metrics.json), "model_dir"}``.  Raises :class:`VerificationError` or
    :class:`tfc_harness.manifest.ManifestMismatch` (naming the bad file).
    """
    run_prefix = run_prefix.strip("/")
    if not publish.published(s3_client, bucket, run_prefix):
        raise VerificationError(f"s3://{bucket}/{run_prefix}/{publish.SUCCESS} is missing: the run was "
                                "not published completely; refusing to use it")
    dest = Path(dest_dir).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    rels = _download_run(s3_client, bucket, run_prefix, dest)
    for name in (publish.MANIFEST, publish.METRICS):
        if name not in rels:
            raise VerificationError(f"s3://{bucket}/{run_prefix}/{name} is missing")
    doc = json.loads((dest / publish.MANIFEST).read_text())
    checked = manifest.check_files(doc, dest)
    unlisted = sorted(r for r in rels if r.startswith(manifest.MODEL_DIR + "/") and r not in doc["files"])
    if unlisted:
        raise manifest.ManifestMismatch(f"{unlisted[0]}: not listed in the manifest")
    dataset_prefix = dataset_prefix or doc.get("dataset_prefix")
    if not dataset_prefix:
        raise VerificationError("no dataset_prefix given and none recorded in manifest.json")
    test_npz = dest / "_verify" / "test.npz"
    s3io.download_file(s3_client, bucket, data.split_key(dataset_prefix, "test"), test_npz)
    result = evaluate_in_subprocess(dest / manifest.MODEL_DIR, test_npz)
    result.update(files=checked, metrics=json.loads((dest / publish.METRICS).read_text()),
                  model_dir=str(dest / manifest.MODEL_DIR))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfc_harness.verify", description=__doc__.split("\n")[0])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--run-prefix", required=True)
    parser.add_argument("--dest", required=True, help="local directory to download the run into")
    parser.add_argument("--endpoint", default=None, help="S3-compatible endpoint URL (default: AWS)")
    parser.add_argument("--region", default=None)
    parser.add_argument("--dataset-prefix", default=None, help="default: as recorded in manifest.json")
    args = parser.parse_args(argv)
    try:
        client = s3io.make_client(args.endpoint, args.region)
        result = verify_run(client, args.bucket, args.run_prefix, args.dest, args.dataset_prefix)
    except (VerificationError, manifest.ManifestMismatch, s3io.TransferError,
            s3io.CredentialsMissing) as exc:
        print(f"verification failed: {exc}", file=sys.stderr)
        return 1
    print(f"verified {len(result['files'])} files against the manifest")
    print(f"test accuracy: {result['test_accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
