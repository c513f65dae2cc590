"""Cluster configuration: one typed schema, defaults, overrides and validation.

A run is described by a YAML cluster file (every field optional: the defaults give a local run),
overridden by ``--set dotted.key=value`` pairs and a few named options (``--provider``, ``--ps`` ...).
The schema is a set of pydantic models (:class:`RunSpec` and its sections): each field has a type, a
default and a description, and the same models give the JSON Schema editors use (``tfcluster schema``)
and the reference table (``tfcluster config-reference``). Everything is validated before anything is
created; the first bad value raises :class:`~tfcluster.errors.ConfigError` naming the field, the value
and what is allowed. Provider-specific ``provider_options`` are checked by each provider's own model
(:mod:`tfcluster.providers`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError
from tfc_harness import formats, strategies

from .errors import ConfigError

ROLES = strategies.JOB_ORDER  # the TensorFlow jobs, as the harness names them
#: the providers (tfcluster.providers registers a class for each: tests/unit/test_config.py keeps the two equal;
#: the providers import this module, so it cannot ask them)
PROVIDERS = ("local", "aws", "gcp", "openstack", "im")
STRATEGIES = strategies.names()
FORMATS = formats.names()  # data.format
#: ssh.timeout_seconds unless set, off the local provider: a cloud VM (a GPU one above all) can take minutes
#: to run sshd, and IM reports VMs before their SSH is up
CLOUD_SSH_TIMEOUT_S = 600

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,18}[a-z0-9]$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z0-9]+)+-\d$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def refuse(allowed: str, **ctx: Any):
    """Raise the validation error every check of this schema raises: the text of what is allowed
    (``sub``: a key below the field, ``value``: the bad value when it is not the field's whole input)."""
    raise PydanticCustomError("tfc_allowed", "{allowed}", {"allowed": allowed, **ctx})


# -- value checks: each returns the normalised value or refuses it with what is allowed ------------------
# (the providers' option models use them too: one style of validation everywhere)
def int_check(lo: int, hi: int | None = None):
    allowed = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"

    def check(value):
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            refuse(allowed)
        return value

    return check


def Int(lo: int, hi: int | None = None):  # noqa: N802  a type, named like one
    """An integer field from lo to hi (the JSON Schema says so too)."""
    return Annotated[int, Field(ge=lo, le=hi), BeforeValidator(int_check(lo, hi))]


def Checked(check, base: type = str):  # noqa: N802  a type, named like one
    """A field whose value ``check`` normalises or refuses (with :func:`refuse`)."""
    return Annotated[base, BeforeValidator(check)]


def number_check(lo_exclusive: float, hi: float):
    allowed = f"a number > {lo_exclusive} and <= {hi}"

    def check(value):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                refuse(allowed)
        if isinstance(value, bool) or not isinstance(value, int | float) or not lo_exclusive < value <= hi:
            refuse(allowed)
        return float(value)

    return check


def choice_check(*choices: str):
    def check(value):
        if value not in choices:
            refuse("one of " + ", ".join(choices))
        return value

    return check


def matching_check(pattern: re.Pattern, allowed: str, optional: bool = False):
    def check(value):
        if optional and value in (None, ""):
            return ""
        if not isinstance(value, str) or not pattern.fullmatch(value):
            refuse(allowed)
        return value

    return check


def true_false_check(value):
    """The text "true" or "false" (how the provider modules take a switch; kept as text)."""
    if value not in ("true", "false"):
        refuse('"true" or "false"')
    return value


def whole_number_check(lo: int, hi: int, allowed: str):
    """Digits only (no sign, no spaces: what the provider modules accept) from lo to hi; kept as text."""

    def check(value):
        if not isinstance(value, str) or not value.isascii() or not value.isdigit() or not lo <= int(value) <= hi:
            refuse(allowed)
        return value

    return check


def ipv4_network_check(allowed: str, prefixlen: tuple[int, int] = (0, 32), canonical: bool = False):
    """An IPv4 CIDR block (with host bits set unless canonical) whose prefix length is in the range; kept as text."""

    def check(value):
        try:
            net = ipaddress.ip_network(str(value), strict=canonical)
        except ValueError:
            refuse(allowed)
        if net.version != 4 or not prefixlen[0] <= net.prefixlen <= prefixlen[1]:
            refuse(allowed)
        return value

    return check


def single_line_check(value):
    if value is None:
        return ""
    if not isinstance(value, str) or any(c in value for c in "\n\r\0"):
        refuse("a single-line string")
    return value


def _cluster_name(value):
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or "--" in value:
        refuse("2-20 characters: lowercase letters, digits and '-', starting with a letter and not ending "
               "with '-' (it becomes host, bridge and resource names)")
    return value


def _bucket(value):
    if (not isinstance(value, str) or not _BUCKET_RE.fullmatch(value) or ".." in value
            or ".-" in value or "-." in value or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value)
            or value.startswith("xn--") or value.endswith("-s3alias")):
        refuse("an S3 bucket name: 3-63 characters, lowercase letters, digits, '.' and '-', starting and "
               "ending with a letter or digit, no '..', not an IP address")
    return value


def _prefix(value):
    if not isinstance(value, str) or not _PREFIX_RE.fullmatch(value) or ".." in value or "//" in value:
        refuse("an S3 key prefix: letters, digits, '.', '_', '-', '/' (no leading '/', no '..')")
    return value.rstrip("/")


def _endpoint(value):
    if value in (None, "", "auto"):
        return "auto"
    if not isinstance(value, str) or not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?/?", value):
        refuse("'auto' (local store or the cloud's own), or an http(s)://host[:port] URL")
    return value.rstrip("/")


def _check_files(info: ValidationInfo) -> bool:
    """Off while re-reading a saved spec: `down` must work even if the user's model file is gone."""
    return (info.context or {}).get("check_files", True)


def _model(value, info: ValidationInfo):
    from .paths import TRAIN_DIR

    bundled = sorted(p.stem for p in (TRAIN_DIR / "models").glob("*.py") if not p.stem.startswith("_"))
    allowed = f"a bundled model ({', '.join(bundled)}) or the path of a .py model file"
    if not isinstance(value, str) or not value:
        refuse(allowed)
    if not value.endswith(".py"):
        if value not in bundled:
            refuse(allowed)
        return value
    path = Path(value).expanduser()
    if not path.is_file() and _check_files(info):
        refuse(allowed + " (no such file)")
    if not _MODULE_RE.fullmatch(path.stem):
        refuse(allowed + " (the file name must be a Python identifier)")
    return str(path.resolve())


def _credentials_file(value, info: ValidationInfo):
    allowed = ("'' (the local store's own keys, or the cloud's instance role), or the path of an existing "
               "0600 file with AWS_ACCESS_KEY_ID= and AWS_SECRET_ACCESS_KEY= lines")
    if value in (None, ""):
        return ""
    if not isinstance(value, str):
        refuse(allowed)
    path = Path(value).expanduser()
    if _check_files(info):
        if not path.is_file():
            refuse(allowed + " (no such file)")
        if path.stat().st_mode & 0o077:
            refuse(allowed + f" (mode is {oct(path.stat().st_mode & 0o777)}: chmod 600 it)")
    return str(path.resolve())


def _subnet(value):
    allowed = "'auto' or a private IPv4 /24 to /28 network such as 10.231.7.0/24"
    if value in (None, "", "auto"):
        return "auto"
    try:
        net = ipaddress.ip_network(str(value), strict=True)
    except ValueError:
        refuse(allowed)
    if net.version != 4 or not net.is_private or not 24 <= net.prefixlen <= 28:
        refuse(allowed)
    return str(net)


def cidr_list_check(value):
    allowed = "a list of IPv4/IPv6 CIDR blocks, e.g. ['203.0.113.0/24']"
    if value is None:
        return []
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        refuse(allowed)
    out = []
    for item in value:
        try:
            net = ipaddress.ip_network(str(item), strict=False)
        except ValueError:
            refuse(allowed, value=item)
        host = ipaddress.ip_interface(str(item)).ip
        if net.network_address != host:  # 203.0.113.7/0 would silently mean 0.0.0.0/0, everyone
            refuse(f"{allowed}, written as its network address: {net} (host bits set), or "
                   f"{host}/{net.max_prefixlen} for that one host", value=item)
        out.append(str(net))
    return out


def _options(value):
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        refuse("a mapping of option names to strings, numbers or booleans (see the provider's README)")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,40}", key):
            refuse("option names of lowercase letters, digits and '_'", sub=str(key), value=item)
        if isinstance(item, bool):
            item = "true" if item else "false"
        if not isinstance(item, str | int | float) or "\n" in str(item):
            refuse("a single-line string, number or boolean", sub=key, value=item)
        out[key] = str(item)
    return out


def _s3_url(value):
    from tfc_harness.sources import parse_url  # the one rule, the harness's (which lists the files)

    allowed = ("'' (none), or s3://bucket/key-glob (e.g. s3://my-bucket/data/train-*.tfrecord) or "
               "s3://bucket/prefix/ (every object under it)")
    if value in (None, ""):
        return ""
    if not isinstance(value, str):
        refuse(allowed)
    try:
        parse_url(value)
    except ValueError as exc:   # "data URL '<value>': <problem>; expected <what is allowed>"
        problem, _, expected = str(exc).split("': ", 1)[-1].partition("; expected ")
        refuse(f"{expected or allowed} (this one: {problem})")
    return value


def _hparams(value):
    allowed = "a mapping of names to numbers, strings or booleans (passed to build_model(hparams))"
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        refuse(allowed)
    for key, item in value.items():
        if not isinstance(key, str) or not _MODULE_RE.fullmatch(key):
            refuse("hparam names that are Python identifiers", sub=str(key), value=item)
        if not isinstance(item, str | int | float | bool):
            refuse(allowed, sub=key, value=item)
    return dict(value)


def _tensorflow_version(value):
    from .tfsupport import locked_releases, pythons_for, table

    allowed = "a TensorFlow release X.Y.Z, e.g. 2.21.0"
    value = matching_check(_VERSION_RE, allowed)(value)
    if pythons_for(value) is None:
        refuse(f"a release tfcluster knows: {', '.join(k + '.x' for k in table())} "
               "(roles/tensorflow/vars/main.yml; add a row only after checking PyPI's wheels)")
    if value not in locked_releases():
        refuse(f"a release whose node packages are locked with hashes: {', '.join(locked_releases())} "
               f"(roles/tensorflow/files/locks/; `make lock` adds one: scripts/lock.py --release {value})")
    return value


SingleLine = Annotated[str, BeforeValidator(single_line_check)]


# -- the schema -----------------------------------------------------------------------------------------
class Section(BaseModel):
    """A part of the configuration: unknown keys are refused, values are read-only once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class NodeGroup(Section):
    instance_type: SingleLine = Field("", description="cloud instance type (ignored by local)")
    image: SingleLine = Field("", description="image of the role's nodes: on a cloud an image id or name ('' = the "
                                              "provider's default, Debian 12, or on aws the newest baked AMI of the "
                                              "configuration); on local '' = the newest baked node image of the "
                                              "configuration (baked first by up when there is none), 'base' = the "
                                              "bare base image, or a built image's name ('tfcluster image --list')")
    gpus: Int(0, 16) = Field(0, description="GPUs per node of this role")


class PsNodes(NodeGroup):
    count: Int(0, 32) = Field(1, description="number of parameter servers")


class WorkerNodes(NodeGroup):
    count: Int(0, 64) = Field(2, description="number of workers")


class ChiefNodes(NodeGroup):
    count: Int(0, 1) = Field(1, description="number of chiefs (the coordinator)")


class Nodes(Section):
    ps: PsNodes = Field(default_factory=PsNodes, description="parameter servers")
    worker: WorkerNodes = Field(default_factory=WorkerNodes, description="workers")
    chief: ChiefNodes = Field(default_factory=ChiefNodes, description="the chief")

    def __getitem__(self, role: str) -> NodeGroup:
        return getattr(self, role)


class TensorFlowSettings(Section):
    version: Annotated[str, BeforeValidator(_tensorflow_version)] = \
        Field("2.21.0", description="pinned TensorFlow release installed on every node")


class Storage(Section):
    bucket: Annotated[str, BeforeValidator(_bucket)] = Field(
        "tfcluster", description="S3 bucket for datasets, checkpoints and models (the default `tfcluster` "
                                 "serves the local store only: set a bucket you own on clouds)")
    prefix: Annotated[str, BeforeValidator(_prefix)] = Field(
        "runs", description="key prefix for runs: <prefix>/<cluster>/<run-id>/")
    endpoint: Annotated[str, BeforeValidator(_endpoint)] = Field(
        "auto", description="S3 endpoint URL; 'auto' = local store on local, AWS otherwise")
    credentials_file: Annotated[str, BeforeValidator(_credentials_file)] = Field(
        "", description="0600 file with the S3 keys of a site's store (nodes get them in a 0600 env file)")
    region: Annotated[str, BeforeValidator(matching_check(_REGION_RE, "a region name such as us-east-1"))] = Field(
        "us-east-1", description="S3 region")


class Training(Section):
    model: Annotated[str, BeforeValidator(_model)] = Field(
        "digits", description="model: a bundled one (train/models/<name>.py) or a .py file path")
    steps: Int(1, 10_000_000) = Field(600, description="training steps")
    batch_size: Int(1, 65536) = Field(64, description="batch size per worker step")
    learning_rate: Annotated[float, Field(gt=0.0, le=10.0), BeforeValidator(number_check(0.0, 10.0))] = Field(
        0.002, description="optimizer learning rate")
    max_restarts: Int(0, 100) = Field(3, description="restarts of a crashed task (with back-off) before the "
                                                     "run fails; none for a failure a restart would repeat, nor "
                                                     "after the same error at the same step twice in a row")
    stall_timeout_seconds: Int(10, 86400) = Field(
        90, description="no training step for this long restarts the chief from its checkpoint")
    start_timeout_seconds: Int(5, 86400) = Field(
        300, description="how long the chief waits for every ps and worker before failing")
    checkpoint_every: Int(1, 10_000_000) = Field(
        100, description="checkpoint (copied to S3) every N steps and at the end")
    checkpoint_min_interval_seconds: Int(0, 86400) = Field(
        30, description="at most one checkpoint per this many seconds: the first checkpoint_every boundary "
                        "after it has passed saves (0: every boundary); the last step and a preemption "
                        "notice always save")
    hparams: Annotated[dict[str, str | int | float | bool], BeforeValidator(_hparams)] = Field(
        default_factory=dict, description="passed to the model module's build_model(hparams)")


class Data(Section):
    train: Annotated[str, BeforeValidator(_s3_url)] = Field(
        "", description="training files in object storage: s3://bucket/glob or s3://bucket/prefix/ ('' = the "
                        "model module's make_dataset())")
    test: Annotated[str, BeforeValidator(_s3_url)] = Field(
        "", description="test files, as data.train (required with it)")
    format: Annotated[Literal[FORMATS], BeforeValidator(choice_check(*FORMATS))] = Field(  # type: ignore[valid-type]
        "tfrecord", description=formats.describe())
    label: Annotated[str, BeforeValidator(matching_check(re.compile(r"^[^,\s\"]{1,100}$"),
                                                         "a CSV column name"))] = Field(
        "label", description="a format with named columns (csv): the label column; every other column is a "
                             "number, one of the features")


#: the shortest allowed_ssh_cidrs prefix per IP version unless network.allow_wide_ssh_cidrs is set
WIDE_SSH_PREFIX = {4: 8, 6: 16}


class Network(Section):
    tf_port: Int(1024, 65535) = Field(2222, description="gRPC port of the TensorFlow servers")
    subnet: Annotated[str, BeforeValidator(_subnet)] = Field(
        "auto", description="local provider: the cluster bridge's network")
    allowed_ssh_cidrs: Annotated[list[str], BeforeValidator(cidr_list_check)] = Field(
        default_factory=list, description="clouds: who may reach SSH (no open default)")
    allow_wide_ssh_cidrs: bool = Field(
        False, description=f"clouds: also allow allowed_ssh_cidrs shorter than /{WIDE_SSH_PREFIX[4]} (IPv4) or "
                           f"/{WIDE_SSH_PREFIX[6]} (IPv6), such as 0.0.0.0/0 (everyone)")

    @model_validator(mode="after")
    def _not_too_wide(self) -> Network:
        for cidr in self.allowed_ssh_cidrs if not self.allow_wide_ssh_cidrs else []:
            net = ipaddress.ip_network(cidr)
            if net.prefixlen < WIDE_SSH_PREFIX[net.version]:
                raise ConfigError("network.allowed_ssh_cidrs", cidr,
                                  f"networks of /{WIDE_SSH_PREFIX[4]} or longer (IPv6: /{WIDE_SSH_PREFIX[6]}): a "
                                  "shorter prefix opens SSH to a large part of the internet; if that is meant, "
                                  "also set network.allow_wide_ssh_cidrs: true")
        return self


class Ssh(Section):
    user: Annotated[str, BeforeValidator(matching_check(_USER_RE, "a Unix user name", optional=True))] = Field(
        "", description="SSH user on the nodes ('' = the provider's default)")
    timeout_seconds: Int(5, 3600) = Field(
        60, description=f"how long to wait for every node's SSH (unless set: 60 on local, {CLOUD_SSH_TIMEOUT_S} "
                        "on clouds and im, whose VMs boot slower)")


def _provider_class(name: str):
    """The provider class registered as ``name`` (the providers import this module: asked when a spec is
    checked, not when this module loads)."""
    from .providers import REGISTRY

    return REGISTRY[name]


class RunSpec(Section):
    """A validated configuration (a cluster file, overrides and defaults)."""

    cluster: Annotated[str, BeforeValidator(_cluster_name)] = Field(
        "tfc", description="cluster name: host, bridge and resource names derive from it")
    provider: Annotated[Literal[PROVIDERS], BeforeValidator(choice_check(*PROVIDERS))] = Field(  # type: ignore[valid-type]
        "local", description="where the nodes come from")
    strategy: Annotated[str, BeforeValidator(choice_check(*STRATEGIES))] = Field(
        "parameter_server", description="distribution strategy")
    provider_options: Annotated[dict[str, str], BeforeValidator(_options)] = Field(
        default_factory=dict, description="provider-specific settings (region, network, IM URL, ...), checked "
                                          "by the provider")
    nodes: Nodes = Field(default_factory=Nodes, description="nodes per role")
    tensorflow: TensorFlowSettings = Field(default_factory=TensorFlowSettings, description="TensorFlow")
    storage: Storage = Field(default_factory=Storage, description="object storage")
    training: Training = Field(default_factory=Training, description="the training run")
    data: Data = Field(default_factory=Data, description="the training job's data in object storage")
    max_runtime_minutes: Int(1, 7 * 24 * 60) = Field(
        60, description="hard limit for a run; nodes stop by themselves")
    network: Network = Field(default_factory=Network, description="addresses and ports")
    ssh: Ssh = Field(default_factory=Ssh, description="SSH to the nodes")

    @model_validator(mode="after")
    def _provider_defaults(self) -> RunSpec:
        """Defaults that differ off the local provider, and what has no safe default there (values set win)."""
        if not self.uses_cloud_nodes:
            return self
        if "bucket" not in self.storage.model_fields_set:
            raise ConfigError("storage.bucket", f"{self.storage.bucket} (the default)",
                              f"a bucket you own, set explicitly on provider {self.provider} (S3 bucket names are "
                              "global: the default 'tfcluster' serves the local store and is someone else's on "
                              "AWS), e.g. --set storage.bucket=my-team-tfcluster")
        if "timeout_seconds" not in self.ssh.model_fields_set:
            ssh = self.ssh.model_copy(update={"timeout_seconds": CLOUD_SSH_TIMEOUT_S})
            object.__setattr__(self, "ssh", ssh)
        return self

    @model_validator(mode="after")
    def _data_pair(self) -> RunSpec:
        if bool(self.data.train) != bool(self.data.test):
            missing = "data.test" if self.data.train else "data.train"
            raise ConfigError(missing, "", "set together with "
                              f"{'data.train' if missing == 'data.test' else 'data.test'}: training files "
                              "need test files to evaluate the model on (s3://bucket/glob or s3://bucket/prefix/)")
        return self

    @model_validator(mode="after")
    def _cluster_shape(self) -> RunSpec:
        shape = strategies.shape_for(self.strategy)   # the harness states each strategy's shape once
        self._default_absent_jobs(shape)
        for role in ROLES:
            low, high = shape.get(role, (0, 0))
            if not low <= self.count(role) <= (high if high is not None else self.count(role)):
                absent = f" (it has no {role} nodes: leave nodes.{role}.count out, or set it to 0" \
                    + (": PS=0 for make)" if role == "ps" else ")") if high == 0 else ""
                raise ConfigError(f"nodes.{role}.count", self.count(role),
                                  f"{strategies.describe_count(low, high)} with strategy {self.strategy}{absent}")
        _provider_class(self.provider).check_nodes(self)
        return self

    def _default_absent_jobs(self, shape: dict) -> None:
        """A job the strategy lacks (multi_worker_mirrored: ps) has no nodes unless a count was set (then
        the shape check names the field)."""
        updates = {role: self.nodes[role].model_copy(update={"count": 0}) for role in ROLES
                   if role not in shape and "count" not in self.nodes[role].model_fields_set}
        if updates:
            object.__setattr__(self, "nodes", self.nodes.model_copy(update=updates))

    @property
    def uses_cloud_nodes(self) -> bool:
        """Nodes and storage off this machine: every provider but local, and im unless it adopts local nodes
        (each provider says, :meth:`tfcluster.providers.base.Provider.uses_cloud_nodes`)."""
        return _provider_class(self.provider).uses_cloud_nodes(self)

    def count(self, role: str) -> int:
        return self.nodes[role].count

    @property
    def node_total(self) -> int:
        return sum(self.count(r) for r in ROLES)

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")


# -- the dotted field paths -----------------------------------------------------------------------------
def fields_of(model: type[BaseModel], prefix: str = "") -> dict:
    """Every leaf field of a model by its dotted path."""
    out = {}
    for name, info in model.model_fields.items():
        sub = info.annotation if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel) \
            else None
        out.update(fields_of(sub, f"{prefix}{name}.") if sub is not None else {f"{prefix}{name}": info})
    return out


#: every leaf of the schema by its dotted path (what --set accepts)
FIELDS = fields_of(RunSpec)

# Named CLI options / Make variables and the field each one sets.
OVERRIDE_FLAGS = {
    "cluster": "cluster",
    "provider": "provider",
    "ps": "nodes.ps.count",
    "workers": "nodes.worker.count",
    "steps": "training.steps",
}


def _children(fields, path: str) -> str:
    start = path + "." if path else ""
    return ", ".join(sorted({f[len(start):].split(".")[0] for f in fields if f.startswith(start)}))


def config_error(exc: ValidationError, model: type[BaseModel] = RunSpec, prefix: str = "") -> ConfigError:
    """The first problem of a pydantic validation of ``model`` (whose fields are under ``prefix`` in the
    configuration), as the one error a user sees."""
    fields = fields_of(model)
    err = exc.errors(include_url=False)[0]
    path = ".".join(str(p) for p in err["loc"])
    field = prefix + path
    ctx = err.get("ctx") or {}
    value = ctx.get("value", err.get("input"))
    if err["type"] == "tfc_allowed":
        if "sub" in ctx:
            field = f"{field}.{ctx['sub']}"
        return ConfigError(field, value, ctx["allowed"])
    if err["type"] == "extra_forbidden":
        return ConfigError(field, value, "known keys " + _children(fields, path.rsplit(".", 1)[0] if "." in path
                                                                      else ""))
    if err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return ConfigError(field, value, "a mapping with keys " + _children(fields, path))
    return ConfigError(field, value, err["msg"])


# -- reading and merging ----------------------------------------------------------------------------------
def parse_set(item: str) -> tuple[str, Any]:
    """Parse one ``key=value`` override; the value is read as YAML (so 3 is an int, [a] a list)."""
    if "=" not in item:
        raise ConfigError("--set", item, "KEY=VALUE with KEY a dotted field such as training.steps")
    key, raw = item.split("=", 1)
    key = key.strip()
    if key.startswith("provider_options.") and len(key) > len("provider_options."):
        return key, raw.strip()  # one option of the provider-specific mapping, kept as text
    if key not in FIELDS and not _one_hparam(key):
        raise ConfigError(key, raw, "a known field: " + ", ".join(sorted(FIELDS)))
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _one_hparam(key: str) -> bool:
    """``training.hparams.<name>``: one value of the model's hparams (the others kept)."""
    return key.startswith("training.hparams.") and "." not in key.removeprefix("training.hparams.") and \
        len(key) > len("training.hparams.")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``line 4, column 9: expected ',' or '}', but got ':' (in a flow mapping from line 3, column 11)``."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:
        return " ".join(str(exc).split())
    text = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, where = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and where is not None:
        text += f" ({context.removeprefix('while parsing ')} from line {where.line + 1}, column {where.column + 1})"
    return text


def load_file(path: str | Path | None) -> dict:
    """Read a cluster file (a nested mapping; empty when path is None or empty)."""
    if not path:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ConfigError("config file", str(path), "an existing YAML file")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except UnicodeDecodeError:
        raise ConfigError("config file", str(path), "a UTF-8 text file") from None
    except yaml.YAMLError as exc:
        raise ConfigError("config file", str(path), f"valid YAML ({_yaml_problem(exc)})") from None
    if not isinstance(data, Mapping):
        raise ConfigError("config file", str(path), "a YAML mapping at the top level")
    return _model_beside_file(dict(data), p)


def _model_beside_file(data: dict, path: Path) -> dict:
    """A relative ``training.model`` path in a cluster file names a file beside it (as `make` runs from
    anywhere); on the command line it is relative to the current directory."""
    training = data.get("training")
    model = training.get("model") if isinstance(training, Mapping) else None
    if isinstance(model, str) and model.endswith(".py") and not Path(model).expanduser().is_absolute():
        data["training"] = dict(training, model=str(path.resolve().parent / model))
    return data


def _merge(tree: dict, path: list[str], value) -> None:
    for i, part in enumerate(path[:-1]):
        child = tree.get(part)
        if not isinstance(child, Mapping):
            if child is not None:   # a file's `nodes: 3` under an override of nodes.worker.count
                raise ConfigError(".".join(path[:i + 1]), child, "a mapping with keys " +
                                  _children(FIELDS, ".".join(path[:i + 1])))
            child = {}
        tree[part] = child = dict(child)
        tree = child
    tree[path[-1]] = value


def resolve(file_values: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None,
            check_files: bool = True) -> RunSpec:
    """Merge defaults < file (a nested mapping) < overrides (dotted keys), validate every field and the
    rules across fields. ``check_files=False`` skips checks that a file exists (a saved spec re-read by
    ``down``)."""
    tree = dict(file_values or {})
    for key, value in (overrides or {}).items():
        if key not in FIELDS and key != "provider_options":
            raise ConfigError(key, value, "a known field: " + ", ".join(sorted(FIELDS)))
        _merge(tree, key.split("."), value)
    try:
        return RunSpec.model_validate(tree, context={"check_files": check_files})
    except ValidationError as exc:
        raise config_error(exc) from None


def reference() -> str:
    """A Markdown table of every field, its default and meaning (used for the README)."""
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for path, info in FIELDS.items():
        default = info.default_factory() if info.default_factory else info.default
        lines.append(f"| `{path}` | `{default!r}` | {info.description} |")
    return "\n".join(lines)


def json_schema() -> dict:
    """The JSON Schema of the cluster file (for editors' YAML support)."""
    schema = RunSpec.model_json_schema(mode="validation")
    # a YAML file may give an option as a number or a boolean: the configuration takes it as text
    schema["properties"]["provider_options"]["additionalProperties"] = {"type": ["string", "number", "boolean"]}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tfcluster cluster file"
    return schema
