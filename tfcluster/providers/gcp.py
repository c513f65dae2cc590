"""Google Cloud: Compute Engine nodes made by ``terraform/gcp/`` (see its README).

Terraform's google provider does the work with the Application Default Credentials of whoever runs
tfcluster; no Google SDK is imported here. ``check`` refuses, before anything is created, what the
module would refuse or what cannot work: unknown options, a missing project, no SSH sources.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from ..config import ROLES, RunSpec
from ..errors import ConfigError
from ..tfsupport import DefaultImage
from .base import TerraformProvider, register

#: machine-type families that come with their own GPUs (no guest accelerators attached)
ACCELERATOR_OPTIMIZED = ("a2-", "a3-", "a4-", "g2-", "g4-")
#: GPU counts Compute Engine attaches to one VM
GPU_COUNTS = (1, 2, 4, 8, 16)
DEFAULT_ZONE = "us-central1-a"
GCS_S3_ENDPOINT = "https://storage.googleapis.com"

_PROJECT_RE = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_ZONE_RE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
_REGION_RE = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_NETWORK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9/_.:-]*")
_SA_RE = re.compile(r"[a-z0-9._-]+@[a-z0-9.-]+\.gserviceaccount\.com")
_GPU_TYPE_RE = re.compile(r"nvidia-[a-z0-9-]+")
_DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd", "hyperdisk-balanced")


def _ipv4_cidr(value: str) -> bool:
    try:
        return ipaddress.ip_network(value, strict=False).version == 4
    except ValueError:
        return False


def _whole(lo: int, hi: int) -> Callable[[str], bool]:
    return lambda v: v.isdigit() and lo <= int(v) <= hi


#: option -> (is the value acceptable?, what is allowed); mirrors the validations in terraform/gcp/variables.tf
_CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "project": (lambda v: bool(_PROJECT_RE.fullmatch(v)),
                "a GCP project id: 6-30 characters, lowercase letters, digits and '-', starting with a letter"),
    "zone": (lambda v: bool(_ZONE_RE.fullmatch(v)), "a Compute Engine zone such as us-central1-a"),
    "region": (lambda v: v == "" or bool(_REGION_RE.fullmatch(v)), "a region such as us-central1"),
    "network": (lambda v: v == "" or bool(_NETWORK_RE.fullmatch(v)), "'' or a VPC network name or self link"),
    "subnetwork": (lambda v: v == "" or bool(_NETWORK_RE.fullmatch(v)), "'' or a subnetwork name or self link"),
    "subnet_cidr": (_ipv4_cidr, "an IPv4 CIDR block such as 10.20.0.0/24"),
    "service_account_email": (lambda v: v == "" or bool(_SA_RE.fullmatch(v)),
                              "'' (create one) or a service account e-mail ending in .gserviceaccount.com"),
    "preemptible": (lambda v: v in ("true", "false"), "true or false"),
    "public_ip": (lambda v: v in ("true", "false"), "true or false"),
    "network_has_nat": (lambda v: v in ("true", "false"), "true or false"),
    "disk_size_gb": (_whole(10, 65536), "a whole number of GB from 10 to 65536"),
    "disk_type": (lambda v: v in _DISK_TYPES, "one of " + ", ".join(_DISK_TYPES)),
    "gpu_type": (lambda v: bool(_GPU_TYPE_RE.fullmatch(v)), "an accelerator type such as nvidia-tesla-t4 or nvidia-l4"),
}


def require_ssh_sources(spec: RunSpec, provider: str, ipv4_only: bool) -> None:
    """IPv4-only SSH sources and no root login (that there are sources at all, the base class checks)."""
    cidrs = spec.network.allowed_ssh_cidrs
    if ipv4_only:
        for cidr in cidrs:
            if ipaddress.ip_network(cidr, strict=False).version != 4:
                raise ConfigError("network.allowed_ssh_cidrs", cidr,
                                  f"IPv4 CIDR blocks on {provider} (its nodes have IPv4 addresses only)")
    if spec.ssh.user == "root":
        raise ConfigError("ssh.user", "root", f"'' or a user other than root on {provider} "
                          "(cloud images refuse root logins)")


@register
class GcpProvider(TerraformProvider):
    """Compute Engine VMs with a tag-scoped firewall and a bucket-only service account."""

    name = "gcp"
    requires_ssh_cidrs = True
    halts_vm = True
    default_image = DefaultImage("Debian 12 (image family debian-cloud/debian-12)", "3.11", "debian")
    unsupported = {"ipv6": "the VMs get IPv4 addresses only, so SSH sources must be IPv4 CIDR blocks"}
    options = {
        "project": "GCP project id (required)",
        "zone": f"zone of every VM (default {DEFAULT_ZONE})",
        "region": "region of a created subnetwork (default: the zone's region)",
        "network": "existing VPC network, name or self link ('' = create tfcluster-<cluster>)",
        "subnetwork": "existing subnetwork, name or self link (needs network)",
        "subnet_cidr": "range of a created subnetwork (default 10.20.0.0/24)",
        "service_account_email": "existing service account for the VMs ('' = create one with object access "
                                 "to the bucket only; an existing one is granted nothing)",
        "preemptible": "true = Spot VMs (default false)",
        "public_ip": "an ephemeral external address per VM (default true); false needs network and network_has_nat",
        "network_has_nat": '"true": the given network routes VMs without external addresses to the internet '
                           "(Cloud NAT in the zone's region); required with public_ip false",
        "disk_size_gb": "boot disk size in GB (default 50)",
        "disk_type": "boot disk type (default pd-balanced)",
        "gpu_type": "accelerator type attached to N1 machine types (default nvidia-tesla-t4)",
    }

    def check(self, spec: RunSpec) -> None:
        super().check(spec)
        opts = spec.provider_options
        if not opts.get("project"):
            raise ConfigError("provider_options.project", opts.get("project"),
                              "a GCP project id (required on gcp), e.g. --set provider_options.project=my-project")
        for key, value in opts.items():
            ok, allowed = _CHECKS[key]
            if not ok(value):
                raise ConfigError(f"provider_options.{key}", value, allowed)
        zone = opts.get("zone", DEFAULT_ZONE)
        if opts.get("region") and not zone.startswith(opts["region"] + "-"):
            raise ConfigError("provider_options.region", opts["region"],
                              f"'' or the region of zone {zone} ({zone.rsplit('-', 1)[0]})")
        if opts.get("subnetwork") and not opts.get("network"):
            raise ConfigError("provider_options.subnetwork", opts["subnetwork"],
                              "a subnetwork together with provider_options.network (the firewall attaches to it)")
        if opts.get("public_ip") == "false":
            self._check_private_nodes(opts)
        require_ssh_sources(spec, self.name, ipv4_only=True)
        if spec.storage.endpoint == "auto":  # 'auto' means AWS S3 off the local provider
            raise ConfigError("storage.endpoint", "auto",
                              f"{GCS_S3_ENDPOINT} on gcp (Cloud Storage's S3-compatible API; HMAC keys in "
                              "storage.credentials_file) or the URL of another S3-compatible store")
        for role in ROLES:
            if spec.count(role):
                self._check_gpus(spec, role)

    @staticmethod
    def _check_private_nodes(opts: dict[str, str]) -> None:
        """public_ip false: the nodes must still reach apt and PyPI (configuration installs from both)."""
        reason = ("without an external address a VM reaches apt and PyPI only through Cloud NAT (Private Google "
                  "Access reaches Cloud Storage only), and the created network has none")
        if not opts.get("network"):
            raise ConfigError("provider_options.public_ip", "false",
                              f"true, or false with an existing provider_options.network that has Cloud NAT ({reason})")
        if opts.get("network_has_nat") != "true":
            raise ConfigError("provider_options.network_has_nat", opts.get("network_has_nat", ""),
                              '"true" with public_ip false: state that network ' + opts["network"] + " has Cloud NAT "
                              "in the zone's region (without it the nodes cannot install packages; the controller "
                              "must also reach their internal addresses)")

    @staticmethod
    def _check_gpus(spec: RunSpec, role: str) -> None:
        gpus = spec.nodes[role].gpus
        machine = spec.nodes[role].instance_type
        bundled = machine.startswith(ACCELERATOR_OPTIMIZED)
        if gpus and gpus not in GPU_COUNTS:
            raise ConfigError(f"nodes.{role}.gpus", gpus, "0, 1, 2, 4, 8 or 16 on gcp")
        if gpus and machine and not (machine.startswith("n1-") or bundled):
            raise ConfigError(f"nodes.{role}.instance_type", machine,
                              "for a role with GPUs: an N1 machine type (GPUs attached as guest accelerators) or "
                              "an accelerator-optimized one (a2-, a3-, a4-, g2-, g4-), or '' for n1-standard-8")
        if bundled and not gpus:
            raise ConfigError(f"nodes.{role}.gpus", gpus,
                              f"the number of GPUs machine type {machine} comes with (it has GPUs)")

    def provider_options(self, spec: RunSpec) -> dict[str, str]:
        """The user's options as they are: the module holds the defaults (see its README)."""
        return dict(spec.provider_options)
