"""OpenStack: Nova servers made by ``terraform/openstack/`` (see its README).

Terraform's openstack provider does the work with a ``clouds.yaml`` entry (option ``cloud``, else
``OS_CLOUD`` / ``OS_*``); no OpenStack SDK is imported here. The module creates no object-store
credentials: the site's S3-compatible keys reach the nodes only through tfcluster's 0600
environment file. ``check`` refuses, before anything is created, what the module would refuse or
what cannot work: unknown options, no external network where one is needed, no SSH sources.
"""

from __future__ import annotations

import ipaddress

from pydantic import Field, model_validator

from ..config import ROLES, Checked, RunSpec, ipv4_network_check, refuse, true_false_check, whole_number_check
from ..errors import ConfigError
from ..tfsupport import DefaultImage
from .base import ProviderOptions, TerraformProvider, register


def _addresses(value):
    try:
        for item in value.split(","):
            if item.strip():
                ipaddress.ip_address(item.strip())
    except ValueError:
        refuse("comma-separated IP addresses such as 192.0.2.53,192.0.2.54")
    return value


def name_check(allowed: str, spaces: bool = True):
    """A single-line name of at most 255 characters (the module's rule), without spaces unless ``spaces``."""

    def check(value):
        if len(value) > 255 or "\n" in value or "\r" in value or (not spaces and " " in value):
            refuse(allowed)
        return value

    return check


class OpenstackOptions(ProviderOptions):
    """provider_options on openstack (mirrors the validations of terraform/openstack/variables.tf)."""

    cloud: Checked(name_check("a clouds.yaml entry name")) | None = Field(
        None, description="clouds.yaml entry ('' = OS_CLOUD or the OS_* variables)")
    region: Checked(name_check("a region name")) | None = Field(None, description="region ('' = the cloud's)")
    external_network: Checked(name_check("the name of the site's external network")) | None = Field(
        None, description="external network: router gateway and floating-IP pool (required unless network is "
                          "given and floating_ip is false)")
    network: Checked(name_check("'' or the name of an existing network")) | None = Field(
        None, description="existing network name ('' = create one routed to external_network)")
    subnet_cidr: Checked(ipv4_network_check("an IPv4 CIDR block such as 10.20.0.0/24")) | None = Field(
        None, description="range of a created subnet (default 10.20.0.0/24)")
    dns_nameservers: Checked(_addresses) | None = Field(
        None, description="comma-separated resolvers for a created subnet ('' = the site's)")
    floating_ip: Checked(true_false_check) | None = Field(
        None, description="a floating IP per node, what the controller SSHes to (default true)")
    flavor: Checked(name_check("a flavor name", spaces=False)) | None = Field(
        None, description="flavor of roles without nodes.<role>.instance_type (default m1.large)")
    # RE2 (Terraform's) and Python's re differ (e.g. a later '(?i)'): the module validates it.
    image_regex: Checked(name_check("a regular expression (RE2) matched against image names")) | None = Field(
        None, description="default image lookup, most recent name match (default ^(?i)debian[ -]?12([^0-9]|$): "
                          "Debian 12)")
    availability_zone: Checked(name_check("a Nova availability zone")) | None = Field(
        None, description="Nova availability zone ('' = the cloud's)")
    volume_size_gb: Checked(whole_number_check(0, 65536, "0 (the flavor's root disk) or a whole number of GB up "
                                                         "to 65536 (boot from a volume)")) | None = Field(
        None, description="0 = boot from the flavor's disk (default); N = boot from a new N GB volume")

    @model_validator(mode="after")
    def _external_network(self) -> OpenstackOptions:
        """An external network, unless the nodes go on an existing network without floating IPs."""
        floating = (self.floating_ip or "true") == "true"
        if not self.external_network and (floating or not self.network):
            raise ConfigError("provider_options.external_network", self.external_network,
                              "the name of the site's external network (required on openstack unless "
                              "provider_options.network names an existing network and floating_ip is false)")
        return self


@register
class OpenstackProvider(TerraformProvider):
    """Nova servers on ports that carry only the cluster's security group."""

    name = "openstack"
    requires_ssh_cidrs = True
    halts_vm = True
    halt_effect = "the server powers off and stays allocated (SHUTOFF) until 'make down'"
    plan_needs = "the terraform-provider-openstack/openstack provider and the site's credentials (clouds.yaml)"
    default_image = DefaultImage("Debian 12 (the newest Glance image matching provider_options.image_regex)",
                                 "3.11", "debian")
    unsupported = {
        "spot": "Nova has no spot or preemptible market",
        "run_limit": "OpenStack has no server-side run limit: nodes power themselves off at max_runtime_minutes "
                     "and stay allocated (SHUTOFF) until `make down`",
    }
    options_model = OpenstackOptions

    def check(self, spec: RunSpec) -> None:
        super().check(spec)
        if spec.ssh.user == "root":
            raise ConfigError("ssh.user", "root", "'' or a user other than root on openstack "
                              "(cloud images refuse root logins)")
        if spec.storage.endpoint == "auto":
            raise ConfigError("storage.endpoint", "auto",
                              "the http(s) URL of the site's S3-compatible object store on openstack "
                              "(Swift s3api, Ceph RGW); its keys in storage.credentials_file")
        for role in ROLES:
            if spec.count(role) and spec.nodes[role].gpus and not spec.nodes[role].instance_type:
                raise ConfigError(f"nodes.{role}.instance_type", "",
                                  "a GPU flavor of the site for a role with GPUs on openstack "
                                  "(GPUs come with the flavor: PCI passthrough or vGPU)")

    def provider_options(self, spec: RunSpec) -> dict[str, str]:
        """The user's options as they are: the module holds the defaults (see its README)."""
        return self.options_for(spec).model_dump(exclude_none=True)
