"""The per-node settings dict: validation and the values derived from it.

The rendered entry script hands :func:`tfc_harness.main` one plain dict.  Its keys are fixed; an unknown
or missing key is an error (a typo must not silently fall back to a default)::

    {
      "cluster": "mycluster",                 # cluster name
      "run_id": "20261122-0415-ab12",         # id of this training run
      "role": "chief",                        # "ps" | "worker" | "chief"
      "index": 0,                             # task index within the role
      "tf_config": {"cluster": {"ps": ["10.0.0.2:2222"], "worker": [...], "chief": [...]},
                    "task": {"type": "chief", "index": 0}},
      "model_module": "digits",               # name in <harness_dir>/models/ or absolute path to a .py file
      "steps": 300,                           # training steps in total
      "batch_size": 64,                       # examples per step (one step runs on one worker)
      "learning_rate": 0.005,
      "checkpoint_every": 100,                # steps between checkpoints
      "s3": {"endpoint": null,                # URL of an S3-compatible store, null for AWS
             "region": "us-east-1",
             "bucket": "tfcluster",
             "run_prefix": "runs/mycluster/20261122-0415-ab12",
             "checkpoint_prefix": "runs/mycluster/checkpoints",
             "dataset_prefix": "datasets/digits"},
      "state_dir": "/opt/tfcluster/state",    # local dir: status.json, data shard, checkpoints, model
      "max_runtime_s": 1800                   # the chief gives up after this many seconds
    }

Nothing in it is secret: S3 credentials come from the environment only (see :mod:`tfc_harness.s3io`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

ROLES = ("ps", "worker", "chief")

SETTINGS_KEYS = frozenset({
    "cluster", "run_id", "role", "index", "tf_config", "model_module", "steps", "batch_size",
    "learning_rate", "checkpoint_every", "s3", "state_dir", "max_runtime_s",
})
# Optional keys: start_timeout_s (how long the chief waits for every ps and worker; default max_runtime_s).
# stall_timeout_s: training making no step for this long ends the chief (its supervisor restarts it).
OPTIONAL_KEYS = frozenset({"start_timeout_s", "stall_timeout_s"})
S3_KEYS = frozenset({"endpoint", "region", "bucket", "run_prefix", "checkpoint_prefix", "dataset_prefix"})

_ADDRESS = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


class SettingsError(ValueError):
    """The settings dict is malformed; the message names the key and echoes the bad value."""


@dataclasses.dataclass(frozen=True)
class S3Location:
    """Where a run's data, checkpoints and results live.  Prefixes carry no leading/trailing slash."""

    endpoint: str | None
    region: str
    bucket: str
    run_prefix: str
    checkpoint_prefix: str
    dataset_prefix: str


@dataclasses.dataclass(frozen=True)
class Settings:
    """Validated settings; see the module docstring for the meaning of each field."""

    cluster: str
    run_id: str
    role: str
    index: int
    tf_config: dict
    model_module: str
    steps: int
    batch_size: int
    learning_rate: float
    checkpoint_every: int
    s3: S3Location
    state_dir: str
    max_runtime_s: int
    start_timeout_s: int = 0  # 0: max_runtime_s
    stall_timeout_s: int = 0  # 0: the chief's default

    @property
    def cluster_spec(self) -> dict[str, list[str]]:
        """``{"ps": [...], "worker": [...], "chief": [...]}`` from ``tf_config``."""
        return self.tf_config["cluster"]

    @property
    def num_workers(self) -> int:
        return len(self.cluster_spec["worker"])

    def peers(self) -> list[tuple[str, str]]:
        """``(task name, "host:port")`` for every ps and worker, e.g. ``("worker/1", "10.0.0.3:2222")``."""
        return [(f"{job}/{i}", addr) for job in ("ps", "worker")
                for i, addr in enumerate(self.cluster_spec[job])]

    def tf_config_json(self) -> str:
        """The value for the ``TF_CONFIG`` environment variable."""
        return json.dumps(self.tf_config, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fail(key: str, problem: str, value: Any) -> SettingsError:
    return SettingsError(f"settings[{key!r}] {problem} (got {value!r})")


def _int(d: dict, key: str, minimum: int, path: str = "") -> int:
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path + key, "must be an integer", value)
    if value < minimum:
        raise _fail(path + key, f"must be >= {minimum}", value)
    return value


def _str(d: dict, key: str, path: str = "", allow_empty: bool = False) -> str:
    value = d[key]
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise _fail(path + key, "must be a non-empty string", value)
    return value


def _check_keys(d: Any, expected: frozenset, where: str, optional: frozenset = frozenset()) -> None:
    if not isinstance(d, dict):
        raise SettingsError(f"{where} must be a dict (got {type(d).__name__})")
    missing = sorted(expected - d.keys())
    unknown = sorted(set(d) - expected - optional)
    if missing or unknown:
        raise SettingsError(f"{where}: missing keys {missing}, unknown keys {unknown}; "
                            f"expected exactly {sorted(expected)}")


def _prefix(d: dict, key: str) -> str:
    value = _str(d, key, "s3.").strip("/")
    if not value:
        raise _fail("s3." + key, "must name a prefix, not the bucket root", d[key])
    return value


def _tf_config(value: Any, role: str, index: int) -> dict:
    if not isinstance(value, dict) or not isinstance(value.get("cluster"), dict) \
            or not isinstance(value.get("task"), dict):
        raise _fail("tf_config", "must be {'cluster': {...}, 'task': {'type': ..., 'index': ...}}", value)
    cluster = value["cluster"]
    unknown = sorted(set(cluster) - set(ROLES))
    if unknown:
        raise _fail("tf_config.cluster", f"has unknown jobs {unknown}; allowed {list(ROLES)}", cluster)
    for job in ROLES:
        addrs = cluster.get(job)
        if not isinstance(addrs, list) or not addrs:
            raise _fail(f"tf_config.cluster.{job}", "must be a non-empty list of 'host:port'", addrs)
        for addr in addrs:
            if not isinstance(addr, str) or not _ADDRESS.match(addr):
                raise _fail(f"tf_config.cluster.{job}", "entries must look like 'host:port'", addr)
    if len(cluster["chief"]) != 1:
        raise _fail("tf_config.cluster.chief", "must hold exactly one address", cluster["chief"])
    all_addrs = [a for job in ROLES for a in cluster[job]]
    duplicates = sorted({a for a in all_addrs if all_addrs.count(a) > 1})
    if duplicates:
        raise _fail("tf_config.cluster", f"uses an address twice {duplicates}", cluster)
    task = value["task"]
    if task.get("type") != role or task.get("index") != index:
        raise _fail("tf_config.task", f"must match role={role!r} index={index}", task)
    if index >= len(cluster[role]):
        raise _fail("index", f"is out of range for {len(cluster[role])} {role} task(s)", index)
    return {"cluster": {job: list(cluster[job]) for job in ROLES},
            "task": {"type": role, "index": index}}


def validate(raw: Any) -> Settings:
    """Check a settings dict and return it as :class:`Settings` (raises :class:`SettingsError`)."""
    _check_keys(raw, SETTINGS_KEYS, "settings", OPTIONAL_KEYS)
    role = raw["role"]
    if role not in ROLES:
        raise _fail("role", f"must be one of {list(ROLES)}", role)
    index = _int(raw, "index", 0)
    lr = raw["learning_rate"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise _fail("learning_rate", "must be a positive number", lr)
    s3 = raw["s3"]
    _check_keys(s3, S3_KEYS, "settings['s3']")
    endpoint = s3["endpoint"]
    if endpoint is not None and (not isinstance(endpoint, str)
                                 or not re.match(r"^https?://[^\s/]+", endpoint)):
        raise _fail("s3.endpoint", "must be an http(s) URL or null (AWS)", endpoint)
    location = S3Location(
        endpoint=endpoint or None,
        region=_str(s3, "region", "s3."),
        bucket=_str(s3, "bucket", "s3."),
        run_prefix=_prefix(s3, "run_prefix"),
        checkpoint_prefix=_prefix(s3, "checkpoint_prefix"),
        dataset_prefix=_prefix(s3, "dataset_prefix"),
    )
    return Settings(
        cluster=_str(raw, "cluster"),
        run_id=_str(raw, "run_id"),
        role=role,
        index=index,
        tf_config=_tf_config(raw["tf_config"], role, index),
        model_module=_str(raw, "model_module"),
        steps=_int(raw, "steps", 1),
        batch_size=_int(raw, "batch_size", 1),
        learning_rate=float(lr),
        checkpoint_every=_int(raw, "checkpoint_every", 1),
        s3=location,
        state_dir=_str(raw, "state_dir"),
        max_runtime_s=_int(raw, "max_runtime_s", 1),
        start_timeout_s=_int(raw, "start_timeout_s", 1) if "start_timeout_s" in raw else 0,
        stall_timeout_s=_int(raw, "stall_timeout_s", 10) if "stall_timeout_s" in raw else 0,
    )
