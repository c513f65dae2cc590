"""The per-node settings: a pydantic model, and the values derived from it.

The rendered entry script hands :func:`tfc_harness.main` one plain dict.  Unknown keys are an error (a
typo must not silently fall back to a default); every field is typed and described below, and
:func:`validate` turns pydantic's report into a :class:`SettingsError` whose message names each bad key
and echoes its value, e.g. ``settings['steps']: must be >= 1 (got 0)``.  An example::

    {
      "cluster": "mycluster", "run_id": "20261122-0415-ab12",
      "strategy": "parameter_server",         # optional, the default
      "role": "chief", "index": 0,
      "tf_config": {"cluster": {"ps": ["10.0.0.2:2222"], "worker": [...], "chief": [...]},
                    "task": {"type": "chief", "index": 0}},
      "model_module": "digits", "steps": 300, "batch_size": 64, "learning_rate": 0.005,
      "checkpoint_every": 100, "checkpoint_min_interval_s": 30,     # optional (default 0: every boundary)
      "s3": {"endpoint": null, "region": "us-east-1", "bucket": "tfcluster",
             "run_prefix": "runs/mycluster/20261122-0415-ab12",
             "checkpoint_prefix": "runs/mycluster/checkpoints", "dataset_prefix": "datasets/digits"},
      "state_dir": "/opt/tfcluster/state", "max_runtime_s": 1800,
      "start_timeout_s": 300, "stall_timeout_s": 90,  # optional
      "threads": {"intra_op": 1, "inter_op": 1}        # optional (local nodes: their share of the cores)
    }

The jobs ``tf_config.cluster`` must hold, and how many tasks each, come from the strategy's shape
(:data:`tfc_harness.strategies.SHAPES`).  Nothing in the settings is secret: S3 credentials come from the
environment only (see :mod:`tfc_harness.s3io`).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from . import formats, strategies

ROLES = strategies.JOB_ORDER
StrategyName = Literal[tuple(strategies.SHAPES)]  # type: ignore[valid-type]
FormatName = Literal[formats.NAMES]  # type: ignore[valid-type]

_ADDRESS = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")
_URL = re.compile(r"^https?://[^\s/]+")


class SettingsError(ValueError):
    """The settings dict is malformed; the message names each bad key and echoes its value."""


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _prefix(value: str) -> str:
    value = value.strip("/")
    if not value:
        raise ValueError("must name a prefix, not the bucket root")
    return value


def _endpoint(value: str | None) -> str | None:
    if value is not None and not _URL.match(value):
        raise ValueError("must be an http(s) URL or null (AWS)")
    return value or None


def _address(value: str) -> str:
    if not _ADDRESS.match(value):
        raise ValueError("entries must look like 'host:port'")
    return value


Text = Annotated[str, AfterValidator(_non_empty)]
Prefix = Annotated[str, AfterValidator(_prefix)]
Address = Annotated[str, AfterValidator(_address)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class S3Location(_Strict):
    """Where a run's data, checkpoints and results live.  Prefixes carry no leading/trailing slash."""

    endpoint: Annotated[str | None, AfterValidator(_endpoint)] = Field(
        description="URL of an S3-compatible store (http or https); null for AWS")
    region: Text = Field(description="S3 region, e.g. us-east-1")
    bucket: Text = Field(description="bucket holding datasets, checkpoints and published runs")
    run_prefix: Prefix = Field(description="this run's results: model/, manifest.json, metrics.json, _SUCCESS")
    checkpoint_prefix: Prefix = Field(description="checkpoints, shared by the runs that resume each other")
    dataset_prefix: Prefix = Field(description="train.npz and test.npz (when the data are the module's arrays)")
    whole_object_gets: bool = Field(False, description="download each object in one GET, not in ranged parts: "
                                                      "the local store reads a whole object to serve any range")


class DataFile(_Strict):
    """One object of a data set in object storage, as listed when the run started."""

    key: Text
    size: int = Field(ge=0)
    etag: str


class FileData(_Strict):
    """Training and test files in object storage (the cluster file's ``data:``), assigned to workers."""

    source: Literal["files"]
    format: FormatName
    bucket: Text = Field(description="the bucket the files are in (same endpoint as s3)")
    label: str | None = Field(None, description="a format with named columns (csv): the label column")
    columns: list[str] | None = Field(None, description="a format with named columns (csv): their names, in "
                                                        "the files' order")
    train: list[list[DataFile]] = Field(description="each training task's files, by training task index "
                                                    "(strategies.training_tasks)")
    test: list[DataFile] = Field(min_length=1, description="the test split's files")


class Threads(_Strict):
    """Sizes of the task's TensorFlow thread pools (:mod:`tfc_harness.threads`)."""

    intra_op: int = Field(ge=1, description="threads one op's kernel is split over")
    inter_op: int = Field(ge=1, description="ops run at once")


class Task(_Strict):
    type: str = Field(description="this task's job (its role)")
    index: int = Field(ge=0, description="this task's index within its job")


class TfConfig(_Strict):
    """The ``TF_CONFIG`` value: every job's addresses and this task."""

    cluster: dict[str, list[Address]] = Field(
        description="job -> list of 'host:port' (which jobs, and how many tasks each: the strategy's shape)")
    task: Task


class Settings(_Strict):
    """Validated settings of one node; see the module docstring for an example."""

    cluster: Text = Field(description="cluster name")
    run_id: Text = Field(description="id of this training run")
    strategy: StrategyName = Field(strategies.DEFAULT_STRATEGY, description="distribution strategy")
    role: Literal[ROLES] = Field(description="this node's job: " + " | ".join(ROLES))  # type: ignore[valid-type]
    index: int = Field(ge=0, description="task index within the role")
    tf_config: TfConfig = Field(description="cluster spec and this task (becomes TF_CONFIG)")
    model_module: Text = Field(description="name in <harness_dir>/models/ or absolute path to a .py file")
    steps: int = Field(ge=1, description="training steps in total")
    batch_size: int = Field(ge=1, description="examples per step")
    learning_rate: float = Field(gt=0, description="the optimizer's learning rate")
    checkpoint_every: int = Field(ge=1, description="steps between checkpoints")
    checkpoint_min_interval_s: float = Field(
        0, ge=0, description="a checkpoint_every boundary is saved only once this long has passed since the "
                             "last checkpoint (0: every boundary; training.checkpoint_min_interval_seconds)")
    s3: S3Location = Field(description="where datasets, checkpoints and published runs live")
    data: FileData | None = Field(None, description="files in object storage; null: the arrays under "
                                                     "s3.dataset_prefix (the module's make_dataset())")
    hparams: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="passed to build_model(hparams) (training.hparams)")
    state_dir: Text = Field(description="local dir: status.json, data shard, checkpoints, model")
    max_runtime_s: int = Field(ge=1, description="the chief gives up (exit 3) after this many seconds")
    start_timeout_s: int | None = Field(
        None, ge=1, description="how long the chief waits for every peer (default: max_runtime_s)")
    stall_timeout_s: int | None = Field(
        None, ge=10, description="no training step for this long ends the chief (exit 4; default 90)")
    threads: Threads | None = Field(
        None, description="TensorFlow's thread pools; null: its defaults (one thread per core it sees)")

    @model_validator(mode="after")
    def _cluster_fits(self) -> Settings:
        for problem in _cluster_problems(self):
            raise ValueError(problem)
        return self

    @property
    def cluster_spec(self) -> dict[str, list[str]]:
        """``{"ps": [...], "worker": [...], "chief": [...]}`` from ``tf_config``."""
        return self.tf_config.cluster

    @property
    def num_workers(self) -> int:
        return len(self.cluster_spec.get("worker", ()))

    @property
    def training_tasks(self) -> list[tuple[str, int]]:
        """``(job, index)`` of every task training on its own share of the data (the strategy says which)."""
        return strategies.training_tasks(self.strategy, {job: len(a) for job, a in self.cluster_spec.items()})

    @property
    def num_training_tasks(self) -> int:
        return len(self.training_tasks)

    @property
    def training_index(self) -> int:
        """This task's share of the training data (ValueError when it trains on none)."""
        return self.training_tasks.index((self.role, self.index))

    def peers(self) -> list[tuple[str, str]]:
        """``(task name, "host:port")`` of every other task, e.g. ``("worker/1", "10.0.0.3:2222")``."""
        return [(f"{job}/{i}", addr) for job in ROLES for i, addr in enumerate(self.cluster_spec.get(job, ()))
                if (job, i) != (self.role, self.index)]

    def tf_config_json(self) -> str:
        """The value for the ``TF_CONFIG`` environment variable."""
        return json.dumps(self.tf_config.model_dump(), sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def _cluster_problems(s: Settings) -> list[str]:
    """Cross-field rules: the cluster fits the strategy's shape, the task is this node, no address twice."""
    cluster = s.tf_config.cluster
    counts = {job: len(addrs) for job, addrs in cluster.items()}
    shape = strategies.shape_problems(s.strategy, counts)
    if shape:
        return [f"tf_config.cluster does not fit strategy {s.strategy}: {'; '.join(shape)} (got {cluster!r})"]
    addrs = [a for job in cluster for a in cluster[job]]
    twice = sorted({a for a in addrs if addrs.count(a) > 1})
    if twice:
        return [f"tf_config.cluster uses an address twice {twice} (got {cluster!r})"]
    task = s.tf_config.task
    if (task.type, task.index) != (s.role, s.index):
        return [f"tf_config.task must match role={s.role!r} index={s.index} (got {task.model_dump()!r})"]
    if s.role not in cluster or s.index >= len(cluster[s.role]):
        return [f"index is out of range for {len(cluster.get(s.role, ()))} {s.role} task(s) (got {s.index})"]
    if s.data is not None and (len(s.data.train) != s.num_training_tasks or not all(s.data.train)):
        jobs = "+".join(strategies.TRAINING_JOBS[s.strategy])
        return [f"data.train must give each of the {s.num_training_tasks} training tasks ({jobs}) at least one "
                f"file (got {[len(files) for files in s.data.train]} files per task)"]
    return []


def _key(loc: tuple) -> str:
    return ".".join(str(part) for part in loc if not isinstance(part, int))


def _describe(error: dict) -> str:
    """One pydantic error as ``settings['key']: problem (got value)``."""
    key, kind, value = _key(error["loc"]), error["type"], error.get("input")
    if kind == "missing":
        return f"settings[{key!r}] is missing"
    if kind == "extra_forbidden":
        return f"settings[{key!r}] is not a known key (got {value!r})"
    msg = error["msg"].removeprefix("Value error, ")
    if kind == "literal_error":
        msg = f"must be one of {error['ctx']['expected']}"
    elif kind in ("greater_than_equal", "greater_than"):
        msg = f"must be {'>=' if kind == 'greater_than_equal' else '>'} {next(iter(error['ctx'].values()))}"
    elif kind in ("int_type", "float_type", "string_type", "dict_type", "list_type", "model_type"):
        msg = "must be " + {"int_type": "an integer", "float_type": "a number", "string_type": "a string",
                            "dict_type": "a mapping", "list_type": "a list",
                            "model_type": "a mapping"}[kind]
    if not key:
        return f"settings: {msg}"
    return f"settings[{key!r}] {msg} (got {value!r})"


def validate(raw: Any) -> Settings:
    """Check a settings dict and return it as :class:`Settings` (raises :class:`SettingsError`)."""
    if not isinstance(raw, dict):
        raise SettingsError(f"settings must be a dict (got {type(raw).__name__})")
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise SettingsError("; ".join(_describe(e) for e in exc.errors())) from None
