"""Google Cloud: Compute Engine nodes made by ``terraform/gcp/`` (see its README).

Terraform's google provider does the work with the Application Default Credentials of whoever runs
tfcluster; no Google SDK is imported here. ``check`` refuses, before anything is created, what the
module would refuse or what cannot work: unknown options, a missing project, no SSH sources.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import Field, model_validator

from ..config import (
    ROLES,
    Checked,
    RunSpec,
    choice_check,
    ipv4_network_check,
    matching_check,
    true_false_check,
    whole_number_check,
)
from ..errors import MISSING, ConfigError
from ..tfsupport import DefaultImage
from .base import ProviderOptions, TerraformProvider, register

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


_Switch = Checked(true_false_check) | None


class GcpOptions(ProviderOptions):
    """provider_options on gcp (mirrors the validations of terraform/gcp/variables.tf)."""

    project: Checked(matching_check(_PROJECT_RE, "a GCP project id: 6-30 characters, lowercase letters, digits "
                                                 "and '-', starting with a letter")) | None = Field(
        None, description="GCP project id (required)")
    zone: Checked(matching_check(_ZONE_RE, "a Compute Engine zone such as us-central1-a")) | None = Field(
        None, description=f"zone of every VM (default {DEFAULT_ZONE})")
    region: Checked(matching_check(_REGION_RE, "a region such as us-central1", optional=True)) | None = Field(
        None, description="region of a created subnetwork (default: the zone's region)")
    network: Checked(matching_check(_NETWORK_RE, "'' or a VPC network name or self link", optional=True)) | None = \
        Field(None, description="existing VPC network, name or self link ('' = create tfcluster-<cluster>)")
    subnetwork: Checked(matching_check(_NETWORK_RE, "'' or a subnetwork name or self link", optional=True)) | None = \
        Field(None, description="existing subnetwork, name or self link (needs network)")
    subnet_cidr: Checked(ipv4_network_check("an IPv4 CIDR block such as 10.20.0.0/24")) | None = Field(
        None, description="range of a created subnetwork (default 10.20.0.0/24)")
    service_account_email: Checked(matching_check(_SA_RE, "'' (create one) or a service account e-mail ending in "
                                                          ".gserviceaccount.com", optional=True)) | None = Field(
        None, description="existing service account for the VMs ('' = create one limited to the cluster's runs and "
                          "its data; an existing one is granted nothing)")
    preemptible: _Switch = Field(None, description="true = Spot VMs (default false)")
    public_ip: _Switch = Field(None, description="an ephemeral external address per VM (default true); false needs "
                                                 "network and network_has_nat")
    network_has_nat: _Switch = Field(
        None, description='"true": the given network routes VMs without external addresses to the internet '
                          "(Cloud NAT in the zone's region); required with public_ip false")
    disk_size_gb: Checked(whole_number_check(10, 65536, "a whole number of GB from 10 to 65536")) | None = Field(
        None, description="boot disk size in GB (default 50)")
    disk_type: Checked(choice_check(*_DISK_TYPES)) | None = Field(None, description="boot disk type (default "
                                                                                   "pd-balanced)")
    gpu_type: Checked(matching_check(_GPU_TYPE_RE, "an accelerator type such as nvidia-tesla-t4 or nvidia-l4")) | \
        None = Field(None, description="accelerator type attached to N1 machine types (default nvidia-tesla-t4)")

    @model_validator(mode="after")
    def _together(self) -> GcpOptions:
        """The project is required; region, subnetwork and private nodes must fit the other options."""
        if not self.project:
            raise ConfigError("provider_options.project", MISSING if self.project is None else self.project,
                              "a GCP project id (required on gcp), e.g. --set provider_options.project=my-project")
        zone = self.zone or DEFAULT_ZONE
        if self.region and not zone.startswith(self.region + "-"):
            raise ConfigError("provider_options.region", self.region,
                              f"'' or the region of zone {zone} ({zone.rsplit('-', 1)[0]})")
        if self.subnetwork and not self.network:
            raise ConfigError("provider_options.subnetwork", self.subnetwork,
                              "a subnetwork together with provider_options.network (the firewall attaches to it)")
        if self.public_ip == "false":  # the nodes must still reach apt and PyPI (configuration installs from both)
            reason = ("without an external address a VM reaches apt and PyPI only through Cloud NAT (Private Google "
                      "Access reaches Cloud Storage only), and the created network has none")
            if not self.network:
                raise ConfigError("provider_options.public_ip", "false", "true, or false with an existing "
                                  f"provider_options.network that has Cloud NAT ({reason})")
            if self.network_has_nat != "true":
                raise ConfigError("provider_options.network_has_nat", self.network_has_nat or "",
                                  f'"true" with public_ip false: state that network {self.network} has Cloud NAT '
                                  "in the zone's region (without it the nodes cannot install packages; the "
                                  "controller must also reach their internal addresses)")
        return self


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
    """Compute Engine VMs with a tag-scoped firewall and a service account limited to the cluster's runs and
    its data."""

    name = "gcp"
    preemption_notice = "gcp"   # a spot / preemptible VM's notice, in the instance metadata
    requires_ssh_cidrs = True
    halts_vm = True
    halt_effect = ("the VM powers off; Compute Engine deletes it when its max_run_duration (the boot-time halt's "
                   "minutes) has passed")
    plan_needs = "the hashicorp/google provider and Google Cloud credentials (Application Default Credentials)"
    limits_storage_access = True
    default_image = DefaultImage("Debian 12 (image family debian-cloud/debian-12)", "3.11", "debian")
    unsupported = {"ipv6": "the VMs get IPv4 addresses only, so SSH sources must be IPv4 CIDR blocks"}
    options_model = GcpOptions

    def check(self, spec: RunSpec) -> None:
        super().check(spec)
        require_ssh_sources(spec, self.name, ipv4_only=True)
        if spec.storage.endpoint == "auto":  # 'auto' means AWS S3 off the local provider
            raise ConfigError("storage.endpoint", "auto",
                              f"{GCS_S3_ENDPOINT} on gcp (Cloud Storage's S3-compatible API; HMAC keys in "
                              "storage.credentials_file) or the URL of another S3-compatible store")
        for role in ROLES:
            if spec.count(role):
                self._check_gpus(spec, role)

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
        return self.options_for(spec).model_dump(exclude_none=True)
