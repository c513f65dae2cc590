"""Baked AMIs (tfcluster.providers.aws_image) against the AWS API emulator: the builder's launch from the base
AMI, CreateImage tagged with the content key, the look-up by that tag, and the module planning every node on
the baked AMI.

What this does not cover: the SSH step between launch and capture (tfcluster.baked.apply_roles, the image
roles applied to the builder), because an emulated instance never boots. That step is the one the local
image runs for real (tests/integration/test_node_image.py), through the same tfcluster.baked.bake.
"""

from __future__ import annotations

from tests.cloud.conftest import DEBIAN_AMI
from tests.cloud.test_aws import _planned, aws_spec, needs_aws_plugin
from tfcluster import baked
from tfcluster.paths import ClusterState
from tfcluster.providers import aws_image
from tfcluster.providers.aws import AwsProvider


def _plan_amis(provider: AwsProvider, spec, public_key: str, tmp_path) -> dict[str, str]:
    """``terraform plan`` of the module with the provider's inputs: each planned instance's AMI."""
    tf, shown = _planned(spec, public_key, tmp_path, provider)
    assert not tf.has_resources()
    return {r["index"]: r["change"]["after"]["ami"] for r in shown["resource_changes"] if r["type"] == "aws_instance"}


@needs_aws_plugin
def test_a_baked_ami_is_created_tagged_found_and_planned(tmp_path, moto_endpoint, aws_env, public_key):
    spec = aws_spec(moto_endpoint, cluster="tfct-ami")
    ec2 = aws_image.ec2_client(spec)
    inputs = aws_image.inputs_for(spec, ec2, "worker")
    assert inputs.base == DEBIAN_AMI and inputs.source == "index"
    provider = AwsProvider(ClusterState(spec.cluster, root=tmp_path / "state"))
    assert provider.baked_images(spec) == {"ps": "", "worker": "", "chief": ""}   # none baked yet

    ec2.import_key_pair(KeyName="tfct-ami-builder", PublicKeyMaterial=public_key.encode())
    builder = aws_image.AwsBuilder(spec, inputs, ec2, ClusterState("tfct-ami-bake", root=tmp_path), "tfct-ami-builder")
    try:
        instance = builder.launch()   # here bake() would apply the image roles over SSH (not on an emulator)
        record = builder.capture()
    finally:
        builder.stop()
    ami = record["ami"]
    assert ami.startswith("ami-") and ami != DEBIAN_AMI
    image = ec2.describe_images(ImageIds=[ami])["Images"][0]
    tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
    assert tags[aws_image.KEY_TAG] == inputs.key and tags[aws_image.NAME_TAG] == inputs.full_name
    assert image["Name"] == inputs.full_name
    state = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state == "terminated"

    # up's look-up finds it for every role (same content key), and the module plans every node on it
    provider.baked = provider.baked_images(spec)
    assert provider.baked == {"ps": ami, "worker": ami, "chief": ami}
    amis = _plan_amis(provider, spec, public_key, tmp_path)
    assert set(amis) == {"tfct-ami-ps-0", "tfct-ami-worker-0", "tfct-ami-worker-1", "tfct-ami-chief-0"}
    assert set(amis.values()) == {ami}, amis

    # another TensorFlow version is another key: not this AMI; a role's own image is kept as given
    other = aws_spec(moto_endpoint, cluster="tfct-ami", **{"tensorflow.version": "2.20.0",
                                                          "nodes.ps.image": DEBIAN_AMI})
    assert provider.baked_images(other) == {"worker": "", "chief": ""}
    assert aws_image.inputs_for(other, ec2, "worker").key != inputs.key
    provider.baked = {"worker": ami, "chief": ami}
    assert provider.inputs(other, public_key)["images"] == {"ps": DEBIAN_AMI, "worker": ami, "chief": ami}
    assert record["kind"] == baked.KIND
