"""RADL for the Infrastructure Manager: rendered from a RunSpec with ``radl/cluster.radl.j2``, then validated.

Every value that reaches the document is checked first against what RADL can carry safely (an image URL
with a quote or a newline, a memory size that is not a number with a unit, ...): a bad one raises
:class:`~tfcluster.errors.ConfigError` naming the field, before anything is sent to IM. The rendered text
must then pass the ``radl`` parser's ``parse_radl`` and ``check()``, exactly as IM runs them.

Two kinds of systems:

* cloud (the default): one ``system`` per role (``ps``, ``worker``, ``chief``) with ``deploy <role> <count>``,
  its image, cpu, memory, GPUs and instance type from the configuration, attached to the public network
  (SSH only) and the private one;
* adopted (``adopt_local``): one ``system`` per existing node (``ps_0``, ``worker_1``, ...) naming its
  address and credentials, for IM's ``DeployedNode`` connector.

Private key text is only ever held in memory: :func:`render` returns it inside the document, and the
caller sends it to IM without writing it anywhere. ``python -m tfcluster.radl_render --config FILE``
prints the document an operator can give to ``im_client create`` (without keys; IM makes its own).
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_core import PydanticCustomError
from tfc_harness import strategies

from .config import ROLES, RunSpec, matching_check, refuse
from .errors import ConfigError, ProvisionError
from .paths import REPO

if TYPE_CHECKING:
    import jinja2

RADL_DIR = REPO / "radl"
TEMPLATE = "cluster.radl.j2"
PROJECT_ROLES = ("common", "gpu_driver", "tensorflow", "tf_node")
CONTEXTUALIZE_MODES = ("tfcluster", "im")

DEFAULT_CPU = 2
DEFAULT_MEMORY = "4G"
#: IM's default administrator user on cloud images (IM creates it when the image has none)
DEFAULT_CLOUD_USER = "cloudadm"

# no braces: IM's own Ansible would evaluate '{{ }}' / '{% %}' in a value the RADL passes on
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"\\,{}]+$")
_HTTP_URL_RE = re.compile(r"^https?://[^\s'\"\\,|{}]+$")
_MEMORY_RE = re.compile(r"^(\d{1,7})\s*(K|M|G|T|KB|MB|GB|TB|KI|MI|GI|TI|KIB|MIB|GIB|TIB)$", re.IGNORECASE)
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_CLOUD_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PUBKEY_RE = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+) [A-Za-z0-9+/=]+( [A-Za-z0-9@._:+-]{0,100})?$")
_KEY_BODY_RE = re.compile(r"^-----BEGIN [A-Z ]+-----\n[A-Za-z0-9+/=\n]+-----END [A-Z ]+-----\n$")

@dataclass(frozen=True)
class AdoptedNode:
    """An existing host for IM's DeployedNode connector."""

    name: str
    role: str
    index: int
    ip: str


@dataclass(frozen=True)
class Credentials:
    """SSH access IM is told about. private_key is key text (ends with a newline), never a path."""

    username: str
    public_key: str = ""
    private_key: str = ""

    def __repr__(self) -> str:  # never print a key
        return f"Credentials(username={self.username!r}, public_key=..., private_key=<{len(self.private_key)} chars>)"


# -- value checks (the im provider's options model uses them too) ------------------------------------
_IMAGE_URL = "a single image URL scheme://..., without spaces, quotes, backslashes or commas (e.g. ost://site/ID)"
image_url_check = matching_check(_URL_RE, _IMAGE_URL)
optional_image_url_check = matching_check(_URL_RE, _IMAGE_URL, optional=True)
instance_type_check = matching_check(_INSTANCE_RE, "an instance type name: letters, digits, '.', '_', ':', '/', '-'",
                                     optional=True)
cloud_id_check = matching_check(_CLOUD_ID_RE, "an auth-file id: letters, digits, '_', '.', '-'", optional=True)


def memory_check(value: Any) -> str:
    """'8G', '4096M', '8 GiB' -> RADL '8G', '4096M', '8GIB'."""
    m = _MEMORY_RE.fullmatch(str(value).strip()) if isinstance(value, str | int) else None
    if not m or int(m.group(1)) < 1:
        refuse("an integer with a unit (K, M, G, T, optionally with B or iB), e.g. 4096M or 8G")
    return f"{int(m.group(1))}{m.group(2).upper()}"


def cpu_check(value: Any) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"\d{1,4}", text) or not 1 <= int(text) <= 1024:
        refuse("an integer from 1 to 1024")
    return int(text)


def http_url_check(value: Any) -> str:
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not _HTTP_URL_RE.fullmatch(value):
        refuse("an http(s):// URL without spaces, quotes, backslashes, commas, '|' or braces (IM's Ansible "
               "would evaluate '{{ }}')")
    return value.rstrip("/")


def checked(field: str, check: Callable[[Any], Any], value: Any) -> Any:
    """``check(value)`` for a value outside the options model, its refusal as the ConfigError naming ``field``."""
    try:
        return check(value)
    except PydanticCustomError as exc:
        raise ConfigError(field, value, exc.context["allowed"]) from None


def outports(cidrs: list[str]) -> str:
    """IM outports opening SSH (22/tcp) to each source CIDR; nothing else is opened."""
    out = []
    for cidr in cidrs:
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError("network.allowed_ssh_cidrs", cidr, "IPv4 CIDR blocks") from None
        if net.version != 4:
            raise ConfigError("network.allowed_ssh_cidrs", cidr, "IPv4 CIDR blocks (IM's outports take IPv4 only)")
        out.append(f"{net}-22/tcp-22/tcp")
    return ",".join(out)


def _ssh_outports(spec: RunSpec, adopted) -> str:
    """Public SSH sources; none at all is refused for cloud nodes (an empty outports opens nothing)."""
    cidrs = spec.network.allowed_ssh_cidrs
    if not cidrs and not adopted:
        raise ConfigError("network.allowed_ssh_cidrs", cidrs,
                          "at least one IPv4 network that may reach SSH, e.g. ['203.0.113.0/24'] "
                          "(there is no open default)")
    return outports(cidrs)


def _private_key(text: str) -> str:
    # the key travels inside a single-quoted RADL string: only armour lines of base64 are accepted
    if not text.endswith("\n") or not _KEY_BODY_RE.fullmatch(text):
        raise ProvisionError("the run's SSH private key is not an unencrypted PEM/OpenSSH key text ending "
                             "with a newline; remove .tfcluster/<cluster>/ssh/ and run up again")
    return text


# -- rendering -------------------------------------------------------------------------------------
def _group_exprs(role: str, systems: list[str], tf_port: int) -> tuple[str, str]:
    """Ansible expressions for IM's inventory (groups are system names): this host's index, the role's addresses."""
    names = "[" + ", ".join(f"'{s}'" for s in systems) + "]"
    hosts = f"({names} | map('extract', groups) | flatten)"
    index = "{{ " + hosts + ".index(inventory_hostname) }}"
    spec = ("{{ " + hosts + " | map('extract', hostvars, 'IM_NODE_PRIVATE_IP')"
            f" | map('regex_replace', '$', ':{tf_port}') | list }}}}")
    return index, spec


def _im():
    """The im provider's class, whose options model checks the options read here (that module imports this
    one, so it is imported when first needed)."""
    from .providers.im import ImProvider

    return ImProvider


def _ssh_user(credentials: Credentials | None) -> str:
    """The user IM is told about; the keys are checked too ('' without credentials)."""
    if not credentials:
        return ""
    user = checked("ssh.user", matching_check(_USER_RE, "a Unix user name"), credentials.username)
    if credentials.public_key:
        checked("ssh public key", matching_check(_PUBKEY_RE, "an OpenSSH public key line"),
                credentials.public_key.strip())
    if credentials.private_key:
        _private_key(credentials.private_key)
    return user


def _members(spec: RunSpec, role: str, base: dict, image: str, adopted: list[AdoptedNode] | None) -> list[dict]:
    """The systems of one role: one that deploys ``count`` cloud VMs, or one per adopted node."""
    count = spec.count(role)
    if adopted is None:
        if not image:
            raise ConfigError(f"nodes.{role}.image", "", "an image URL here or in provider_options.image_url "
                              "(IM needs disk.0.image.url for every system)")
        return [dict(base, name=role, count=count, ip="", image_url=image, hostname=f"{spec.cluster}-{role}-#N#",
                     summary=f"{count} x {role}")]
    nodes = sorted((n for n in adopted if n.role == role), key=lambda n: n.index)
    if len(nodes) != count:
        raise ProvisionError(f"{len(nodes)} {role} nodes to adopt, the configuration asks for {count}")
    members = []
    for n in nodes:
        try:
            ip = str(ipaddress.ip_address(n.ip))
        except ValueError:
            raise ProvisionError(f"node {n.name} has no valid address ({n.ip!r})") from None
        members.append(dict(base, name=f"{role}_{n.index}", count=1, ip=ip,
                            image_url=checked(f"nodes.{role}.image", image_url_check,
                                              image or f"local://{spec.cluster}/{n.name}"),
                            hostname=n.name, summary=f"{n.name} (adopted, {ip})"))
    return members


def _systems(spec: RunSpec, opts, adopted: list[AdoptedNode] | None, user: str) -> tuple[list[dict], list[dict]]:
    """The RADL systems and the roles (with the Ansible expressions IM's inventory needs) of the run."""
    systems, roles = [], []
    for role in ROLES:
        if not spec.count(role):
            continue
        node = spec.nodes[role]
        image = checked(f"nodes.{role}.image", image_url_check, node.image) if node.image else opts.image_url or ""
        base = {"role": role, "cpu": opts.cpu_of(role), "memory": opts.memory_of(role), "gpus": node.gpus,
                "instance_type": checked(f"nodes.{role}.instance_type", instance_type_check, node.instance_type),
                "ssh_user": user}
        members = _members(spec, role, base, image, adopted)
        systems += members
        names = [m["name"] for m in members]
        index_expr, spec_expr = _group_exprs(role, names, spec.network.tf_port)
        roles.append({"name": role, "systems": names, "gpus": node.gpus,
                      "storage": role in strategies.storage_jobs(spec.strategy),
                      "index_expr": index_expr, "spec_expr": spec_expr})
    return systems, roles


def context(spec: RunSpec, options: Mapping[str, str] | None = None, *, adopted: list[AdoptedNode] | None = None,
            credentials: Credentials | None = None, contextualize: str = "tfcluster", token: str = "") -> dict:
    """The template's variables, every one checked (ConfigError names the configuration field)."""
    opts = _im().parse_options(spec.provider_options if options is None else options)
    if token and not re.fullmatch(r"[0-9a-f]{8,64}", token):
        raise ProvisionError("the RADL token must be hex")
    if contextualize not in CONTEXTUALIZE_MODES:
        raise ConfigError("contextualize", contextualize, "one of " + ", ".join(CONTEXTUALIZE_MODES))
    systems, roles = _systems(spec, opts, adopted, _ssh_user(credentials))
    return {
        "cluster": spec.cluster,
        "token": token,
        "summary": ", ".join(f"{spec.count(r)} {r}" for r in ROLES if spec.count(r)),
        "systems": systems,
        "roles": roles,
        "project_roles": PROJECT_ROLES,
        "node_total": sum(s["count"] for s in systems),
        "outports": _ssh_outports(spec, adopted),
        "tf_port": spec.network.tf_port,
        "tensorflow_version": spec.tensorflow.version,
        "roles_url": opts.roles_url or "",
        "wheelhouse_url": opts.wheelhouse_url or "",
        # without a wheelhouse the tensorflow role must use the node's package index (its "wheelhouse" source
        # refuses an empty URL)
        "tensorflow_source": "wheelhouse" if opts.wheelhouse_url else "index",
        "cloud_id": opts.cloud_id or "",
        "public_key": credentials.public_key.strip() if credentials and credentials.public_key else "",
        "private_key": credentials.private_key if credentials else "",
        "contextualize": contextualize,
        "max_ctxt_time": 3600,
    }


def _environment() -> jinja2.Environment:
    import jinja2  # here: every command imports this module (the IM provider's), few render RADL (~35 ms)

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(RADL_DIR)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def render(spec: RunSpec, options: dict[str, str] | None = None, *, adopted: list[AdoptedNode] | None = None,
           credentials: Credentials | None = None, contextualize: str = "tfcluster", token: str = "",
           template: str = TEMPLATE) -> str:
    """The RADL document of the run, validated (see :func:`validate`). Keys stay in the returned string only."""
    text = _environment().get_template(template).render(
        **context(spec, options, adopted=adopted, credentials=credentials, contextualize=contextualize,
                  token=token))
    validate(text)
    return text


def validate(text: str):
    """Parse and ``check()`` a RADL document as IM does; return the parsed RADL or raise ProvisionError."""
    from radl.radl import RADLParseException
    from radl.radl_parse import parse_radl

    try:
        parsed = parse_radl(text)
        if parsed is None:
            raise RADLParseException("empty document")
        parsed.check()
    except RADLParseException as exc:  # never echo the document: it may hold a key
        raise ProvisionError(f"rendered RADL is invalid: {exc}") from None
    return parsed


def main(argv: list[str] | None = None) -> int:
    """Print the RADL for a cluster file (for ``im_client create``); no keys are included."""
    from .config import load_file, resolve

    parser = argparse.ArgumentParser(prog="python -m tfcluster.radl_render", description=main.__doc__)
    parser.add_argument("-c", "--config", default="", help="cluster file (YAML) with provider: im")
    parser.add_argument("--contextualize", choices=CONTEXTUALIZE_MODES, default="im",
                        help="im: IM configures the nodes with the project's roles (default); "
                             "tfcluster: empty contextualize, as tfcluster sends it")
    args = parser.parse_args(argv)
    try:
        spec = resolve(load_file(args.config))
        user = spec.ssh.user or DEFAULT_CLOUD_USER
        sys.stdout.write(render(spec, credentials=Credentials(user), contextualize=args.contextualize))
        opts = spec.provider_options
        if args.contextualize == "im":
            for key in ("roles_url", "wheelhouse_url"):
                if not opts.get(key):
                    print(f"radl_render: note: provider_options.{key} is empty; it is {_im().options[key]}",
                          file=sys.stderr)
    except (ConfigError, ProvisionError) as exc:
        print(f"radl_render: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
