"""`make plan` (`tfcluster plan`): what up would create, printed; nothing created; bad input exits 2 as up does.

The local plan runs Terraform's real plan of terraform/local (built-in resources only: nothing to download)
in a temporary directory; the aws plan is in tests/cloud/test_aws.py, the IM plan in tests/im/test_plan_im.py.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, run_cli
from tests.unit.test_bad_input import CASES, run_case
from tests.unit.test_config import _cluster_traces
from tfcluster import baked, localnode, terraform
from tfcluster.config import resolve
from tfcluster.paths import ClusterState
from tfcluster.plan import time_lines
from tfcluster.providers.aws import AwsProvider
from tfcluster.providers.local import LocalProvider, subnet_for

SECTIONS = ("nodes:", "network:", "time limits:", "model and data:", "what up would create:")
CLUSTER = "tfct-plan"


def plan_dirs(tmp: Path) -> list[str]:
    """The temporary directories plan works in (removed when it is done) under ``tmp``, the TMPDIR a test gives
    plan: its own, as tests on other workers plan at the same time."""
    return sorted(p.name for p in tmp.glob("tfcluster-plan-*"))


def assert_nothing_created(home: Path, cluster: str, plan_tmp: Path) -> None:
    """No cluster state (no directory, terraform.tfstate or nodes.json), no namespace, bridge or veth of the
    cluster, and no temporary directory of plan's left behind in its TMPDIR (``plan_tmp``)."""
    assert not (home / cluster).exists(), sorted(p.name for p in (home / cluster).rglob("*"))
    assert not [p for p in home.rglob("*") if p.name in ("terraform.tfstate", "nodes.json", ".terraform")]
    assert _cluster_traces(cluster) == []
    assert plan_dirs(plan_tmp) == []


def sections_in_order(out: str) -> list[str]:
    return [s for s in SECTIONS if f"\n{s}\n" in out]


def test_plan_local_prints_every_section_and_creates_nothing(home, plan_tmp):
    netns_before = [ns for ns in localnode.list_netns() if ns.startswith(f"tfc_{CLUSTER}_")]
    res = run_cli("plan", "--cluster", CLUSTER, "--workers", "3", home=home, env={"TMPDIR": str(plan_tmp)},
                  timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.index("nothing has been created") < out.index("\nnodes:\n")
    assert sections_in_order(out) == list(SECTIONS)
    spec = resolve(overrides={"cluster": CLUSTER, "nodes.worker.count": 3})
    subnet, bridge = subnet_for(spec), localnode.bridge_name(CLUSTER)
    # every node: role, type, image, GPUs and the address Terraform plans for it
    nodes = [f"{CLUSTER}-ps-0", *(f"{CLUSTER}-worker-{i}" for i in range(3)), f"{CLUSTER}-chief-0"]
    inputs = baked.local_inputs(spec)   # the node image of the configuration: built already, or up bakes it
    image = re.escape(f"{inputs.full_name}" if baked.find(inputs.key) else f"{inputs.full_name} (to bake)")
    for pos, name in enumerate(nodes):
        ip = ipaddress.ip_network(subnet)[10 + pos]
        assert re.search(rf"^  {name} +\w+ +namespace +{image} +0 +{ip}$", out, re.M), out
        assert f"network namespace tfc_{CLUSTER}_{name} at {ip}/24" in out
    # what the network exposes, the time limits and the model's place
    assert f"nodes on bridge {bridge} ({subnet}) without a default route" in out
    assert "each task ends 60 min after training starts" in out and "never halt themselves" in out
    assert f"model: s3://tfcluster/runs/{CLUSTER}/<run-id>/ at http://" in out
    # Terraform's own plan of the local module: the bridge, the apt proxy, one namespace per node
    assert "terraform plan of terraform/local/ (in a temporary directory, removed after): 7 to add, 0 to change, " \
           "0 to destroy" in out
    assert f"bridge {bridge} with address {ipaddress.ip_network(subnet)[1]}/24" in out and f"subnet {subnet}" in out
    assert [ns for ns in localnode.list_netns() if ns.startswith(f"tfc_{CLUSTER}_")] == netns_before == []
    assert_nothing_created(home, CLUSTER, plan_tmp)


PLAN_CASES = [c for c in CASES if c[0] in ("override: workers -1", "gpus on local", "local ssh user",
                                           "model: bad file name", "file: unknown training key")]


@pytest.mark.parametrize("case_id,text,args,field", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plan_bad_input_exits_2_as_up_does_and_creates_nothing(home, tmp_path, plan_tmp, case_id, text, args,
                                                               field):
    """The configuration's and the provider's checks, as up makes them: one line, exit status 2."""
    res = run_case("plan", home, tmp_path, text, args, env={"TMPDIR": str(plan_tmp)})
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "allowed" in lines[0] and "Traceback" not in res.stderr
    assert "\nnodes:\n" not in res.stdout
    assert list(home.iterdir()) == []
    assert_nothing_created(home, "tfct-bad", plan_tmp)


def test_an_aws_plan_without_credentials_shows_the_module_instead_of_failing(home, tmp_path, plan_tmp):
    """Terraform's plan of terraform/aws reads the account; where the standard chain finds no credentials (as on a
    machine without an account), plan says so and shows every other section, the module's inputs and resources:
    exit 0, nothing created, Terraform not run. (No request leaves the machine: the instance metadata lookup is
    off, the shared files are missing.)"""
    cfg = tmp_path / "aws.yml"
    cfg.write_text("cluster: tfct-plan-aws\nprovider: aws\nnetwork: {allowed_ssh_cidrs: [203.0.113.0/24]}\n"
                   "storage: {bucket: tfct-plan-bucket}\nprovider_options: {region: eu-west-1}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"), "TFCLUSTER_HOME": str(home), "TMPDIR": str(plan_tmp)}
    res = subprocess.run([PYTHON, "-m", "tfcluster", "plan", "-c", str(cfg)], capture_output=True, text=True,
                         env=env, timeout=240, cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sections_in_order(res.stdout) == list(SECTIONS)
    assert "terraform plan: not run: it needs AWS credentials, and the standard chain finds none here" in res.stdout
    assert "aws_security_group.cluster" in res.stdout and 'provider_options = {"region": "eu-west-1"}' in res.stdout
    assert_nothing_created(home, "tfct-plan-aws", plan_tmp)


def test_time_limits_local_never_halts_clouds_halt_at_boot_and_after_the_deadline(tmp_path):
    local = LocalProvider(ClusterState("x", root=tmp_path))
    lines = time_lines(resolve(overrides={"max_runtime_minutes": 30}), local, 0.0)
    assert "each task ends 30 min after training starts" in lines[0]
    assert "never halt themselves" in lines[1] and len(lines) == 2
    aws = AwsProvider(ClusterState("x", root=tmp_path))
    spec = resolve(overrides={"provider": "aws", "storage.bucket": "b-runs", "max_runtime_minutes": 30,
                              "network.allowed_ssh_cidrs": ["203.0.113.0/24"]})
    text = "\n".join(time_lines(spec, aws, 0.0))
    assert "each node halts 90 min after it boots (max_runtime_minutes + 60" in text
    assert "once training starts each node halts 40 min later (the deadline + 10" in text
    assert "the instance terminates" in text


def test_reading_a_plan_summary_changes_and_outputs():
    planned = {
        "resource_changes": [
            {"address": "a.x", "mode": "managed", "index": "n-ps-0", "change": {"actions": ["create"],
                                                                             "after": {"instance_type": "t"}}},
            {"address": "a.y", "mode": "managed", "change": {"actions": ["no-op"], "after": {}}},
            {"address": "a.z", "mode": "managed", "change": {"actions": ["delete", "create"], "after": {}}},
            {"address": "a.w", "mode": "managed", "change": {"actions": ["update"], "after": {}}},
            {"address": "d.v", "mode": "data", "change": {"actions": ["read"], "after": {}}},
        ],
        "planned_values": {"outputs": {"known": {"value": [1]}, "later": {}}},
        "output_changes": {"known": {"after_unknown": False}, "later": {"after_unknown": True}},
    }
    changes = terraform.resource_changes(planned)
    assert [(mark, address) for mark, address, _ in changes] == [("+", "a.x"), ("-/+", "a.z"), ("~", "a.w")]
    assert terraform.summary(changes) == "2 to add, 1 to change, 1 to destroy"
    assert terraform.planned_output(planned, "known") == [1]
    assert terraform.planned_output(planned, "later") is None
    assert terraform.planned_attributes(planned, "n-ps-0") == {"instance_type": "t"}


def test_make_plan_passes_up_knobs_and_is_in_the_help():
    res = subprocess.run(["make", "-n", "plan", "VENV=/nonexistent", "CLUSTER=c1", "PROVIDER=local", "PS=2",
                          "WORKERS=3", "STEPS=9", "CONFIG=x.yml", "STRATEGY=parameter_server"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert "/nonexistent/bin/tfcluster plan --config x.yml --cluster c1 --provider local --set " \
           "strategy=parameter_server --ps 2 --workers 3 --steps 9" in " ".join(res.stdout.split()), res.stdout
    res = subprocess.run(["make", "help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert re.search(r"plan .*creating nothing", res.stdout), res.stdout


def test_plan_refuses_a_model_module_up_would_refuse(home, tmp_path, plan_tmp):
    """The model module check up makes before creating anything (its interface, in a subprocess)."""
    model = tmp_path / "nobuild.py"
    model.write_text("def make_dataset():\n    return None\n")
    res = run_cli("plan", "--cluster", CLUSTER, "--set", f"training.model={model}", home=home,
                  env={"TMPDIR": str(plan_tmp)}, timeout=180)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "nobuild.py" in lines[0] and "build_model" in lines[0], res.stderr
    assert "\nnodes:\n" not in res.stdout
    assert_nothing_created(home, CLUSTER, plan_tmp)


def test_up_and_plan_refuse_another_shape_of_a_cluster_that_is_up(home, plan_tmp):
    """A cluster up with 2 workers: plan (and up, which runs the same checks) with 3 names the difference and
    exits 2, changing nothing; Terraform converging the nodes would break them (the local nodes' addresses and
    links follow their order). The same counts pass."""
    from tfcluster.cluster import save_spec

    state = ClusterState(CLUSTER, root=home)
    state.dir.mkdir()
    save_spec(state, resolve(overrides={"cluster": CLUSTER}))
    saved = state.spec.read_text()
    res = run_cli("plan", "--cluster", CLUSTER, "--workers", "3", "--set", "strategy=multi_worker_mirrored",
                  home=home, env={"TMPDIR": str(plan_tmp)}, timeout=240)
    assert res.returncode == 2, res.stdout + res.stderr
    assert (f"cluster {CLUSTER} is up with another shape: strategy parameter_server (this configuration's: "
            f"multi_worker_mirrored); 1 ps node(s) (nodes.ps.count here: 0); 2 worker node(s) (nodes.worker.count "
            f"here: 3); 'make down CLUSTER={CLUSTER}' and 'make up' with the new settings") in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and state.spec.read_text() == saved and sorted(
        p.name for p in state.dir.iterdir()) == ["spec.json"]
    res = run_cli("plan", "--cluster", CLUSTER, home=home, env={"TMPDIR": str(plan_tmp)}, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
