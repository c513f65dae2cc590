"""The provider interface: typed node records, a registry, and the Terraform-backed base."""

from __future__ import annotations

import ipaddress
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..access import check_grantable, storage_access
from ..config import ROLES, RunSpec, config_error
from ..errors import ConfigError, ProvisionError
from ..paths import TERRAFORM_DIR, ClusterState
from ..terraform import TerraformModule
from ..tfsupport import DefaultImage, check_default_image

#: minutes a cloud VM outlives the run's deadline before it halts itself: the supervisors end their tasks
#: at the deadline and the chief writes its final checkpoint first (see Provider.vm_halt_minutes)
VM_HALT_MARGIN_MINUTES = 10


_NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME_RE = re.compile(rf"^(?=.{{1,253}}$)({_LABEL}\.)*{_LABEL}$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class Node:
    """One node as every provider reports it (the ``nodes`` output of each Terraform module)."""

    name: str
    role: str
    index: int
    private_ip: str
    public_ip: str
    ssh_user: str
    ssh_port: int
    gpus: int

    @classmethod
    def from_dict(cls, d: dict) -> Node:
        try:
            node = cls(name=str(d["name"]), role=str(d["role"]), index=int(d["index"]),
                       private_ip=str(d["private_ip"]), public_ip=str(d.get("public_ip") or d["private_ip"]),
                       ssh_user=str(d["ssh_user"]), ssh_port=int(d["ssh_port"]), gpus=int(d.get("gpus", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProvisionError(f"provider returned a malformed node record {d!r}: {exc}") from None
        if node.role not in ROLES:
            raise ProvisionError(f"provider returned node {node.name} with unknown role {node.role!r}")
        node.check_values()
        return node

    def check_values(self) -> None:
        """What a provider returns goes into the inventory and SSH command lines: refuse what is not a
        plain node name, an IP address (or, public side, a DNS name), a Unix user and a port."""
        problems = []
        if not _NODE_NAME_RE.fullmatch(self.name):
            problems.append(f"name {self.name!r}")
        for label, value, names_ok in (("private_ip", self.private_ip, False), ("public_ip", self.public_ip, True)):
            try:
                ipaddress.ip_address(value)
            except ValueError:
                if not (names_ok and _HOST_NAME_RE.fullmatch(value)):
                    problems.append(f"{label} {value!r}")
        if not _USER_RE.fullmatch(self.ssh_user):
            problems.append(f"ssh_user {self.ssh_user!r}")
        if not 1 <= self.ssh_port <= 65535:
            problems.append(f"ssh_port {self.ssh_port}")
        if self.index < 0 or self.gpus < 0:
            problems.append(f"index {self.index} / gpus {self.gpus}")
        if problems:
            raise ProvisionError(f"provider returned node {self.name!r} with a bad " + ", ".join(problems))

    def to_dict(self) -> dict:
        return asdict(self)


def write_nodes(path: Path, nodes: list[Node]) -> None:
    path.write_text(json.dumps([n.to_dict() for n in nodes], indent=2) + "\n")


def read_nodes(path: Path) -> list[Node]:
    if not path.exists():
        return []
    return [Node.from_dict(d) for d in json.loads(path.read_text())]


class ProviderOptions(BaseModel):
    """A provider's ``provider_options``, typed: one field per option, each with the ``description`` users read
    (mostly ``str | None``: None = not given, so the provider's or module's default applies; values the module
    receives stay the user's text). Unknown keys are refused; values are read-only once checked. The base model
    itself has no fields: a provider without user options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def descriptions(cls) -> dict[str, str]:
        """Each option and its meaning (error messages, READMEs and tests read this)."""
        return {name: info.description or "" for name, info in cls.model_fields.items()}


class Provider(ABC):
    """Base class. ``up`` returns the nodes; ``down`` removes everything; ``leftovers`` proves it."""

    name: ClassVar[str] = ""
    #: features this provider cannot offer, with the reason a user sees
    unsupported: ClassVar[dict[str, str]] = {}
    #: the model of this provider's provider_options (the base model: none)
    options_model: ClassVar[type[ProviderOptions]] = ProviderOptions
    #: the keys this provider accepts in provider_options, with their meaning (from options_model's descriptions)
    options: ClassVar[dict[str, str]] = {}
    #: what `down` proved gone, in the words of this provider
    gone: ClassVar[str] = "no node or cloud resource of it remains"
    #: the image of nodes whose nodes.<role>.image is '' (None: no default image; its Python is unknown here)
    default_image: ClassVar[DefaultImage | None] = None
    #: the nodes' cloud identity may use only the storage of :func:`tfcluster.access.storage_access` at ``up``
    #: (a run that needs more is refused until ``up`` grants it)
    limits_storage_access: ClassVar[bool] = False
    #: the nodes are VMs of their own that may halt themselves (never true of local nodes: they share the
    #: host's kernel, and `shutdown` there would halt the controller's machine)
    halts_vm: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.options = cls.options_model.descriptions()

    def __init__(self, state: ClusterState):
        self.state = state

    @classmethod
    def options_for(cls, spec: RunSpec) -> ProviderOptions:
        """The spec's provider_options as this provider's model (ConfigError names the option, exit 2)."""
        return cls.parse_options(spec.provider_options)

    @classmethod
    def parse_options(cls, options: Mapping[str, str]) -> ProviderOptions:
        """Options (names to strings) as this provider's model; the first bad one raises ConfigError."""
        try:
            return cls.options_model.model_validate(dict(options))
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # unknown keys first
            if err["type"] == "extra_forbidden":
                allowed = ", ".join(sorted(cls.options)) or "none"
                raise ConfigError(f"provider_options.{err['loc'][0]}", err["input"],
                                  f"options of provider {cls.name}: {allowed}") from None
            raise config_error(exc, cls.options_model, prefix="provider_options.") from None

    def check(self, spec: RunSpec) -> None:
        """Refuse a spec this provider cannot serve, before anything is created."""
        self.options_for(spec)
        for role in ROLES:
            if spec.count(role) and spec.nodes[role].gpus and "gpus" in self.unsupported:
                raise ConfigError(f"nodes.{role}.gpus", spec.nodes[role].gpus,
                                  f"0 ({self.unsupported['gpus']})")

    def vm_halt_minutes(self, spec: RunSpec) -> int:
        """Minutes from the start of training after which each node halts its VM; 0 = never.

        The run's deadline (the supervisors' ``--deadline``) is ``max_runtime_minutes`` after training starts:
        the VM halts :data:`VM_HALT_MARGIN_MINUTES` later, so the chief's final checkpoint is written first.
        The controller passes it to tf_node's start tasks (``tf_node_vm_halt_minutes``), which arm
        ``shutdown -h +N`` then, replacing the boot-time backstop of the cloud modules.
        """
        return spec.max_runtime_minutes + VM_HALT_MARGIN_MINUTES if self.halts_vm else 0

    @abstractmethod
    def up(self, spec: RunSpec, public_key: str) -> list[Node]:
        """Create (or converge) the cluster's nodes and return them."""

    @abstractmethod
    def down(self) -> None:
        """Destroy everything the provider created for this cluster."""

    def offline_nodes(self, spec: RunSpec) -> bool:
        """Nodes without a route to a package index: TensorFlow comes from the controller's wheelhouse."""
        return self.wheelhouse_host(spec) is not None

    def wheelhouse_host(self, spec: RunSpec) -> str | None:
        """An address of this controller the nodes reach, to serve them the wheelhouse; None = copy it."""
        return None

    def force_cleanup(self) -> None:  # noqa: B027  optional hook: most providers' records are complete
        """Remove what the provider's own records miss (after an interrupted ``up``)."""

    def leftovers(self) -> list[str]:
        """Human-readable descriptions of anything of this cluster still present."""
        return []


class TerraformProvider(Provider):
    """A provider backed by ``terraform/<name>/`` honouring the shared module interface."""

    #: clouds: SSH must be limited to networks the user names (there is no open default)
    requires_ssh_cidrs: ClassVar[bool] = False

    def check(self, spec: RunSpec) -> None:
        super().check(spec)
        cidrs = spec.network.allowed_ssh_cidrs
        if self.requires_ssh_cidrs and not cidrs:
            raise ConfigError("network.allowed_ssh_cidrs", cidrs,
                              f"at least one network that may reach SSH, e.g. ['203.0.113.0/24'] ({self.name} has "
                              "no open default; SSH is open to the internet only if 0.0.0.0/0 or ::/0 is listed)")
        if self.default_image:
            check_default_image(spec, self.name, self.default_image)
        if self.limits_storage_access:
            check_grantable(spec, self.name)

    def module(self) -> TerraformModule:
        return TerraformModule(TERRAFORM_DIR / self.name, self.state.terraform_dir)

    def provider_options(self, spec: RunSpec) -> dict[str, str]:
        return {}

    def inputs(self, spec: RunSpec, public_key: str) -> dict:
        """The shared inputs every module under terraform/ declares."""
        return {
            "cluster_name": spec.cluster,
            "ps_count": spec.count("ps"),
            "worker_count": spec.count("worker"),
            "chief_count": spec.count("chief"),
            "instance_types": {r: spec.nodes[r].instance_type for r in ROLES},
            "images": {r: spec.nodes[r].image for r in ROLES},
            "gpus": {r: spec.nodes[r].gpus for r in ROLES},
            "ssh_public_key": public_key,
            "ssh_user": spec.ssh.user,
            "allowed_ssh_cidrs": spec.network.allowed_ssh_cidrs,
            "tf_port": spec.network.tf_port,
            "bucket": spec.storage.bucket,
            "prefix": spec.storage.prefix,
            "max_runtime_minutes": spec.max_runtime_minutes,
            "storage_access": storage_access(spec).module_input(),
            "provider_options": self.provider_options(spec),
        }

    def up(self, spec: RunSpec, public_key: str) -> list[Node]:
        tf = self.module()
        tf.write_root(self.inputs(spec, public_key))
        tf.apply()
        return [Node.from_dict(d) for d in tf.output("nodes")]

    def down(self) -> None:
        self.module().destroy()

    def leftovers(self) -> list[str]:
        tf = self.module()
        return ["terraform state still lists resources"] if tf.has_resources() else []


REGISTRY: dict[str, type[Provider]] = {}


def register(cls: type[Provider]) -> type[Provider]:
    REGISTRY[cls.name] = cls
    return cls


def get_provider(name: str, state: ClusterState) -> Provider:
    try:
        return REGISTRY[name](state)
    except KeyError:
        available = ", ".join(sorted(REGISTRY))
        raise ConfigError("provider", name, f"a provider implemented here: {available}") from None
