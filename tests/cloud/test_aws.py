"""The aws provider: its checks, the module's validation, and a real apply/inspect/destroy against moto.

The Terraform tests use the hashicorp/aws provider from the plugin mirror and an AWS API emulator
(moto_server on loopback, see conftest.py); they are skipped where the mirror lacks the provider.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cloud.conftest import AWS_PLUGIN, DEBIAN_AMI
from tests.cloud.s3_policy import allows, normalized, refused, run_requests
from tests.conftest import run_cli
from tests.unit.test_terraform_interface import SHARED_INPUTS
from tfcluster.config import resolve
from tfcluster.errors import EXIT_USAGE, ConfigError
from tfcluster.paths import TERRAFORM_DIR, ClusterState
from tfcluster.providers.aws import AwsProvider
from tfcluster.providers.base import REGISTRY
from tfcluster.terraform import TERRAFORM_BIN, TerraformModule

CLUSTER = "tfct-aws"
ROLE_NAME = f"tfcluster-{CLUSTER}-us-east-1"
#: a recognisable dummy secret: it must not appear in any file tfcluster or Terraform writes
SECRET = "tfct-dummy-secret-9f3a1c"

needs_aws_plugin = pytest.mark.skipif(
    not AWS_PLUGIN.is_dir(),
    reason=f"no hashicorp/aws provider in the Terraform plugin mirror ({AWS_PLUGIN} is absent)")


def aws_spec(endpoint: str | None = None, options: dict | None = None, **overrides):
    opts = {"region": "us-east-1", **(options or {})}
    if endpoint:
        opts["endpoint"] = endpoint
    values = {
        "cluster": CLUSTER,
        "provider": "aws",
        "storage.bucket": "tfct-runs",
        "nodes.ps.count": 1,
        "nodes.worker.count": 2,
        "nodes.chief.count": 1,
        "network.allowed_ssh_cidrs": ["203.0.113.0/24"],
        "provider_options": opts,
    }
    values.update(overrides)
    return resolve(overrides=values)


# -- the provider class, without Terraform ------------------------------------------------------

def test_registered_with_shared_inputs_and_lazy_sdk(tmp_path):
    assert REGISTRY["aws"] is AwsProvider
    inputs = AwsProvider(ClusterState("x", root=tmp_path)).inputs(aws_spec(), "ssh-ed25519 AAAA test")
    assert set(inputs) == SHARED_INPUTS
    res = subprocess.run([sys.executable, "-c", "import sys, tfcluster.providers.aws; print('boto3' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "False", res.stdout + res.stderr


def test_region_defaults_to_the_buckets(tmp_path):
    provider = AwsProvider(ClusterState("x", root=tmp_path))
    spec = resolve(overrides={"provider": "aws", "storage.region": "eu-west-3", "storage.bucket": "tfct-runs",
                              "network.allowed_ssh_cidrs": ["198.51.100.7/32"]})
    provider.check(spec)
    assert provider.provider_options(spec) == {"region": "eu-west-3"}
    spec = aws_spec(options={"region": "us-west-2", "spot": True, "root_volume_gb": 80})
    provider.check(spec)
    assert provider.provider_options(spec) == {"region": "us-west-2", "spot": "true", "root_volume_gb": "80"}


def test_check_refuses_empty_allowed_ssh_cidrs(tmp_path):
    spec = aws_spec(**{"network.allowed_ssh_cidrs": []})
    with pytest.raises(ConfigError) as err:
        AwsProvider(ClusterState("x", root=tmp_path)).check(spec)
    assert err.value.exit_code == EXIT_USAGE == 2
    assert err.value.field == "network.allowed_ssh_cidrs"
    assert "no open default" in err.value.allowed and "0.0.0.0/0" in err.value.allowed


def test_check_refuses_unknown_option(tmp_path):
    with pytest.raises(ConfigError) as err:
        AwsProvider(ClusterState("x", root=tmp_path)).check(aws_spec(options={"flavour": "large"}))
    assert err.value.exit_code == 2
    assert err.value.field == "provider_options.flavour"
    assert "region" in err.value.allowed and "subnet_id" in err.value.allowed


@pytest.mark.parametrize(("overrides", "field", "fragment"), [
    ({"provider_options": {"spot": "maybe"}}, "provider_options.spot", '"true" or "false"'),
    ({"provider_options": {"root_volume_gb": "4"}}, "provider_options.root_volume_gb", "8 to 16384"),
    ({"provider_options": {"region": "moon-1"}}, "provider_options.region", "us-east-1"),
    ({"provider_options": {"vpc_id": "vpc-0123456789abcdef0"}}, "provider_options.vpc_id", "subnet_id"),
    ({"provider_options": {"subnet_id": "subnet-01234567", "vpc_cidr": "10.1.0.0/16"}},
     "provider_options.vpc_cidr", "subnet_id"),
    ({"provider_options": {"vpc_cidr": "10.1.0.0/8"}}, "provider_options.vpc_cidr", "/16 to /24"),
    ({"provider_options": {"endpoint": "ftp://127.0.0.1:1"}}, "provider_options.endpoint", "http(s)://"),
    ({"network.subnet": "10.9.9.0/24"}, "network.subnet", "subnet_id"),
    ({"nodes.worker.image": "ubuntu-22.04"}, "nodes.worker.image", "AMI id"),
    ({"nodes.ps.instance_type": "big"}, "nodes.ps.instance_type", "c6i.xlarge"),
    # issue 8 item 11: no public address and no NAT = no apt, no PyPI
    ({"provider_options": {"associate_public_ip": "false"}}, "provider_options.associate_public_ip",
     "NAT gateway"),
    ({"provider_options": {"associate_public_ip": "false", "subnet_id": "subnet-01234567"}},
     "provider_options.subnet_has_nat", "subnet subnet-01234567 routes to the internet through NAT"),
    ({"provider_options": {"subnet_has_nat": "yes"}}, "provider_options.subnet_has_nat", '"true" or "false"'),
])
def test_check_refuses_what_the_module_cannot_do(tmp_path, overrides, field, fragment):
    with pytest.raises(ConfigError) as err:
        AwsProvider(ClusterState("x", root=tmp_path)).check(aws_spec(**overrides))
    assert err.value.exit_code == 2
    assert err.value.field == field
    assert fragment in err.value.allowed


# -- the module under Terraform ------------------------------------------------------------------

def _plan(tf: TerraformModule) -> str:
    res = subprocess.run([TERRAFORM_BIN, "plan", "-input=false", "-no-color", "-lock=false"], cwd=tf.work_dir,
                         env=dict(os.environ, **tf._env()), capture_output=True, text=True, timeout=150)
    assert res.returncode != 0, "plan should have been refused:\n" + res.stdout[-3000:]
    return " ".join((res.stdout + res.stderr).split())  # undo Terraform's line wrapping


def _planned(spec, public_key: str, tmp_path: Path,
             provider: AwsProvider | None = None) -> tuple[TerraformModule, dict]:
    """``terraform plan`` of the spec's root (nothing is created) and the plan as ``terraform show -json``;
    with ``provider``, that provider's inputs (its state under ``tmp_path`` otherwise)."""
    provider = provider or AwsProvider(ClusterState(spec.cluster, root=tmp_path))
    tf = provider.module()
    tf.write_root(provider.inputs(spec, public_key))
    tf.init()
    env = dict(os.environ, **tf._env())
    res = subprocess.run([TERRAFORM_BIN, "plan", "-input=false", "-no-color", "-lock=false", "-out=tfct.plan"],
                         cwd=tf.work_dir, env=env, capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    shown = subprocess.run([TERRAFORM_BIN, "show", "-json", "tfct.plan"], cwd=tf.work_dir, env=env,
                           capture_output=True, text=True, timeout=60, check=True)
    return tf, json.loads(shown.stdout)


@needs_aws_plugin
def test_multi_worker_mirrored_plans_no_ps_and_grpc_only_between_members(tmp_path, moto_endpoint, aws_env,
                                                                         public_key):
    """`strategy: multi_worker_mirrored` through the module: a chief and workers, no ps instance, and the
    security rules unchanged (SSH from the allowed networks, the TensorFlow port from the group only)."""
    spec = aws_spec(moto_endpoint, cluster="tfct-mwms", strategy="multi_worker_mirrored",
                    **{"nodes.ps.count": 0})
    tf, shown = _planned(spec, public_key, tmp_path)
    planned = [r for r in shown["resource_changes"] if r["change"]["actions"] == ["create"]]
    instances = sorted(r["index"] for r in planned if r["type"] == "aws_instance")
    assert instances == ["tfct-mwms-chief-0", "tfct-mwms-worker-0", "tfct-mwms-worker-1"], instances
    rules = {r["name"]: r["change"] for r in planned if r["type"] == "aws_vpc_security_group_ingress_rule"}
    assert set(rules) == {"ssh", "tf_port"}, rules
    ssh = [r["change"]["after"] for r in planned if r["type"] == "aws_vpc_security_group_ingress_rule"
           and r["name"] == "ssh"]
    assert [(r["from_port"], r["cidr_ipv4"]) for r in ssh] == [(22, "203.0.113.0/24")]
    grpc = rules["tf_port"]
    assert (grpc["after"]["from_port"], grpc["after"]["to_port"]) == (2222, 2222)
    assert grpc["after"].get("cidr_ipv4") is None and grpc["after"].get("cidr_ipv6") is None
    assert grpc["after_unknown"].get("referenced_security_group_id") is True   # the cluster's own group
    assert not tf.has_resources()


@needs_aws_plugin
def test_data_in_other_buckets_is_granted_read_only_on_exactly_its_prefixes(tmp_path, moto_endpoint, aws_env,
                                                                           public_key):
    """A cluster file whose data lie in other buckets: the planned policy lets the nodes read exactly the
    prefixes of its URLs (the part before the first wildcard), write only the cluster's runs, and read no
    data set; the ps instance gets no instance profile."""
    spec = aws_spec(moto_endpoint, cluster="tfct-data", **{
        "storage.bucket": "tfct-bucket", "storage.prefix": "team/runs",
        "data.train": "s3://tfct-corpus/images/train-*.tfrecord", "data.test": "s3://tfct-eval/holdout/"})
    tf, shown = _planned(spec, public_key, tmp_path)
    planned = shown["planned_values"]["root_module"]["child_modules"][0]["resources"]
    (policy,) = [r["values"]["policy"] for r in planned if r["address"] == "module.cluster.aws_iam_role_policy.s3"]
    doc = json.loads(policy)
    assert [st["Sid"] for st in doc["Statement"]] == ["ClusterRuns", "ListClusterRuns", "ReadTrainingData"]
    assert doc["Statement"][0]["Resource"] == "arn:aws:s3:::tfct-bucket/team/runs/tfct-data/*"
    assert normalized(doc)["Statement"][2] == {
        "Sid": "ReadTrainingData", "Effect": "Allow", "Action": "s3:GetObject",
        "Resource": ["arn:aws:s3:::tfct-corpus/images/train-*", "arn:aws:s3:::tfct-eval/holdout/*"]}
    for bucket, key, readable in (("tfct-corpus", "images/train-00.tfrecord", True),
                                  ("tfct-eval", "holdout/part/0.tfrecord", True),
                                  ("tfct-corpus", "images/test-00.tfrecord", False),
                                  ("tfct-eval", "other/0.tfrecord", False),
                                  ("tfct-bucket", "datasets/digits-0123456789ab/train.npz", False)):
        assert allows(doc, "s3:GetObject", f"arn:aws:s3:::{bucket}/{key}", {}) is readable, (bucket, key)
        assert not allows(doc, "s3:PutObject", f"arn:aws:s3:::{bucket}/{key}", {})
        assert not allows(doc, "s3:DeleteObject", f"arn:aws:s3:::{bucket}/{key}", {})
        assert not allows(doc, "s3:ListBucket", f"arn:aws:s3:::{bucket}", {"s3:prefix": key})
    profiles = {r["index"]: r["values"].get("iam_instance_profile") for r in planned if r["type"] == "aws_instance"}
    assert profiles == {"tfct-data-ps-0": None, "tfct-data-worker-0": "tfcluster-tfct-data-us-east-1",
                        "tfct-data-worker-1": "tfcluster-tfct-data-us-east-1",
                        "tfct-data-chief-0": "tfcluster-tfct-data-us-east-1"}
    assert not tf.has_resources()


@needs_aws_plugin
def test_module_refuses_bad_values_before_creating_anything(tmp_path, moto_endpoint, aws_env, public_key):
    provider = AwsProvider(ClusterState("tfct-bad", root=tmp_path))
    tf = provider.module()
    inputs = provider.inputs(aws_spec(moto_endpoint, cluster="tfct-bad"), public_key)
    inputs.update(tf_port=80, allowed_ssh_cidrs=[])
    inputs["provider_options"]["spot"] = "maybe"
    inputs["provider_options"]["associate_public_ip"] = "false"
    inputs["storage_access"]["read"] = [{"bucket": "tfct-data", "prefix": "sets/${x}*"}]
    tf.write_root(inputs)
    tf.init()
    out = _plan(tf)
    assert "storage_access.read: bucket names, and key prefixes of letters, digits and" in out
    assert 'provider_options.associate_public_ip: "false" only with a subnet_id whose route' in out
    assert "tf_port: a whole number from 1024 to 65535." in out
    assert "allowed_ssh_cidrs: at least one network must be listed" in out and "0.0.0.0/0" in out
    assert 'provider_options.spot and provider_options.associate_public_ip: "true" or "false".' in out

    # a GPU count the instance type cannot give: the precondition reads the type from the EC2 API
    spec = aws_spec(moto_endpoint, cluster="tfct-bad", **{"nodes.worker.gpus": 1,
                                                          "nodes.worker.instance_type": "c6i.large"})
    inputs = provider.inputs(spec, public_key)
    inputs["storage_access"]["read_write"] = "elsewhere/tfct-bad/"   # outside the runs' prefix
    tf.write_root(inputs)
    out = _plan(tf)
    assert "gpus.worker = 1 needs an instance type with at least that many GPUs; c6i.large has 0" in out
    assert "storage_access.read_write elsewhere/tfct-bad/ is not under prefix runs/" in out
    assert not tf.has_resources()


@needs_aws_plugin
def test_example_validates(tmp_path):
    shutil.copytree(TERRAFORM_DIR / "aws", tmp_path / "aws", ignore=shutil.ignore_patterns(".terraform*"))
    work = tmp_path / "aws" / "examples" / "minimal"
    env = dict(os.environ, **TerraformModule(work, work)._env())
    for cmd in (["init", "-backend=false", "-input=false", "-no-color"], ["validate", "-no-color"]):
        res = subprocess.run([TERRAFORM_BIN, *cmd], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr


def _tags(items) -> dict:
    return {t["Key"]: t["Value"] for t in items or []}


def role_policy(iam, role: str = ROLE_NAME) -> dict:
    """The nodes' inline policy as the IAM API returns it."""
    doc = iam.get_role_policy(RoleName=role, PolicyName="tfcluster-run-data")["PolicyDocument"]
    return json.loads(doc) if isinstance(doc, str) else doc


@needs_aws_plugin
def test_up_inspect_down(tmp_path, moto_endpoint, aws_env, public_key, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    kw = {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}
    ec2, iam = boto3.client("ec2", **kw), boto3.client("iam", **kw)
    spec = aws_spec(moto_endpoint, options={"spot": "true", "root_volume_gb": "20"},
                    **{"nodes.worker.instance_type": "c6i.large", "max_runtime_minutes": 45,
                       "storage.bucket": "tfct-bucket", "storage.prefix": "team/runs"})
    state = ClusterState(CLUSTER, root=tmp_path)
    provider = AwsProvider(state)
    provider.check(spec)
    alive = {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}
    ours = {"Name": "tag:tfcluster:cluster", "Values": [CLUSTER]}
    t0 = time.monotonic()
    try:
        nodes = provider.up(spec, public_key)
        t_up = time.monotonic() - t0

        # the shared node records
        assert [(n.role, n.index) for n in nodes] == [("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0)]
        subnet = ipaddress.ip_network("10.42.0.0/24")
        for n in nodes:
            assert n.name == f"{CLUSTER}-{n.role}-{n.index}"
            assert ipaddress.ip_address(n.private_ip) in subnet
            assert ipaddress.ip_address(n.public_ip) not in subnet
            assert (n.ssh_user, n.ssh_port, n.gpus) == ("admin", 22, 0)  # the Debian AMIs' user
        assert len({n.private_ip for n in nodes}) == 4

        # the instances: counts and types per role, tags, image, key, role, spot, shutdown, user data
        instances = [i for r in ec2.describe_instances(Filters=[ours, alive])["Reservations"] for i in r["Instances"]]
        assert len(instances) == 4
        by_name = {_tags(i["Tags"])["Name"]: i for i in instances}
        assert set(by_name) == {n.name for n in nodes}
        types = {"ps": "m6i.large", "worker": "c6i.large", "chief": "m6i.large"}
        group_ids = set()
        for n in nodes:
            inst = by_name[n.name]
            tags = _tags(inst["Tags"])
            assert tags["tfcluster:cluster"] == CLUSTER and tags["tfcluster:role"] == n.role
            assert tags["tfcluster:index"] == str(n.index)
            assert inst["InstanceType"] == types[n.role]
            assert inst["PrivateIpAddress"] == n.private_ip
            assert inst["ImageId"] == DEBIAN_AMI  # the module's Debian 12 lookup (not backports, not another owner)
            assert inst["KeyName"] == f"tfcluster-{CLUSTER}"
            if n.role == "ps":  # a parameter server only holds variables: no identity, no S3 at all
                assert "IamInstanceProfile" not in inst, inst.get("IamInstanceProfile")
            else:
                assert inst["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{ROLE_NAME}")
            assert inst.get("InstanceLifecycle") == "spot"
            assert inst["MetadataOptions"]["HttpTokens"] == "required"
            group_ids |= {g["GroupId"] for eni in inst["NetworkInterfaces"] for g in eni["Groups"]}
            attr = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"],
                                                   Attribute="instanceInitiatedShutdownBehavior")
            assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
            data = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
            user_data = base64.b64decode(data["UserData"]["Value"]).decode()
            assert user_data.startswith("#!/bin/sh\n")
            assert "\nshutdown -h +105 " in user_data  # max_runtime_minutes 45 + 60 for configuration
            unit = user_data.split("tfcluster-deadline.service <<'UNIT'\n")[1].split("UNIT\n")[0]
            assert "WantedBy=multi-user.target" in unit
            assert "multi-user.target" not in unit.split("[Install]")[0]  # no ordering cycle
            assert SECRET not in user_data and "AWS_SECRET" not in user_data
            root = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id",
                                                  "Values": [inst["InstanceId"]]}])["Volumes"]
            assert [(v["Size"], v["Encrypted"], _tags(v["Tags"]).get("tfcluster:cluster")) for v in root] == \
                [(20, True, CLUSTER)]

        # the security group: SSH only from allowed_ssh_cidrs, the TF port only from the group itself
        assert len(group_ids) == 1
        sg = ec2.describe_security_groups(GroupIds=list(group_ids))["SecurityGroups"][0]
        assert sg["GroupName"] == f"tfcluster-{CLUSTER}"
        assert _tags(sg["Tags"])["tfcluster:cluster"] == CLUSTER
        ingress = {(p["IpProtocol"], p.get("FromPort"), p.get("ToPort")): p for p in sg["IpPermissions"]}
        assert set(ingress) == {("tcp", 22, 22), ("tcp", 2222, 2222)}
        ssh, grpc = ingress[("tcp", 22, 22)], ingress[("tcp", 2222, 2222)]
        assert [r["CidrIp"] for r in ssh["IpRanges"]] == ["203.0.113.0/24"]
        assert not ssh["Ipv6Ranges"] and not ssh["UserIdGroupPairs"] and not ssh["PrefixListIds"]
        assert [g["GroupId"] for g in grpc["UserIdGroupPairs"]] == [sg["GroupId"]]
        assert not grpc["IpRanges"] and not grpc["Ipv6Ranges"] and not grpc["PrefixListIds"]
        for perm in sg["IpPermissions"]:
            assert "0.0.0.0/0" not in {r["CidrIp"] for r in perm["IpRanges"]}
            assert "::/0" not in {r["CidrIpv6"] for r in perm["Ipv6Ranges"]}

        # the network, the key pair: tagged
        (vpc,) = ec2.describe_vpcs(Filters=[ours])["Vpcs"]
        assert vpc["CidrBlock"] == "10.42.0.0/16" and sg["VpcId"] == vpc["VpcId"]
        assert ec2.describe_subnets(Filters=[ours])["Subnets"][0]["CidrBlock"] == "10.42.0.0/24"
        assert ec2.describe_internet_gateways(Filters=[ours])["InternetGateways"]
        (kp,) = ec2.describe_key_pairs(KeyNames=[f"tfcluster-{CLUSTER}"])["KeyPairs"]
        assert _tags(kp["Tags"])["tfcluster:cluster"] == CLUSTER

        # the instance role: assumable by EC2 only, one inline policy: the cluster's runs, its data read only
        role = iam.get_role(RoleName=ROLE_NAME)["Role"]
        assert _tags(role["Tags"])["tfcluster:cluster"] == CLUSTER
        trust = role["AssumeRolePolicyDocument"]
        trust = json.loads(trust) if isinstance(trust, str) else trust
        assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
        assert iam.list_attached_role_policies(RoleName=ROLE_NAME)["AttachedPolicies"] == []
        assert iam.list_role_policies(RoleName=ROLE_NAME)["PolicyNames"] == ["tfcluster-run-data"]
        doc = role_policy(iam)
        print("\nthe nodes' policy as IAM returns it:\n" + json.dumps(doc, indent=2))
        assert normalized(doc) == {"Version": "2012-10-17", "Statement": [
            {"Sid": "ClusterRuns", "Effect": "Allow",
             "Action": ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"],
             "Resource": "arn:aws:s3:::tfct-bucket/team/runs/tfct-aws/*"},
            {"Sid": "ListClusterRuns", "Effect": "Allow", "Action": "s3:ListBucket",
             "Resource": "arn:aws:s3:::tfct-bucket",
             "Condition": {"StringLike": {"s3:prefix": "team/runs/tfct-aws/*"}}},
            {"Sid": "ReadTrainingData", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": "arn:aws:s3:::tfct-bucket/datasets/digits-*"},
        ]}
        # what a run's tasks ask of S3, made by the harness's own code against the emulator, is all allowed
        # (s3io.exists lists with the key as the prefix: a HEAD of a missing key would be 403 under it) ...
        boto3.client("s3", **kw).create_bucket(Bucket="tfct-bucket")
        stored_by, asked = run_requests(spec, moto_endpoint, tmp_path / "run")
        assert {op for op, _ in asked} >= {"GetObject", "ListObjectsV2", "PutObject", "DeleteObjects"}, asked
        assert refused(doc, asked) == []
        # ... and nothing else: not the data set the controller stored (nodes only read data), not another
        # cluster's runs, not a listing above the cluster's prefix
        assert len(refused(doc, stored_by)) == len(stored_by) > 0, stored_by
        for action, resource, context in (
                ("s3:PutObject", "arn:aws:s3:::tfct-bucket/team/runs/other/20260101-abcd/_SUCCESS", {}),
                ("s3:GetObject", "arn:aws:s3:::tfct-bucket/team/runs/other/20260101-abcd/metrics.json", {}),
                ("s3:DeleteObject", "arn:aws:s3:::tfct-bucket/datasets/digits-0123456789ab/train.npz", {}),
                ("s3:GetObject", "arn:aws:s3:::tfct-bucket/datasets/cancer-0123456789ab/train.npz", {}),
                ("s3:GetObject", "arn:aws:s3:::tfct-other/datasets/digits-0123456789ab/train.npz", {}),
                ("s3:ListBucket", "arn:aws:s3:::tfct-bucket", {"s3:prefix": "team/runs/"}),
                ("s3:ListBucket", "arn:aws:s3:::tfct-bucket", {})):
            assert not allows(doc, action, resource, context), (action, resource, context)
        profile = iam.get_instance_profile(InstanceProfileName=ROLE_NAME)["InstanceProfile"]
        assert [r["RoleName"] for r in profile["Roles"]] == [ROLE_NAME]

        # no credential in anything tfcluster or Terraform wrote
        for path in state.dir.rglob("*"):
            if path.is_file() and ".terraform" not in path.parts:
                assert SECRET.encode() not in path.read_bytes(), path
    finally:
        t1 = time.monotonic()
        provider.down()
        t_down = time.monotonic() - t1

    # nothing left: no instance alive, no group, key pair, VPC, role or profile
    assert not [i for r in ec2.describe_instances(Filters=[ours, alive])["Reservations"] for i in r["Instances"]]
    assert not ec2.describe_security_groups(Filters=[{"Name": "group-name",
                                                      "Values": [f"tfcluster-{CLUSTER}"]}])["SecurityGroups"]
    assert not ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [f"tfcluster-{CLUSTER}"]}])["KeyPairs"]
    assert not ec2.describe_vpcs(Filters=[ours])["Vpcs"]
    for call, key in ((iam.get_role, "RoleName"), (iam.get_instance_profile, "InstanceProfileName")):
        with pytest.raises(iam.exceptions.NoSuchEntityException):
            call(**{key: ROLE_NAME})
    assert provider.leftovers() == []
    print(f"\naws on moto: up {t_up:.1f}s, down {t_down:.1f}s")


@needs_aws_plugin
def test_leftovers_names_what_is_still_there(tmp_path, moto_endpoint, aws_env):
    """``down`` proves the cloud is empty: a tagged instance left behind (e.g. after lost state) is named."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    state = ClusterState("tfct-left", root=tmp_path)
    provider = AwsProvider(state)
    assert provider.leftovers() == []  # no root written: nothing was ever created
    provider.module().write_root(provider.inputs(aws_spec(moto_endpoint, cluster="tfct-left"), "ssh-ed25519 AAAA x"))
    assert provider.leftovers() == []
    inst = ec2.run_instances(ImageId=DEBIAN_AMI, MinCount=1, MaxCount=1, TagSpecifications=[{
        "ResourceType": "instance", "Tags": [{"Key": "tfcluster:cluster", "Value": "tfct-left"}]}])["Instances"][0]
    try:
        assert provider.leftovers() == [f"instance {inst['InstanceId']} (running)"]
    finally:
        ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    assert provider.leftovers() == []
    assert Path(state.terraform_dir / "main.tf.json").exists()


@needs_aws_plugin
def test_plan_shows_terraforms_plan_and_creates_nothing(home, plan_tmp, moto_endpoint, aws_env):
    """`make plan` on aws: Terraform's real plan against the emulator, from a temporary directory; no state in
    the cluster's directory and nothing in the (emulated) cloud."""
    import boto3

    from tests.unit.test_plan import SECTIONS, assert_nothing_created, sections_in_order

    cluster = "tfct-plan-aws"
    res = run_cli("plan", "--cluster", cluster, "--provider", "aws", "--set", "storage.bucket=tfct-runs",
                  "--set", "network.allowed_ssh_cidrs=203.0.113.0/24", "--set", "nodes.worker.instance_type=c6i.large",
                  "--set", f"provider_options.endpoint={moto_endpoint}", "--set", "max_runtime_minutes=45",
                  home=home, env={"TMPDIR": str(plan_tmp)}, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert sections_in_order(out) == list(SECTIONS)
    # each node with the type and the image Terraform plans for it (the module's Debian 12 lookup)
    for name, itype in ((f"{cluster}-ps-0", "m6i.large"), (f"{cluster}-worker-0", "c6i.large"),
                        (f"{cluster}-worker-1", "c6i.large"), (f"{cluster}-chief-0", "m6i.large")):
        assert re.search(rf"^  {name} +\w+ +{itype} +{DEBIAN_AMI} +0 +\(known after up\)$", out, re.M), out
        assert f'aws_instance.node["{name}"]: instance_type {itype}, ami {DEBIAN_AMI}' in out
    summary = re.search(r"terraform plan of terraform/aws/ \(in a temporary directory, removed after\): "
                        r"(\d+) to add, 0 to change, 0 to destroy", out)
    assert summary and int(summary.group(1)) >= 10, out
    # what the network exposes, the halts, where the model goes
    assert "SSH (22/tcp): from 203.0.113.0/24 only" in out
    assert "TensorFlow gRPC (2222/tcp, no authentication): only between the cluster's nodes" in out
    assert 'ssh["203.0.113.0/24"]: cidr_ipv4 203.0.113.0/24, from_port 22, to_port 22' in out
    assert "each node halts 105 min after it boots" in out and "each node halts 55 min later" in out
    assert f"model: s3://tfct-runs/runs/{cluster}/<run-id>/ at AWS S3" in out
    # nothing created: no state of the cluster, no tagged resource in the emulator
    assert_nothing_created(home, cluster, plan_tmp)
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    ours = [{"Name": "tag:tfcluster:cluster", "Values": [cluster]}]
    assert not ec2.describe_instances(Filters=ours)["Reservations"]
    assert not ec2.describe_vpcs(Filters=ours)["Vpcs"] and not ec2.describe_security_groups(Filters=ours)[
        "SecurityGroups"]
    assert not ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [f"tfcluster-{cluster}"]}])["KeyPairs"]
    assert AwsProvider(ClusterState(cluster, root=home)).leftovers() == []
