"""The provider interface: typed node records, a registry, and the Terraform-backed base."""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .. import terraform
from ..access import check_grantable, storage_access
from ..config import ROLES, RunSpec, config_error
from ..errors import ConfigError, ProvisionError
from ..paths import TERRAFORM_DIR, ClusterState
from ..terraform import TerraformModule
from ..tfsupport import DefaultImage, check_default_image

#: minutes a cloud VM outlives the run's deadline before it halts itself: the supervisors end their tasks
#: at the deadline and the chief writes its final checkpoint first (see Provider.vm_halt_minutes)
VM_HALT_MARGIN_MINUTES = 10
#: minutes the cloud modules (terraform/aws, gcp, openstack) add to max_runtime_minutes for the halt they arm
#: at boot, a backstop until training starts (configuration: packages, a GPU driver, TensorFlow)
CONFIGURE_ALLOWANCE_MINUTES = 60


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


@dataclass
class PlannedNode:
    """A node as ``plan`` shows it: what the configuration asks for, completed by the provider's plan."""

    name: str
    role: str
    instance_type: str
    image: str
    gpus: int
    address: str = ""


@dataclass
class ProviderPlan:
    """What ``up`` would create (see :meth:`Provider.plan`): the nodes and the lines that describe the rest."""

    nodes: list[PlannedNode]
    creates: list[str]
    #: the ``nodes`` the provider would report, where its plan knows them already (addresses included)
    known: list[Node] = field(default_factory=list)


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
    #: what a node's halt does, in the words of this provider (plan says it)
    halt_effect: ClassVar[str] = "the VM powers off"

    #: at most this many nodes in all (None: the cloud's quotas decide)
    max_nodes: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.options = cls.options_model.descriptions()

    @classmethod
    def check_nodes(cls, spec: RunSpec) -> None:
        """This provider's limits on the nodes, checked with the rest of the cluster file
        (:class:`tfcluster.config.RunSpec` calls it): ConfigError naming the field."""
        if cls.max_nodes is not None and spec.node_total > cls.max_nodes:
            raise ConfigError("nodes", f"{spec.node_total} nodes", f"at most {cls.max_nodes} nodes in all on the "
                                                                    f"{cls.name} provider")
        for role in ROLES:
            if spec.nodes[role].gpus and "gpus" in cls.unsupported:
                raise ConfigError(f"nodes.{role}.gpus", spec.nodes[role].gpus,
                                  f"0 on the {cls.name} provider ({cls.unsupported['gpus']})")

    @classmethod
    def check_groups(cls, specs: list[RunSpec]) -> None:
        """A sweep's groups (a cluster each, :func:`tfcluster.groups.spec_for`) can stand side by side:
        ConfigError naming the field. Nothing to check where each cluster gets a network of its own."""
        return None

    @classmethod
    def uses_cloud_nodes(cls, spec: RunSpec) -> bool:
        """Whether the nodes (and so their storage) are off this machine (:attr:`RunSpec.uses_cloud_nodes`)."""
        return True

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
        type(self).check_nodes(spec)   # also checked with the cluster file; here too for a spec made from another
                                       # (im's adopted nodes are checked as the local provider's)

    def vm_halt_minutes(self, spec: RunSpec) -> int:
        """Minutes from the start of training after which each node halts its VM; 0 = never.

        The run's deadline (the supervisors' ``--deadline``) is ``max_runtime_minutes`` after training starts:
        the VM halts :data:`VM_HALT_MARGIN_MINUTES` later, so the chief's final checkpoint is written first.
        The controller passes it to tf_node's start tasks (``tf_node_vm_halt_minutes``), which arm
        ``shutdown -h +N`` then, replacing the boot-time backstop of the cloud modules.
        """
        return spec.max_runtime_minutes + VM_HALT_MARGIN_MINUTES if self.halts_vm else 0

    def task_threads(self, spec: RunSpec) -> dict:
        """Each node's TensorFlow thread pools, ``{"intra_op": n, "inter_op": m}``, or ``{}``: TensorFlow's
        defaults (one thread per core).  A VM's cores are its own, so by default providers keep the defaults;
        the controller passes this to tf_node's start tasks (``tf_node_threads``)."""
        return {}

    def warm_start(self, spec: RunSpec) -> bool:
        """Whether each node starts its tasks as forks of a warm interpreter (``tf_node_warm_start``: TensorFlow
        imported once per node and kept between runs, ~200 MB of the node's memory). A VM's memory is its own,
        so by default they do."""
        return True

    #: whose preemption notice the nodes' supervisors watch in the instance metadata: "aws", "gcp" or ""
    preemption_notice = ""

    def boot_halt_minutes(self, spec: RunSpec) -> int:
        """Minutes after its boot at which each node halts itself until training starts (and re-arms the halt
        for :meth:`vm_halt_minutes`); 0 = no such backstop."""
        return 0

    @abstractmethod
    def up(self, spec: RunSpec, public_key: str) -> list[Node]:
        """Create (or converge) the cluster's nodes and return them."""

    @abstractmethod
    def plan(self, spec: RunSpec, scratch: ClusterState) -> ProviderPlan:
        """What :meth:`up` would create for ``spec``, found without creating anything: the provider's own
        rendering and planning run in ``scratch``, a throw-away state directory holding an SSH key pair (the
        cluster's public key when it has one), never in the cluster's state."""

    @abstractmethod
    def exposure(self, spec: RunSpec) -> list[str]:
        """What the nodes' network exposes to whom (SSH, the TensorFlow port), one line each."""

    def plan_nodes(self, spec: RunSpec) -> list[PlannedNode]:
        """The nodes the configuration asks for, in the shared naming (``<cluster>-<role>-<index>``)."""
        return [PlannedNode(f"{spec.cluster}-{role}-{i}", role, self.node_type(spec, role),
                            self.node_image(spec, role), spec.nodes[role].gpus)
                for role in ROLES for i in range(spec.count(role))]

    def node_type(self, spec: RunSpec, role: str) -> str:
        """A role's instance type as ``plan`` shows it ('' = the provider's default)."""
        return spec.nodes[role].instance_type or "(the module's default)"

    def node_image(self, spec: RunSpec, role: str) -> str:
        """A role's image as ``plan`` shows it ('' = the provider's default image)."""
        return spec.nodes[role].image or (self.default_image.name if self.default_image else "")

    @abstractmethod
    def down(self) -> None:
        """Destroy everything the provider created for this cluster."""

    def image_keys(self, spec: RunSpec) -> dict[str, str]:
        """Per role, the content key (:mod:`tfcluster.baked`) of the image roles as this configuration would
        bake them: configure skips those roles on a node whose image carries that key (the roles' result is
        in its image already). ``{}``, the default: the roles run on every node (on an image they only check)."""
        return {}

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
    #: what a Terraform plan of this module needs that ``plan`` does not have ('' = it plans here)
    plan_needs: ClassVar[str] = ""

    def plan_blocker(self, spec: RunSpec) -> str:
        """Why a Terraform plan of this module cannot run here now ('' = it plans): by default what
        :attr:`plan_needs` names."""
        if not self.plan_needs:
            return ""
        return f"it needs {self.plan_needs}, which plan does not use ('make up' plans and applies with them)"

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

    def boot_halt_minutes(self, spec: RunSpec) -> int:
        """The cloud modules arm a halt at boot: max_runtime_minutes plus the configuration allowance."""
        return spec.max_runtime_minutes + CONFIGURE_ALLOWANCE_MINUTES if self.halts_vm else 0

    def exposure(self, spec: RunSpec) -> list[str]:
        """The shared interface's firewall: SSH from allowed_ssh_cidrs, tf_port between members, nothing else."""
        return [f"SSH (22/tcp): from {', '.join(spec.network.allowed_ssh_cidrs)} only",
                f"TensorFlow gRPC ({spec.network.tf_port}/tcp, no authentication): only between the cluster's nodes",
                "nothing else inbound; outbound open (packages, S3)"]

    def plan(self, spec: RunSpec, scratch: ClusterState) -> ProviderPlan:
        """Terraform's plan of the module with the inputs ``up`` gives it, in ``scratch`` (against a copy of
        the cluster's state when it is up); where the module cannot be planned here, its inputs and resources."""
        tf = TerraformModule(TERRAFORM_DIR / self.name, scratch.terraform_dir)
        tf.write_root(self.inputs(spec, scratch.ssh_key.with_suffix(".pub").read_text().strip()))
        why = self.plan_blocker(spec)
        if why:
            return ProviderPlan(self.plan_nodes(spec), self._unplanned(tf, why))
        return self._planned(spec, tf)

    def _planned(self, spec: RunSpec, tf: TerraformModule) -> ProviderPlan:
        """Terraform's own plan, each node completed from it (type, image, address where it knows them)."""
        live = self.state.terraform_dir / "terraform.tfstate"
        if live.exists():
            shutil.copy2(live, tf.work_dir / live.name)
        planned = tf.plan()
        known = [Node.from_dict(d) for d in terraform.planned_output(planned, "nodes") or []]
        where = {n.name: n.private_ip for n in known}
        nodes = [replace(n, address=where.get(n.name, ""), **self._planned_node(planned, n.name))
                 for n in self.plan_nodes(spec)]
        changes = terraform.resource_changes(planned)
        lines = [f"terraform plan of terraform/{self.name}/ (in a temporary directory, removed after): "
                 f"{terraform.summary(changes)}"]
        lines += [f"  {mark} {address}{self.describe_change(after)}" for mark, address, after in changes]
        return ProviderPlan(nodes, lines, known)

    @staticmethod
    def _planned_node(planned: dict, name: str) -> dict:
        """The instance type and image Terraform plans for a node (its resource keyed by the node's name)."""
        after = terraform.planned_attributes(planned, name)
        found = {"instance_type": next((after[k] for k in _TYPE_KEYS if after.get(k)), None),
                 "image": next((after[k] for k in _IMAGE_KEYS if after.get(k)), None)}
        return {k: v for k, v in found.items() if v}

    def describe_change(self, after: dict) -> str:
        """What a planned resource is, in a few words (its type, image, network and ports, where it has them)."""
        shown = [f"{k} {after[k]}" for k in _SHOWN_KEYS if after.get(k) not in (None, "", [], {})]
        return f": {', '.join(shown)}" if shown else ""

    def _unplanned(self, tf: TerraformModule, why: str) -> list[str]:
        """Where no plan can run: the module's inputs and resources, and ``why`` there is no plan."""
        root = json.loads((tf.work_dir / "main.tf.json").read_text())["module"]["cluster"]
        lines = [f"terraform plan: not run: {why}", f"terraform/{self.name}/ with the inputs up would give it:"]
        shown = {k: json.dumps(v) for k, v in root.items() if k != "source"} | {"ssh_public_key": "(the run's key)"}
        lines += [f"  {key} = {value}" for key, value in shown.items()]
        lines.append(f"  (instance_types: {tf.variable_description('instance_types')})")
        lines.append("the module's resources (count / for_each decide how many of each):")
        width = max((len(r) for r, _ in tf.declared_resources()), default=0)
        lines += [f"  {res:<{width}}  {' '.join(how.split())}".rstrip() for res, how in tf.declared_resources()]
        return lines

    def leftovers(self) -> list[str]:
        tf = self.module()
        return ["terraform state still lists resources"] if tf.has_resources() else []


#: attributes of a planned resource that name a node's instance type / image, or say what it is
_TYPE_KEYS = ("instance_type", "machine_type", "flavor_name")
_IMAGE_KEYS = ("ami", "image_id", "image_name")
_SHOWN_KEYS = (*_TYPE_KEYS, *_IMAGE_KEYS, "cidr_block", "cidr_ipv4", "from_port", "to_port",
               "referenced_security_group_id")


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
