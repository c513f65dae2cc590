"""OpenStack: Nova servers made by ``terraform/openstack/`` (see its README).

Terraform's openstack provider does the work with a ``clouds.yaml`` entry (option ``cloud``, else
``OS_CLOUD`` / ``OS_*``); no OpenStack SDK is imported here. The module creates no object-store
credentials: the site's S3-compatible keys reach the nodes only through tfcluster's 0600
environment file. ``check`` refuses, before anything is created, what the module would refuse or
what cannot work: unknown options, no external network where one is needed, no SSH sources.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from ..config import ROLES, RunSpec
from ..errors import ConfigError
from ..tfsupport import DefaultImage
from .base import TerraformProvider, register


def _ipv4_cidr(value: str) -> bool:
    try:
        return ipaddress.ip_network(value, strict=False).version == 4
    except ValueError:
        return False


def _addresses(value: str) -> bool:
    try:
        for item in value.split(","):
            if item.strip():
                ipaddress.ip_address(item.strip())
    except ValueError:
        return False
    return True


def _name(value: str) -> bool:
    return len(value) <= 255 and "\n" not in value and "\r" not in value


#: option -> (is the value acceptable?, what is allowed); mirrors terraform/openstack/variables.tf
_CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "cloud": (_name, "a clouds.yaml entry name"),
    "region": (_name, "a region name"),
    "external_network": (_name, "the name of the site's external network"),
    "network": (_name, "'' or the name of an existing network"),
    "subnet_cidr": (_ipv4_cidr, "an IPv4 CIDR block such as 10.20.0.0/24"),
    "dns_nameservers": (_addresses, "comma-separated IP addresses such as 192.0.2.53,192.0.2.54"),
    "floating_ip": (lambda v: v in ("true", "false"), "true or false"),
    "flavor": (lambda v: _name(v) and " " not in v, "a flavor name"),
    # RE2 (Terraform's) and Python's re differ (e.g. a later '(?i)'): the module validates it.
    "image_regex": (_name, "a regular expression (RE2) matched against image names"),
    "availability_zone": (_name, "a Nova availability zone"),
    "volume_size_gb": (lambda v: v.isdigit() and int(v) <= 65536,
                       "0 (the flavor's root disk) or a whole number of GB up to 65536 (boot from a volume)"),
}


@register
class OpenstackProvider(TerraformProvider):
    """Nova servers on ports that carry only the cluster's security group."""

    name = "openstack"
    requires_ssh_cidrs = True
    halts_vm = True
    default_image = DefaultImage("Debian 12 (the newest Glance image matching provider_options.image_regex)",
                                 "3.11", "debian")
    unsupported = {
        "spot": "Nova has no spot or preemptible market",
        "run_limit": "OpenStack has no server-side run limit: nodes power themselves off at max_runtime_minutes "
                     "and stay allocated (SHUTOFF) until `make down`",
    }
    options = {
        "cloud": "clouds.yaml entry ('' = OS_CLOUD or the OS_* variables)",
        "region": "region ('' = the cloud's)",
        "external_network": "external network: router gateway and floating-IP pool (required unless network is "
                            "given and floating_ip is false)",
        "network": "existing network name ('' = create one routed to external_network)",
        "subnet_cidr": "range of a created subnet (default 10.20.0.0/24)",
        "dns_nameservers": "comma-separated resolvers for a created subnet ('' = the site's)",
        "floating_ip": "a floating IP per node, what the controller SSHes to (default true)",
        "flavor": "flavor of roles without nodes.<role>.instance_type (default m1.large)",
        "image_regex": "default image lookup, most recent name match (default ^(?i)debian[ -]?12([^0-9]|$): Debian 12)",
        "availability_zone": "Nova availability zone ('' = the cloud's)",
        "volume_size_gb": "0 = boot from the flavor's disk (default); N = boot from a new N GB volume",
    }

    def check(self, spec: RunSpec) -> None:
        super().check(spec)
        opts = spec.provider_options
        for key, value in opts.items():
            ok, allowed = _CHECKS[key]
            if not ok(value):
                raise ConfigError(f"provider_options.{key}", value, allowed)
        floating = opts.get("floating_ip", "true") == "true"
        if not opts.get("external_network") and (floating or not opts.get("network")):
            raise ConfigError("provider_options.external_network", opts.get("external_network"),
                              "the name of the site's external network (required on openstack unless "
                              "provider_options.network names an existing network and floating_ip is false)")
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
        return dict(spec.provider_options)
