"""Cloud provider tests: a private AWS API emulator (moto) on loopback, and an environment that can only
reach it (dummy credentials, no profile files, no instance metadata)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tfcluster.terraform import temporary_environment

MIRROR = Path(os.environ.get("TFCLUSTER_TF_PLUGIN_MIRROR", "/opt/tf-plugins"))
AWS_PLUGIN = MIRROR / "registry.terraform.io" / "hashicorp" / "aws"

#: stand-ins for the Debian cloud team's Debian 12 AMIs (account 136693071363), so the module's own aws_ami
#: lookup runs against moto; a newer backports image and an Ubuntu image from another owner must not be chosen
DEBIAN_AMI = "ami-0a1b2c3d4e5f60718"
DEBIAN_ARM_AMI = "ami-0a1b2c3d4e5f60719"


def _ami(ami_id: str, owner: str, name: str, arch: str, created: str) -> dict:
    return {"ami_id": ami_id, "state": "available", "public": True, "owner_id": owner,
            "image_location": f"{owner}/{name}", "sriov": "simple", "root_device_type": "ebs",
            "root_device_name": "/dev/xvda", "description": name, "image_type": "machine", "platform": None,
            "architecture": arch, "name": name, "virtualization_type": "hvm", "hypervisor": "xen",
            "creation_date": created}


_AMIS = [
    _ami(DEBIAN_AMI, "136693071363", "debian-12-amd64-20250101-1000", "x86_64", "2025-01-01T00:00:00.000Z"),
    _ami(DEBIAN_ARM_AMI, "136693071363", "debian-12-arm64-20250101-1000", "arm64", "2025-01-01T00:00:00.000Z"),
    _ami("ami-0a1b2c3d4e5f60720", "136693071363", "debian-12-backports-amd64-20250301-1100", "x86_64",
         "2025-03-01T00:00:00.000Z"),
    _ami("ami-0a1b2c3d4e5f60721", "099720109477", "debian-12-amd64-20250401-1200", "x86_64",
         "2025-04-01T00:00:00.000Z"),
]


@pytest.fixture(scope="session", autouse=True)
def test_store():
    """These tests talk to their own emulator only: they do not need the local S3 store of tests/conftest.py."""
    yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """moto_server on 127.0.0.1:<free port>; stopped at the end, also when a test failed."""
    work = tmp_path_factory.mktemp("moto")
    amis = work / "amis.json"
    amis.write_text(json.dumps(_AMIS))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(work / "moto.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, MOTO_AMIS_PATH=str(amis)))
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                        f"{url}/moto-api/", timeout=2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("moto_server did not start: "
                                           + (work / "moto.log").read_text()[-2000:]) from None
                    time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(scope="session")
def aws_env(tmp_path_factory):
    """Dummy credentials in the environment (Terraform and boto3 read it); nothing else can be used."""
    empty = tmp_path_factory.mktemp("aws-home")
    values = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(empty / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(empty / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    removed = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN",
               "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ENDPOINT_URL")
    with temporary_environment(values, removed):
        yield values


@pytest.fixture(scope="module")
def public_key(tmp_path_factory) -> str:
    """An ed25519 public key for the modules' inputs (the private half stays in the test's temp dir)."""
    key = tmp_path_factory.mktemp("key") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tfct", "-f", str(key)],
                   check=True, timeout=30)
    return key.with_suffix(".pub").read_text().strip()
