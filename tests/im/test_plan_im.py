"""`make plan` on provider im: the RADL up would submit, keys and IM's credentials elided, IM never contacted.

IM's URL points at a loopback listener that records every request it gets: it must get none. No IM server
is installed or started for these tests.
"""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import run_cli
from tests.unit.test_plan import SECTIONS, assert_nothing_created, sections_in_order

CLUSTER = "tfct-plan-im"
IMAGE = "ost://cloud.example.org:5000/3f1c-image"


@pytest.fixture
def listener():
    """A stand-in for IM on 127.0.0.1: answers 500 to everything and records what it was asked."""
    requests: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def _record(self):
            requests.append(f"{self.command} {self.path}")
            self.send_response(500)
            self.end_headers()

        do_GET = do_POST = do_PUT = do_DELETE = _record

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def plan_im(home, plan_tmp, url: str, auth_file, *sets: str):
    args = ["plan", "--cluster", CLUSTER, "--provider", "im", "--set", f"provider_options.im_url={url}",
            "--set", f"provider_options.auth_file={auth_file}"]
    for item in sets:
        args += ["--set", item]
    return run_cli(*args, home=home, env={"TMPDIR": str(plan_tmp)}, timeout=240)


def assert_no_secret(out: str, auth_file, *, private_key_sent: bool) -> None:
    """No secret in the plan; IM gets the run's private key only for the nodes it adopts (adopt_local)."""
    password = re.search(r"password = (\S+)", auth_file.read_text()).group(1)
    assert password not in out
    assert "PRIVATE KEY" not in out and "ssh-ed25519" not in out
    assert ("private_key = '<key>" in out) == private_key_sent and "public_key = '<the run's public key>'" in out


def test_plan_cloud_nodes_prints_the_radl_and_contacts_no_one(home, plan_tmp, listener, auth_file):
    url, requests = listener
    res = plan_im(home, plan_tmp, url, auth_file, f"provider_options.image_url={IMAGE}", "storage.bucket=tfct-runs",
                  "network.allowed_ssh_cidrs=203.0.113.0/24", "nodes.worker.count=3", "nodes.worker.gpus=1")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert sections_in_order(out) == list(SECTIONS)
    assert re.search(rf"^  {CLUSTER}-worker-2 +worker +any with >= 2 vCPUs, >= 4G +{IMAGE} +1 +\(known after up\)$",
                     out, re.M), out
    assert "public network: SSH (22/tcp) from 203.0.113.0/24 only" in out
    assert "until training starts nothing halts the nodes" in out and "each node halts 70 min later" in out
    assert f"IM at {url}: not contacted" in out
    # the RADL itself: one system per role, deployed with the configured counts
    for role, count in (("ps", 1), ("worker", 3), ("chief", 1)):
        assert f"\n    system {role} (\n" in out and f"\n    deploy {role} {count}\n" in out
    assert "outports = '203.0.113.0/24-22/tcp-22/tcp'" in out and "gpu.count >= 1" in out
    assert_no_secret(out + res.stderr, auth_file, private_key_sent=False)
    assert requests == []
    assert_nothing_created(home, CLUSTER, plan_tmp)


def test_plan_adopting_local_nodes_plans_them_and_creates_none(home, plan_tmp, listener, auth_file):
    url, requests = listener
    res = plan_im(home, plan_tmp, url, auth_file, "provider_options.adopt_local=true")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    # the local nodes' addresses come from Terraform's plan of terraform/local and go into the RADL
    found = re.search(rf"^  {CLUSTER}-ps-0 +ps +namespace +.* +0 +(10\.231\.\d+\.10)$", out, re.M)
    assert found, out
    assert f"net_interface.0.ip = '{found.group(1)}'" in out and "\n    system ps_0 (\n" in out
    assert "the local nodes IM adopts (DeployedNode), made first:" in out
    assert f"network namespace tfc_{CLUSTER}_{CLUSTER}-ps-0 at {found.group(1)}/24" in out
    assert "never halt themselves" in out
    assert_no_secret(out + res.stderr, auth_file, private_key_sent=True)
    assert requests == []
    assert_nothing_created(home, CLUSTER, plan_tmp)


def test_plan_without_an_auth_file_exits_2(home, listener):
    url, requests = listener
    res = run_cli("plan", "--cluster", CLUSTER, "--provider", "im", "--set", f"provider_options.im_url={url}",
                  "--set", "storage.bucket=tfct-runs", home=home, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "provider_options.auth_file" in lines[0] and "allowed" in lines[0]
    assert requests == [] and list(home.iterdir()) == []
