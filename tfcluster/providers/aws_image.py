"""Baked AMIs: the node image of :mod:`tfcluster.baked` on AWS.

The same :func:`tfcluster.baked.bake` drives it as the local image: :class:`AwsBuilder` starts an instance of
the base AMI (the Debian 12 AMI ``terraform/aws`` would pick), the image roles are applied to it over SSH,
``CreateImage`` makes the AMI, which is tagged with the content key (:data:`KEY_TAG`), and the builder is
terminated. ``up`` looks the AMI up by that tag (:func:`find_ami`) and gives it to the module for every role
whose ``nodes.<role>.image`` is '' (:meth:`tfcluster.providers.aws.AwsProvider.baked_images`); none found:
the Debian AMI, configured from bare as before.

On the AWS API emulator of the tests (moto) an instance never boots, so the SSH step cannot run there: the
tests drive the builder's launch, capture (CreateImage, tags), the look-up and the module's use of the AMI.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import baked
from ..config import RunSpec
from ..errors import TfclusterError
from ..paths import ClusterState
from .base import Node

#: tags of a baked AMI: its content key (what ``up`` looks for) and what it holds
KEY_TAG = "tfcluster:image-key"
NAME_TAG = "tfcluster:image"
#: the Debian cloud team's account: the base AMIs (as terraform/aws's aws_ami data source)
DEBIAN_OWNER = "136693071363"
_ARCH = {"x86_64": "amd64", "arm64": "arm64"}


def ec2_client(spec: RunSpec):
    import boto3
    from botocore.config import Config

    opts = spec.provider_options or {}
    kwargs = {"region_name": opts.get("region") or spec.storage.region,
              "config": Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3})}
    if opts.get("endpoint"):
        kwargs["endpoint_url"] = str(opts["endpoint"]).rstrip("/")
    return boto3.client("ec2", **kwargs)


def base_ami(ec2, arch: str = "x86_64") -> str:
    """The newest Debian 12 AMI of the architecture (the filter terraform/aws's aws_ami data source uses)."""
    images = ec2.describe_images(Owners=[DEBIAN_OWNER], Filters=[
        {"Name": "name", "Values": [f"debian-12-{_ARCH[arch]}-*"]},
        {"Name": "virtualization-type", "Values": ["hvm"]}])["Images"]
    if not images:
        raise TfclusterError(f"no Debian 12 {arch} AMI of account {DEBIAN_OWNER} in this region")
    return max(images, key=lambda i: i.get("CreationDate", ""))["ImageId"]


def inputs_for(spec: RunSpec, ec2, role: str, arch: str = "x86_64") -> baked.Inputs:
    """A role's image inputs on AWS: nodes read the package index (no wheelhouse), the base is an AMI."""
    return baked.inputs_for(spec, spec.nodes[role].gpus, base_ami(ec2, arch), source="index", arch=arch)


def find_ami(ec2, key: str) -> str | None:
    """The newest available AMI of this account tagged with the content key, or None."""
    images = ec2.describe_images(Owners=["self"], Filters=[
        {"Name": f"tag:{KEY_TAG}", "Values": [key]}, {"Name": "state", "Values": ["available"]}])["Images"]
    return max(images, key=lambda i: i.get("CreationDate", ""))["ImageId"] if images else None


class AwsBuilder:
    """One instance of the base AMI; captured with CreateImage, tagged with the key; terminated after."""

    def __init__(self, spec: RunSpec, inputs: baked.Inputs, ec2, state: ClusterState, key_name: str,
                 subnet_id: str | None = None, security_group_ids: list[str] | None = None,
                 instance_type: str = "c6i.xlarge", ssh_user: str = "admin",
                 log: Callable[[str], None] = print):
        self.spec, self.inputs, self.ec2, self.state, self.log = spec, inputs, ec2, state, log
        self.key_name, self.subnet_id, self.groups = key_name, subnet_id, security_group_ids or []
        self.instance_type, self.ssh_user = instance_type, ssh_user
        self.instance_id: str | None = None

    def launch(self) -> str:
        """Run the builder instance from the base AMI; its id."""
        kwargs = {"ImageId": self.inputs.base, "InstanceType": self.instance_type, "MinCount": 1, "MaxCount": 1,
                  "KeyName": self.key_name,
                  "TagSpecifications": [{"ResourceType": "instance", "Tags": [
                      {"Key": "Name", "Value": f"tfcluster-image-builder-{self.inputs.key}"},
                      {"Key": KEY_TAG, "Value": self.inputs.key}]}]}
        if self.subnet_id:
            kwargs["SubnetId"] = self.subnet_id
        if self.groups:
            kwargs["SecurityGroupIds"] = self.groups
        self.instance_id = self.ec2.run_instances(**kwargs)["Instances"][0]["InstanceId"]
        self.ec2.get_waiter("instance_running").wait(InstanceIds=[self.instance_id])
        return self.instance_id

    def start(self) -> tuple[ClusterState, list[Node], str | None]:
        from .. import inventory
        from ..cluster import wait_for_ssh
        from .base import write_nodes

        self.launch()
        inst = self.ec2.describe_instances(InstanceIds=[self.instance_id])["Reservations"][0]["Instances"][0]
        node = Node(name=f"image-builder-{self.inputs.key}", role="chief", index=0,
                    # an instance without a public address is reached at its private one, as Node.from_dict does
                    private_ip=inst.get("PrivateIpAddress", ""),
                    public_ip=inst.get("PublicIpAddress") or inst.get("PrivateIpAddress", ""),
                    ssh_user=self.ssh_user, ssh_port=22, gpus=self.inputs.gpus)
        write_nodes(self.state.nodes, [node])
        inventory.write(self.state, [node], self.spec.network.tf_port, self.spec.strategy)
        wait_for_ssh(self.state, [node], self.spec.ssh.timeout_seconds)
        return self.state, [node], None   # an AWS node reads the package index: no wheelhouse to serve

    def capture(self) -> dict:
        """CreateImage of the builder, tagged with the content key; waits until the AMI is available.
        (Per-node state: cloud-init makes host keys, machine-id and the user's keys anew on an AMI's first
        boot; the roles leave no tfcluster run state behind, tf_node not being among them.)"""
        ami = self.ec2.create_image(InstanceId=self.instance_id, Name=self.inputs.full_name,
                                    Description=f"tfcluster node image {self.inputs.full_name}")["ImageId"]
        self.ec2.create_tags(Resources=[ami], Tags=[
            {"Key": KEY_TAG, "Value": self.inputs.key}, {"Key": NAME_TAG, "Value": self.inputs.full_name},
            {"Key": "tfcluster:tensorflow", "Value": self.inputs.tensorflow_version},
            {"Key": "tfcluster:base", "Value": self.inputs.base}])
        self.ec2.get_waiter("image_available").wait(ImageIds=[ami])
        return {"kind": baked.KIND, "name": self.inputs.full_name, "key": self.inputs.key, "ami": ami,
                "built": time.time()}

    def stop(self) -> None:
        if self.instance_id:
            self.ec2.terminate_instances(InstanceIds=[self.instance_id])
            self.ec2.get_waiter("instance_terminated").wait(InstanceIds=[self.instance_id])
