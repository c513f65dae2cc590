"""What a run's tasks ask of S3, and whether an IAM policy document allows it (helpers for tests/cloud).

moto stores an identity policy but does not evaluate its ``s3:prefix`` condition, so the nodes' policy is
checked here instead: the harness's own code does what a run's tasks do (read the data set, look for
``_SUCCESS``, restore, write and rotate checkpoints, publish) against the emulator, every request its boto3
client makes is recorded, turned into the IAM action, resource and condition keys AWS evaluates, and
checked against the policy's Allow statements (the nodes' policy has no Deny).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from tfc_harness import checkpoints, data, publish, s3io

from tfcluster import job, training
from tfcluster.config import RunSpec

KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_ACTIONS = {"PutObject": "s3:PutObject", "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject",
            "CompleteMultipartUpload": "s3:PutObject", "AbortMultipartUpload": "s3:AbortMultipartUpload",
            "GetObject": "s3:GetObject", "HeadObject": "s3:GetObject", "DeleteObject": "s3:DeleteObject"}


def recording_client(endpoint: str) -> tuple[object, list[tuple[str, dict]]]:
    """The harness's S3 client and the list each request's (operation, parameters) is appended to."""
    client = s3io.make_client(endpoint, "us-east-1", credentials=KEYS)
    seen: list[tuple[str, dict]] = []
    client.meta.events.register("before-parameter-build.s3",
                                lambda params, model, **_: seen.append((model.name, dict(params))))
    return client, seen


def iam_requests(operation: str, params: dict) -> list[tuple[str, str, dict]]:
    """``(action, resource ARN, condition keys)`` AWS authorises for one S3 request."""
    bucket = params["Bucket"]
    if operation in ("ListObjectsV2", "ListObjects"):
        prefix = {"s3:prefix": params["Prefix"]} if "Prefix" in params else {}
        return [("s3:ListBucket", f"arn:aws:s3:::{bucket}", prefix)]
    if operation == "DeleteObjects":
        return [("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{o['Key']}", {}) for o in params["Delete"]["Objects"]]
    return [(_ACTIONS[operation], f"arn:aws:s3:::{bucket}/{params['Key']}", {})]


def _matches(pattern: str, value: str) -> bool:
    """IAM's matching: ``*`` any characters ('/' too), ``?`` one."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, value) is not None


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def allows(doc: dict, action: str, resource: str, context: dict) -> bool:
    for st in doc["Statement"]:
        assert st["Effect"] == "Allow", st  # a Deny would need AWS's full evaluation order
        if not any(_matches(a, action) for a in _listed(st["Action"])):
            continue
        if not any(_matches(r, resource) for r in _listed(st["Resource"])):
            continue
        conditions = st.get("Condition", {})
        assert set(conditions) <= {"StringLike"}, conditions
        if all(key in context and any(_matches(v, context[key]) for v in _listed(values))
               for key, values in conditions.get("StringLike", {}).items()):
            return True
    return False


def normalized(doc: dict) -> dict:
    """``doc`` with each list of actions or resources sorted (the provider writes them in its set order)."""
    return {**doc, "Statement": [{k: sorted(v) if isinstance(v, list) else v for k, v in st.items()}
                                 for st in doc["Statement"]]}


def refused(doc: dict, requests: list[tuple[str, dict]]) -> list[str]:
    """The requests ``doc`` does not allow, as ``action resource`` lines."""
    return [f"{action} {resource} {context or ''}".strip() for op, params in requests
            for action, resource, context in iam_requests(op, params) if not allows(doc, action, resource, context)]


def run_requests(spec: RunSpec, endpoint: str, work: Path, run_id: str = "20260101-000000-abcd") \
        -> tuple[list, list]:
    """Store the module's data set as the controller does, then do what a run's tasks do in S3, with the
    run's own layout (``training.run_settings``). Returns the controller's requests and the tasks'."""
    controller, stored_by = recording_client(endpoint)
    rng = np.random.default_rng(0)
    splits = {s: data.check_arrays(rng.random((8, 3)), rng.integers(0, 2, 8)) for s in data.SPLITS}
    stored = data.store_splits(controller, spec.storage.bucket, job.dataset_base(spec), splits)
    s3 = training.run_settings(spec, run_id, {"dataset_prefix": stored["prefix"]})["s3"]
    bucket, run_prefix, ckpt_prefix = s3["bucket"], s3["run_prefix"], s3["checkpoint_prefix"]

    node, asked = recording_client(endpoint)
    for split in data.SPLITS:                                   # each task's data, the chief's test split
        data.load_split(node, bucket, s3["dataset_prefix"], split)
    assert not publish.published(node, bucket, run_prefix)     # the chief's refuse_published
    assert checkpoints.saved_steps(node, bucket, ckpt_prefix) == []   # restore: nothing yet
    local = work / "ckpt"
    local.mkdir(parents=True)
    for step in range(1, checkpoints.KEEP + 2):                # the last upload rotates the first out
        for suffix in ("data-00000-of-00001", "index"):
            (local / f"{checkpoints.PREFIX}-{step}.{suffix}").write_bytes(b"w" * 64)
        checkpoints.upload(node, bucket, ckpt_prefix, local, step)
    assert checkpoints.saved_steps(node, bucket, ckpt_prefix) == list(range(2, checkpoints.KEEP + 2))
    assert checkpoints.download_latest(node, bucket, ckpt_prefix, work / "restored")  # a restarted chief
    model = work / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"pb")
    (model / "variables" / "variables.index").write_bytes(b"ix")
    metrics = {"test_loss": 0.5, "headline": "test_loss", "steps": 4, "examples_per_sec": 1.0,
               "train_seconds": 1.0, "workers": 2, "restored_from_step": 0}
    publish.publish_run(node, bucket, run_prefix, model, metrics, run_id, spec.cluster, log=lambda _: None)
    assert publish.published(node, bucket, run_prefix)
    return stored_by, asked
