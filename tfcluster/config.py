"""Cluster configuration: schema, defaults, overrides and validation.

A run is described by a YAML cluster file (every field optional: the defaults give a local run),
overridden by ``--set dotted.key=value`` pairs and a few named options (``--provider``, ``--ps`` ...).
Everything is validated before anything is created; the first bad value raises
:class:`~tfcluster.errors.ConfigError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

ROLES = ("ps", "worker", "chief")
PROVIDERS = ("local", "aws", "gcp", "openstack", "im")
STRATEGIES = ("parameter_server",)
#: ssh.timeout_seconds unless set, off the local provider: a cloud VM (a GPU one above all) can take minutes
#: to run sshd, and IM reports VMs before their SSH is up
CLOUD_SSH_TIMEOUT_S = 600

#: off while re-reading a saved spec: `down` must work even if the user's model file is gone
_CHECK_FILES: ContextVar[bool] = ContextVar("check_files", default=True)
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,18}[a-z0-9]$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Field:
    """One leaf of the schema: its default, a converter/validator and the text of what is allowed."""

    default: Any
    check: Callable[[str, Any], Any]
    doc: str


def _int(lo: int, hi: int | None = None):
    allowed = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"

    def check(field, value):
        if isinstance(value, bool):
            raise ConfigError(field, value, allowed)
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            value = int(value)
        if not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise ConfigError(field, value, allowed)
        return value

    check.allowed = allowed
    return check


def _float(lo_exclusive: float, hi: float):
    allowed = f"a number > {lo_exclusive} and <= {hi}"

    def check(field, value):
        if isinstance(value, bool):
            raise ConfigError(field, value, allowed)
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(field, value, allowed) from None
        if not isinstance(value, int | float) or not (lo_exclusive < value <= hi):
            raise ConfigError(field, value, allowed)
        return float(value)

    return check


def _choice(*choices):
    allowed = "one of " + ", ".join(choices)

    def check(field, value):
        if value not in choices:
            raise ConfigError(field, value, allowed)
        return value

    return check


def _regex(pattern: re.Pattern, allowed: str, optional: bool = False):
    def check(field, value):
        if optional and value in (None, ""):
            return ""
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ConfigError(field, value, allowed)
        return value

    return check


def _str(optional: bool = True):
    def check(field, value):
        if value is None and optional:
            return ""
        if not isinstance(value, str) or any(c in value for c in "\n\r\0"):
            raise ConfigError(field, value, "a single-line string")
        return value

    return check


def _cluster_name(field, value):
    allowed = ("2-20 characters: lowercase letters, digits and '-', starting with a letter and not "
               "ending with '-' (it becomes host, bridge and resource names)")
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or "--" in value:
        raise ConfigError(field, value, allowed)
    return value


def _bucket(field, value):
    allowed = ("an S3 bucket name: 3-63 characters, lowercase letters, digits, '.' and '-', "
               "starting and ending with a letter or digit, no '..', not an IP address")
    if (not isinstance(value, str) or not _BUCKET_RE.fullmatch(value) or ".." in value
            or ".-" in value or "-." in value or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value)
            or value.startswith("xn--") or value.endswith("-s3alias")):
        raise ConfigError(field, value, allowed)
    return value


def _prefix(field, value):
    allowed = "an S3 key prefix: letters, digits, '.', '_', '-', '/' (no leading '/', no '..')"
    if not isinstance(value, str) or not _PREFIX_RE.fullmatch(value) or ".." in value or "//" in value:
        raise ConfigError(field, value, allowed)
    return value.rstrip("/")


def _endpoint(field, value):
    allowed = "'auto' (local store or the cloud's own), or an http(s)://host[:port] URL"
    if value in (None, "", "auto"):
        return "auto"
    if not isinstance(value, str) or not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?/?", value):
        raise ConfigError(field, value, allowed)
    return value.rstrip("/")


def _model(field, value):
    from .paths import TRAIN_DIR

    bundled = sorted(p.stem for p in (TRAIN_DIR / "models").glob("*.py") if not p.stem.startswith("_"))
    allowed = f"a bundled model ({', '.join(bundled)}) or the path of a .py model file"
    if not isinstance(value, str) or not value:
        raise ConfigError(field, value, allowed)
    if value.endswith(".py"):
        path = Path(value).expanduser()
        if not path.is_file() and _CHECK_FILES.get():
            raise ConfigError(field, value, allowed + " (no such file)")
        if not _MODULE_RE.fullmatch(path.stem) or "." in path.stem:
            raise ConfigError(field, value, allowed + " (the file name must be a Python identifier)")
        return str(path.resolve())
    if value not in bundled:
        raise ConfigError(field, value, allowed)
    return value


def _credentials_file(field, value):
    allowed = ("'' (the local store's own keys, or the cloud's instance role), or the path of an existing "
               "0600 file with AWS_ACCESS_KEY_ID= and AWS_SECRET_ACCESS_KEY= lines")
    if value in (None, ""):
        return ""
    if not isinstance(value, str):
        raise ConfigError(field, value, allowed)
    path = Path(value).expanduser()
    if _CHECK_FILES.get():
        if not path.is_file():
            raise ConfigError(field, value, allowed + " (no such file)")
        if path.stat().st_mode & 0o077:
            raise ConfigError(field, value, allowed + f" (mode is {oct(path.stat().st_mode & 0o777)}: "
                                                      "chmod 600 it)")
    return str(path.resolve())


def _subnet(field, value):
    allowed = "'auto' or a private IPv4 /24 to /28 network such as 10.231.7.0/24"
    if value in (None, "", "auto"):
        return "auto"
    try:
        net = ipaddress.ip_network(str(value), strict=True)
    except ValueError:
        raise ConfigError(field, value, allowed) from None
    if net.version != 4 or not net.is_private or not (24 <= net.prefixlen <= 28):
        raise ConfigError(field, value, allowed)
    return str(net)


def _cidr_list(field, value):
    allowed = "a list of IPv4/IPv6 CIDR blocks, e.g. ['203.0.113.0/24']"
    if value is None:
        return []
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise ConfigError(field, value, allowed)
    out = []
    for item in value:
        try:
            out.append(str(ipaddress.ip_network(str(item), strict=False)))
        except ValueError:
            raise ConfigError(field, item, allowed) from None
    return out


def _options(field, value):
    allowed = "a mapping of option names to strings, numbers or booleans (see the provider's README)"
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(field, value, allowed)
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,40}", key):
            raise ConfigError(f"{field}.{key}", item, "option names of lowercase letters, digits and '_'")
        if isinstance(item, bool):
            item = "true" if item else "false"
        if not isinstance(item, str | int | float) or "\n" in str(item):
            raise ConfigError(f"{field}.{key}", item, "a single-line string, number or boolean")
        out[key] = str(item)
    return out


def _node(count_lo: int, count_hi: int, count: int) -> dict:
    return {
        "count": Field(count, _int(count_lo, count_hi), "number of nodes of this role"),
        "instance_type": Field("", _str(), "cloud instance type (ignored by local)"),
        "image": Field("", _str(), "cloud image id or name (ignored by local; '' = the provider's default)"),
        "gpus": Field(0, _int(0, 16), "GPUs per node of this role"),
    }


SCHEMA: dict = {
    "cluster": Field("tfc", _cluster_name, "cluster name: host, bridge and resource names derive from it"),
    "provider": Field("local", _choice(*PROVIDERS), "where the nodes come from"),
    "strategy": Field("parameter_server", _choice(*STRATEGIES), "distribution strategy"),
    "provider_options": Field({}, _options, "provider-specific settings (region, network, IM URL, ...)"),
    "nodes": {
        "ps": _node(0, 32, 1),
        "worker": _node(0, 64, 2),
        "chief": _node(0, 1, 1),
    },
    "tensorflow": {
        "version": Field("2.21.0", _regex(_VERSION_RE, "a TensorFlow release X.Y.Z, e.g. 2.21.0"),
                         "pinned TensorFlow release installed on every node"),
    },
    "storage": {
        "bucket": Field("tfcluster", _bucket, "S3 bucket for datasets, checkpoints and models (the default "
                        "`tfcluster` serves the local store only: set a bucket you own on clouds)"),
        "prefix": Field("runs", _prefix, "key prefix for runs: <prefix>/<cluster>/<run-id>/"),
        "endpoint": Field("auto", _endpoint, "S3 endpoint URL; 'auto' = local store on local, AWS otherwise"),
        "credentials_file": Field("", _credentials_file,
                                  "0600 file with the S3 keys of a site's store (nodes get them in a 0600 env file)"),
        "region": Field("us-east-1", _regex(re.compile(r"^[a-z]{2}(-[a-z0-9]+)+-\d$"),
                                            "a region name such as us-east-1"), "S3 region"),
    },
    "training": {
        "model": Field("digits", _model, "model: a bundled one (train/models/<name>.py) or a .py file path"),
        "steps": Field(600, _int(1, 10_000_000), "training steps"),
        "batch_size": Field(64, _int(1, 65536), "batch size per worker step"),
        "learning_rate": Field(0.002, _float(0.0, 10.0), "optimizer learning rate"),
        "max_restarts": Field(3, _int(0, 100), "restarts of a crashed task (with back-off) before the run fails"),
        "stall_timeout_seconds": Field(90, _int(10, 86400),
                                       "no training step for this long restarts the chief from its checkpoint"),
        "start_timeout_seconds": Field(300, _int(5, 86400),
                                       "how long the chief waits for every ps and worker before failing"),
        "checkpoint_every": Field(100, _int(1, 10_000_000), "checkpoint (copied to S3) every N steps and at the end"),
    },
    "max_runtime_minutes": Field(60, _int(1, 7 * 24 * 60), "hard limit for a run; nodes stop by themselves"),
    "network": {
        "tf_port": Field(2222, _int(1024, 65535), "gRPC port of the TensorFlow servers"),
        "subnet": Field("auto", _subnet, "local provider: the cluster bridge's network"),
        "allowed_ssh_cidrs": Field([], _cidr_list, "clouds: who may reach SSH (no open default)"),
    },
    "ssh": {
        "user": Field("", _regex(re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"), "a Unix user name", optional=True),
                      "SSH user on the nodes ('' = the provider's default)"),
        "timeout_seconds": Field(60, _int(5, 3600), "how long to wait for every node's SSH (unless set: 60 on "
                                 f"local, {CLOUD_SSH_TIMEOUT_S} on clouds and im, whose VMs boot slower)"),
    },
}

# Named CLI options / Make variables and the field each one sets.
OVERRIDE_FLAGS = {
    "cluster": "cluster",
    "provider": "provider",
    "ps": "nodes.ps.count",
    "workers": "nodes.worker.count",
    "steps": "training.steps",
}


def _walk(schema: Mapping, prefix: str = ""):
    for key, node in schema.items():
        path = f"{prefix}{key}"
        if isinstance(node, Field):
            yield path, node
        else:
            yield from _walk(node, path + ".")


FIELDS: dict[str, Field] = dict(_walk(SCHEMA))


def defaults() -> dict:
    """The configuration with every default filled in (a nested dict)."""
    out: dict = {}
    for path, f in FIELDS.items():
        _set(out, path, copy.deepcopy(f.default))
    return out


def _set(tree: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[leaf] = value


def flatten(tree: Mapping, prefix: str = "") -> dict:
    """Flatten a user tree to dotted keys, rejecting keys the schema does not know."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if not isinstance(key, str):
            raise ConfigError(path, key, "string keys")
        if path in FIELDS:
            flat[path] = value
        elif any(f.startswith(path + ".") for f in FIELDS):
            if not isinstance(value, Mapping):
                raise ConfigError(path, value, "a mapping with keys " + _children(path))
            flat.update(flatten(value, path + "."))
        else:
            parent = prefix[:-1]
            raise ConfigError(path, value, "known keys " + (_children(parent) if parent else _children("")))
    return flat


def _children(path: str) -> str:
    start = path + "." if path else ""
    names = sorted({f[len(start):].split(".")[0] for f in FIELDS if f.startswith(start)})
    return ", ".join(names)


def parse_set(item: str) -> tuple[str, Any]:
    """Parse one ``key=value`` override; the value is read as YAML (so 3 is an int, [a] a list)."""
    if "=" not in item:
        raise ConfigError("--set", item, "KEY=VALUE with KEY a dotted field such as training.steps")
    key, raw = item.split("=", 1)
    key = key.strip()
    if key.startswith("provider_options.") and len(key) > len("provider_options."):
        return key, raw.strip()  # one option of the provider-specific mapping, kept as text
    if key not in FIELDS:
        raise ConfigError(key, raw, "a known field: " + ", ".join(sorted(FIELDS)))
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_file(path: str | Path | None) -> dict:
    """Read a cluster file into dotted keys (empty when path is None or empty)."""
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
        raise ConfigError("config file", str(path), f"valid YAML ({exc})".replace("\n", " ")) from None
    if not isinstance(data, Mapping):
        raise ConfigError("config file", str(path), "a YAML mapping at the top level")
    return flatten(data)


def resolve(file_values: Mapping[str, Any] | None = None,
            overrides: Mapping[str, Any] | None = None, check_files: bool = True) -> RunSpec:
    """Merge defaults < file < overrides, validate every field and the rules across fields.

    ``check_files=False`` skips checks that a file exists (for a saved spec re-read by ``down``).
    """
    token = _CHECK_FILES.set(check_files)
    try:
        return _resolve(file_values, overrides)
    finally:
        _CHECK_FILES.reset(token)


def _resolve(file_values, overrides) -> RunSpec:
    merged = {path: copy.deepcopy(f.default) for path, f in FIELDS.items()}
    explicit = set()
    for source in (file_values or {}, overrides or {}):
        for key, value in source.items():
            if key not in FIELDS:
                raise ConfigError(key, value, "a known field: " + ", ".join(sorted(FIELDS)))
            merged[key] = value
            explicit.add(key)
    checked = {path: FIELDS[path].check(path, value) for path, value in merged.items()}
    tree: dict = {}
    for path, value in checked.items():
        _set(tree, path, value)
    _provider_defaults(tree, explicit)
    _check_relations(tree)
    return RunSpec(tree)


def _uses_cloud_nodes(tree: dict) -> bool:
    """Nodes and storage off this machine: every provider but local, and im unless it adopts local nodes."""
    if tree["provider"] == "local":
        return False
    adopt = str(tree["provider_options"].get("adopt_local", "")).lower() in ("true", "yes", "1")
    return not (tree["provider"] == "im" and adopt)


def _provider_defaults(tree: dict, explicit: set[str]) -> None:
    """Defaults that differ off the local provider, and what has no safe default there (values set win)."""
    if not _uses_cloud_nodes(tree):
        return
    if "ssh.timeout_seconds" not in explicit:
        tree["ssh"]["timeout_seconds"] = CLOUD_SSH_TIMEOUT_S
    if "storage.bucket" not in explicit:
        raise ConfigError("storage.bucket", f"{tree['storage']['bucket']} (the default)",
                          f"a bucket you own, set explicitly on provider {tree['provider']} (S3 bucket names are "
                          "global: the default 'tfcluster' serves the local store and is someone else's on AWS), "
                          "e.g. --set storage.bucket=my-team-tfcluster")


def _check_relations(tree: dict) -> None:
    nodes = tree["nodes"]
    if tree["strategy"] == "parameter_server":
        if nodes["ps"]["count"] < 1:
            raise ConfigError("nodes.ps.count", nodes["ps"]["count"],
                              "an integer >= 1 with strategy parameter_server")
        if nodes["worker"]["count"] < 1:
            raise ConfigError("nodes.worker.count", nodes["worker"]["count"],
                              "an integer >= 1 with strategy parameter_server")
        if nodes["chief"]["count"] != 1:
            raise ConfigError("nodes.chief.count", nodes["chief"]["count"],
                              "exactly 1 with strategy parameter_server (the chief is the coordinator)")
    total = sum(nodes[r]["count"] for r in ROLES)
    if tree["provider"] == "local":
        if total > 16:
            raise ConfigError("nodes", f"{total} nodes", "at most 16 nodes in all on the local provider")
        for role in ROLES:
            if nodes[role]["gpus"]:
                raise ConfigError(f"nodes.{role}.gpus", nodes[role]["gpus"],
                                  "0 on the local provider (its nodes have no GPUs)")


class RunSpec:
    """A validated configuration: attribute access to the nested tree, plus derived values."""

    def __init__(self, tree: dict):
        self._tree = tree

    def __getattr__(self, name):
        try:
            value = self.__dict__["_tree"][name]
        except KeyError:
            raise AttributeError(name) from None
        return _View(value) if isinstance(value, dict) else value

    def to_dict(self) -> dict:
        return copy.deepcopy(self._tree)

    def get(self, path: str):
        node = self._tree
        for part in path.split("."):
            node = node[part]
        return node

    def count(self, role: str) -> int:
        return self._tree["nodes"][role]["count"]

    @property
    def node_total(self) -> int:
        return sum(self.count(r) for r in ROLES)

    def __eq__(self, other):
        return isinstance(other, RunSpec) and other._tree == self._tree


class _View:
    def __init__(self, tree: dict):
        self._tree = tree

    def __getattr__(self, name):
        try:
            value = self.__dict__["_tree"][name]
        except KeyError:
            raise AttributeError(name) from None
        return _View(value) if isinstance(value, dict) else value

    def __getitem__(self, name):
        return self.__getattr__(name)


def reference() -> str:
    """A Markdown table of every field, its default and meaning (used for the README)."""
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for path, f in FIELDS.items():
        lines.append(f"| `{path}` | `{f.default!r}` | {f.doc} |")
    return "\n".join(lines)
