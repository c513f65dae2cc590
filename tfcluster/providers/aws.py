"""Amazon EC2 through ``terraform/aws/``: instances per role, a locked-down security group, an S3-only role.

Credentials come from the AWS standard chain alone (environment, shared config/credentials files, an
instance role): nothing here reads, writes or passes a key. boto3 is imported only to look for leftovers.
"""

from __future__ import annotations

import json
import re

from pydantic import Field, model_validator

from ..config import ROLES, Checked, RunSpec, ipv4_network_check, matching_check, true_false_check, whole_number_check
from ..errors import ConfigError
from ..tfsupport import DefaultImage
from .base import ProviderOptions, TerraformProvider, register

_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_AZ_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_VPC_RE = re.compile(r"^vpc-[0-9a-f]{8}([0-9a-f]{9})?$")
_SUBNET_RE = re.compile(r"^subnet-[0-9a-f]{8}([0-9a-f]{9})?$")
_AMI_RE = re.compile(r"^ami-[0-9a-f]{8}([0-9a-f]{9})?$")
_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_ENDPOINT_RE = re.compile(r"^https?://[A-Za-z0-9.:\[\]-]+(:\d{1,5})?/?$")

#: the tag every resource of a cluster carries (also what ``leftovers`` looks for)
CLUSTER_TAG = "tfcluster:cluster"

_Switch = Checked(true_false_check) | None


class AwsOptions(ProviderOptions):
    """provider_options on aws (mirrors the validations of terraform/aws/variables.tf)."""

    region: Checked(matching_check(_REGION_RE, "an AWS region name such as us-east-1 or eu-west-3")) | None = \
        Field(None, description="AWS region of the nodes (default: storage.region)")
    vpc_id: Checked(matching_check(_VPC_RE, "a VPC id such as vpc-0123456789abcdef0")) | None = Field(
        None, description="an existing VPC; needs subnet_id (only checked against the subnet's VPC)")
    subnet_id: Checked(matching_check(_SUBNET_RE, "a subnet id such as subnet-0123456789abcdef0")) | None = Field(
        None, description="an existing subnet for the nodes (default: a small VPC, subnet, internet gateway and "
                          "route are created)")
    vpc_cidr: Checked(ipv4_network_check("an IPv4 network from /16 to /24 in canonical form, e.g. 10.42.0.0/16",
                                         prefixlen=(16, 24), canonical=True)) | None = Field(
        None, description="network of the created VPC, /16 to /24 (default 10.42.0.0/16; its first /24 is the "
                          "subnet)")
    availability_zone: Checked(matching_check(_AZ_RE, "an availability zone name such as us-east-1a")) | None = \
        Field(None, description="zone of the created subnet (default: the first zone offering every instance type)")
    associate_public_ip: _Switch = Field(
        None, description='"true"/"false": public addresses for SSH from the controller (default: a created subnet '
                          "gives them, a given subnet keeps its own setting)")
    subnet_has_nat: _Switch = Field(
        None, description='"true": the given subnet routes instances without public addresses to the internet '
                          "(a NAT gateway or instance); required with associate_public_ip false")
    spot: _Switch = Field(
        None, description='"true"/"false": one-time spot instances that terminate on interruption (default "false")')
    root_volume_gb: Checked(whole_number_check(8, 16384, "a whole number of GiB from 8 to 16384")) | None = Field(
        None, description="root volume size in GiB, 8-16384 (default 50; gp3, encrypted)")
    endpoint: Checked(matching_check(_ENDPOINT_RE, "an http(s)://host[:port] URL of an AWS API emulator "
                                                   "(tests only)")) | None = Field(
        None, description="URL of an AWS API emulator (moto) for ec2, iam, sts and s3; tests only")

    @model_validator(mode="after")
    def _network_rules(self) -> AwsOptions:
        """The network options that go together (a given subnet, or a created VPC; private nodes need NAT)."""
        if self.vpc_id and not self.subnet_id:
            raise ConfigError("provider_options.vpc_id", self.vpc_id,
                              "only together with provider_options.subnet_id (the subnet the nodes go into); "
                              "give neither to create a small VPC")
        if self.subnet_id:
            for key in ("vpc_cidr", "availability_zone"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"provider_options.{key}", getattr(self, key),
                                      "nothing when provider_options.subnet_id is given (the subnet decides)")
        if self.associate_public_ip == "false":
            reason = ("without a public address an instance reaches apt and PyPI only through a NAT gateway, "
                      "which the created network does not have")
            if not self.subnet_id:
                raise ConfigError("provider_options.associate_public_ip", "false",
                                  '"true" or unset, or "false" with a provider_options.subnet_id that has NAT '
                                  f"({reason})")
            if self.subnet_has_nat != "true":
                raise ConfigError("provider_options.subnet_has_nat", self.subnet_has_nat or "",
                                  '"true" with associate_public_ip "false": state that subnet '
                                  f"{self.subnet_id} routes to the internet through NAT (without it the nodes "
                                  "cannot install packages; the controller must also reach their private addresses)")
        return self


@register
class AwsProvider(TerraformProvider):
    name = "aws"
    requires_ssh_cidrs = True
    halts_vm = True
    preemption_notice = "aws"   # a spot instance's interruption notice, in the instance metadata
    halt_effect = "the instance terminates (its shutdown behaviour)"
    limits_storage_access = True
    default_image = DefaultImage("Debian 12 (official AMI of account 136693071363, amd64 or arm64)", "3.11", "admin")
    options_model = AwsOptions
    unsupported = {
        "network.subnet": "it names the local provider's bridge network; on aws use provider_options.subnet_id "
                          "(an existing subnet) or provider_options.vpc_cidr (the created VPC)",
    }

    def check(self, spec: RunSpec) -> None:
        """Refuse what terraform/aws cannot do, before anything is created (ConfigError, exit 2)."""
        super().check(spec)
        if spec.network.subnet != "auto":
            raise ConfigError("network.subnet", spec.network.subnet,
                              f"'auto' on aws ({self.unsupported['network.subnet']})")
        for role in ROLES:
            itype = spec.nodes[role].instance_type
            if itype and not _TYPE_RE.fullmatch(itype):
                raise ConfigError(f"nodes.{role}.instance_type", itype,
                                  "'' (the role's default) or an EC2 instance type such as c6i.xlarge")
            image = spec.nodes[role].image
            if image and not _AMI_RE.fullmatch(image):
                raise ConfigError(f"nodes.{role}.image", image,
                                  "'' (Debian 12, the official AMI) or an AMI id such as ami-0123456789abcdef0")

    #: each role's AMI found by baked_images (set by up): a baked image of the configuration's content key
    baked: dict[str, str] | None = None

    def baked_images(self, spec: RunSpec) -> dict[str, str]:
        """For each role whose nodes.<role>.image is '': the newest baked AMI (tfcluster.providers.aws_image)
        tagged with the role's content key, or '' (the module's Debian AMI)."""
        from . import aws_image

        ec2 = aws_image.ec2_client(spec)
        found = {}
        for role in ROLES:
            if spec.count(role) and not spec.nodes[role].image:
                found[role] = aws_image.find_ami(ec2, aws_image.inputs_for(spec, ec2, role).key) or ""
        return found

    def image_keys(self, spec: RunSpec) -> dict[str, str]:
        from . import aws_image

        try:
            ec2 = aws_image.ec2_client(spec)
            return {role: aws_image.inputs_for(spec, ec2, role).key for role in ROLES if spec.count(role)}
        except Exception as exc:   # no base AMI to compare with: the roles run (and only check on a baked AMI)
            from ..cluster import say

            say(f"warning: the baked AMI's key could not be computed ({type(exc).__name__}: {exc}); "
                "configure runs the image roles on every node")
            return {}

    def plan_blocker(self, spec: RunSpec) -> str:
        """AWS credentials, where the standard chain finds none: Terraform's plan reads the account (the AMI, the
        caller), so without them it fails; plan shows the module's inputs and resources instead."""
        if aws_credentials_found():
            return ""
        return ("it needs AWS credentials, and the standard chain finds none here (the environment, the shared "
                "config and credentials files, an instance role); 'make up' needs them too")

    def inputs(self, spec: RunSpec, public_key: str) -> dict:
        inputs = super().inputs(spec, public_key)
        if self.baked:
            inputs["images"] = {r: spec.nodes[r].image or self.baked.get(r, "") for r in ROLES}
        return inputs

    def up(self, spec: RunSpec, public_key: str):
        self.baked = self.baked_images(spec)
        return super().up(spec, public_key)

    def provider_options(self, spec: RunSpec) -> dict[str, str]:
        """The user's options as strings for the module; the region defaults to the bucket's."""
        opts = self.options_for(spec).model_dump(exclude_none=True)
        opts.setdefault("region", spec.storage.region)
        return opts

    # -- proving nothing remains ------------------------------------------------------------------
    def _root_inputs(self) -> dict | None:
        root = self.state.terraform_dir / "main.tf.json"
        if not root.exists():
            return None
        try:
            return json.loads(root.read_text())["module"]["cluster"]
        except (ValueError, KeyError):
            return None

    def leftovers(self) -> list[str]:
        """Terraform's state, then the cloud itself: anything tagged with this cluster still there."""
        found = super().leftovers()
        inputs = self._root_inputs()
        if inputs is None:  # no root was ever written: nothing was created
            return found
        return found + cloud_leftovers(inputs.get("cluster_name", self.state.cluster),
                                       inputs.get("provider_options") or {})


def aws_credentials_found() -> bool:
    """Whether the AWS standard chain (what Terraform's provider reads too) finds credentials; a profile it cannot
    read counts as found, so that Terraform says what is wrong with it."""
    import botocore.session
    from botocore.exceptions import BotoCoreError

    try:
        return botocore.session.get_session().get_credentials() is not None
    except BotoCoreError:
        return True


def cloud_leftovers(cluster: str, opts: dict[str, str]) -> list[str]:
    """What of ``cluster`` AWS still has (instances not terminated, security groups, key pair, VPC, IAM)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    region = opts.get("region", "us-east-1")
    kwargs = {"region_name": region,
              "config": Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 3})}
    if opts.get("endpoint"):
        kwargs["endpoint_url"] = opts["endpoint"].rstrip("/")
    tag = [{"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]}]
    found = []
    try:
        ec2 = boto3.client("ec2", **kwargs)
        alive = ["pending", "running", "shutting-down", "stopping", "stopped"]
        for res in ec2.describe_instances(Filters=tag + [{"Name": "instance-state-name", "Values": alive}])[
                "Reservations"]:
            for inst in res["Instances"]:
                found.append(f"instance {inst['InstanceId']} ({inst['State']['Name']})")
        for sg in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]:
            found.append(f"security group {sg['GroupId']} ({sg['GroupName']})")
        for kp in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]:
            found.append(f"key pair {kp['KeyName']}")
        for vpc in ec2.describe_vpcs(Filters=tag)["Vpcs"]:
            found.append(f"VPC {vpc['VpcId']}")
        iam = boto3.client("iam", **kwargs)
        name = f"tfcluster-{cluster}-{region}"
        for what, call, key in (("IAM role", iam.get_role, "RoleName"),
                                ("IAM instance profile", iam.get_instance_profile, "InstanceProfileName")):
            try:
                call(**{key: name})
                found.append(f"{what} {name}")
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchEntity":
                    raise
    except (BotoCoreError, ClientError) as exc:
        found.append(f"could not check AWS ({region}) for what is left of cluster {cluster}: {exc}")
    return found
