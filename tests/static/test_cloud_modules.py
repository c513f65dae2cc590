"""The cloud modules (terraform/gcp, terraform/openstack), checked without their providers.

No google or openstack provider can be installed on these machines, so the modules are never planned
or applied here. What is checked: formatting; that every .tf parses (python-hcl2); the intent of the
firewall and security-group rules, read from the parsed structure; exact provider pins; and the input
validations, evaluated by Terraform itself on ``variables.tf`` alone (that needs no provider).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import hcl2
import pytest

from tfcluster.errors import ConfigError
from tfcluster.paths import TERRAFORM_DIR
from tfcluster.providers.aws import AwsProvider
from tfcluster.providers.base import CONFIGURE_ALLOWANCE_MINUTES
from tfcluster.providers.gcp import GcpProvider
from tfcluster.providers.openstack import OpenstackProvider
from tfcluster.terraform import TERRAFORM_BIN, TerraformModule

MODULES = {"gcp": TERRAFORM_DIR / "gcp", "openstack": TERRAFORM_DIR / "openstack"}
#: the modules whose provider_options a provider class checks first (in Python) and the module again (in HCL)
PROVIDERS = {"aws": AwsProvider, "gcp": GcpProvider, "openstack": OpenstackProvider}
SOURCES = {"gcp": "hashicorp/google", "openstack": "terraform-provider-openstack/openstack"}
_HCL = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)


def terraform_env(tmp: Path) -> dict:
    """Offline and quiet: no checkpoint call, a CLI config of our own (the machine's points nowhere)."""
    rc = tmp / "terraform.rc"
    rc.write_text("disable_checkpoint = true\n")
    return dict(os.environ, CHECKPOINT_DISABLE="1", TF_CLI_CONFIG_FILE=str(rc), TF_IN_AUTOMATION="1", TF_INPUT="0")


def load(path: Path) -> dict:
    with path.open() as f:
        return hcl2.load(f, serialization_options=_HCL)


def module_config(name: str) -> dict[str, list]:
    """Top-level blocks of a module's .tf files (not its examples), merged by block kind."""
    merged: dict[str, list] = {}
    for path in sorted((TERRAFORM_DIR / name).glob("*.tf")):
        for kind, blocks in load(path).items():
            merged.setdefault(kind, []).extend(blocks)
    return merged


def resources(name: str, rtype: str) -> dict[str, dict]:
    found = {}
    for block in module_config(name).get("resource", []):
        for t, named in block.items():
            if t == rtype:
                found.update(named)
    return found


def resource_types(name: str) -> set[str]:
    return {t for block in module_config(name).get("resource", []) for t in block}


def local(name: str, key: str):
    for block in module_config(name)["locals"]:
        if key in block:
            return block[key]
    raise KeyError(key)


# --- formatting and parsing ----------------------------------------------------------------------

def test_terraform_fmt(tmp_path):
    res = subprocess.run([TERRAFORM_BIN, "fmt", "-check", "-recursive", "-diff", *map(str, MODULES.values())],
                         capture_output=True, text=True, env=terraform_env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("name", MODULES)
def test_every_tf_file_parses(name):
    files = sorted(MODULES[name].rglob("*.tf"))
    assert {p.name for p in files} >= {"main.tf", "variables.tf", "outputs.tf", "versions.tf"}
    assert list((MODULES[name] / "examples").rglob("*.tf")), "examples/ has no configuration"
    for path in files:
        assert load(path), path


@pytest.mark.parametrize("name", MODULES)
def test_provider_pinned_exactly(name):
    (terraform,) = module_config(name)["terraform"]
    assert terraform["required_version"].startswith(">=")
    (providers,) = terraform["required_providers"]
    (spec,) = providers.values()
    assert spec["source"] == SOURCES[name]
    assert re.fullmatch(r"\d+\.\d+\.\d+", spec["version"]), spec["version"]


def option_validations(name: str) -> list[str]:
    variables = {k: v for block in module_config(name)["variable"] for k, v in block.items()}
    return [v["condition"] for v in variables["provider_options"]["validation"]]


@pytest.mark.parametrize("name", PROVIDERS)
def test_option_keys_agree_between_module_and_provider_class(name):
    condition = option_validations(name)[0]
    listed = set(re.findall(r'\\?"([a-z_]+)\\?"', condition.split("contains(", 1)[1]))
    assert listed == set(PROVIDERS[name].options_model.model_fields) == set(PROVIDERS[name].options)


# --- what `make plan` says of the modules where no plan can run --------------------------------------
@pytest.mark.parametrize("name", ["local", "aws", "gcp", "openstack"])
def test_plan_lists_every_resource_the_module_declares(name):
    """`make plan` lists a module's resources from its .tf files (gcp, openstack: no provider, no plan here)."""
    declared = dict(TerraformModule(TERRAFORM_DIR / name, TERRAFORM_DIR / name).declared_resources())
    parsed = {f"{t}.{n}": body for t in resource_types(name) for n, body in resources(name, t).items()}
    assert set(declared) == set(parsed)
    for address, how in declared.items():
        kind = next((k for k in ("count", "for_each") if k in parsed[address]), None)
        assert how.split(" ", 1)[0] == (kind or ""), (address, how)
    assert TerraformModule(TERRAFORM_DIR / name, TERRAFORM_DIR / name).variable_description("instance_types")


def test_plan_states_the_boot_halt_the_cloud_modules_arm():
    """plan's boot-time halt (max_runtime_minutes + CONFIGURE_ALLOWANCE_MINUTES) is the modules' own."""
    for name in ("aws", "gcp"):
        blocks = [b for b in module_config(name)["locals"] if "configure_allowance_minutes" in b]
        assert [b["configure_allowance_minutes"] for b in blocks] == [CONFIGURE_ALLOWANCE_MINUTES], name
    assert f"var.max_runtime_minutes + {CONFIGURE_ALLOWANCE_MINUTES} " in \
        (TERRAFORM_DIR / "openstack" / "main.tf").read_text()


# --- option values: the module's regex validations and the provider's model agree ----------------------

_HCL_STRING = r'"((?:[^"\\]|\\.)*)"'
#: can(regex("PATTERN", lookup(var.provider_options, "KEY" or k, "DEFAULT")))
_REGEX_ON_OPTION = re.compile(rf'can\(regex\({_HCL_STRING}, lookup\(var\.provider_options, (?:"(\w+)"|k), '
                              rf'{_HCL_STRING}\)\)\)')
_FOR_KEYS = re.compile(r"alltrue\(\[for k in \[([^\]]*)\] :\s*(.*)\]\)", re.S)


def _unescape(text: str) -> str:
    """An HCL string literal's text (the pattern RE2 sees)."""
    return re.sub(r'\\(["\\nrt])', lambda m: {"n": "\n", "r": "\r", "t": "\t"}.get(m[1], m[1]), text)


def regex_validations(name: str) -> dict[str, tuple[str, bool]]:
    """Option -> (the pattern of a module validation ``can(regex(PATTERN, lookup(var.provider_options, KEY, ..)))``,
    whether regexes are the whole of that validation or only a part, e.g. digits besides a range)."""
    found = {}
    for condition in option_validations(name):
        matches = list(_REGEX_ON_OPTION.finditer(condition))
        loop = _FOR_KEYS.search(condition)
        loop_keys = re.findall(r'"(\w+)"', loop[1]) if loop else []
        rest = _REGEX_ON_OPTION.sub("", _FOR_KEYS.sub(lambda m: m[2], condition))
        whole = re.fullmatch(r"[\s${}&]*", rest) is not None
        for m in matches:
            for key in [m[2]] if m[2] else loop_keys:
                found[key] = (_unescape(m[1]), whole)
    return found


_OPENSTACK_NAME = {"good": ["", "public", "my site", "x" * 255], "bad": ["a\nb", "a\rb", "x" * 256]}
#: option -> good values (both sides accept), bad values (the model refuses them, and the module's regex too
#: when it is the whole validation), context (other options the value needs), stricter (values the module's
#: regex accepts and the model refuses: Python is stricter, never the other way round)
SAMPLES = {
    "aws": {
        "region": {"good": ["us-east-1", "eu-west-3", "us-gov-west-1"],
                   "bad": ["", "moon-1", "US-EAST-1", "us-east-1a", "us-east-12", "us_east_1", "us-east-1\n"]},
        "vpc_id": {"good": ["vpc-0123abcd", "vpc-0123456789abcdef0"], "context": {"subnet_id": "subnet-0123abcd"},
                   "bad": ["vpc-0123", "vpc-0123456789abcdef", "vpc-0123ABCD", "subnet-0123abcd", "vpc-0123abcd "],
                   "stricter": [""]},
        "subnet_id": {"good": ["subnet-0123abcd", "subnet-0123456789abcdef0"],
                      "bad": ["subnet-xyz", "sub-0123abcd", "subnet-0123abcd0"], "stricter": [""]},
        "availability_zone": {"good": ["us-east-1a", "eu-west-3c"],
                              "bad": ["us-east-1", "us-east-1-a", "US-EAST-1A"], "stricter": [""]},
        "endpoint": {"good": ["http://127.0.0.1:5000", "https://moto.example.org/", "http://[::1]:5000"],
                     "bad": ["ftp://127.0.0.1:1", "http://host/path", "127.0.0.1:5000", "http://a b"],
                     "stricter": [""]},
        "root_volume_gb": {"good": ["8", "50", "16384"], "bad": ["", "-1", "8.0", " 50", "+50", "fifty", "7", "16385"]},
    },
    "gcp": {
        "project": {"good": ["my-project-123", "abcdef", "a" + "b" * 29],
                    "bad": ["", "My-Project", "1project", "proj", "my-project-", "a" + "b" * 30]},
        "zone": {"good": ["us-central1-a", "europe-west4-b"],
                 "bad": ["", "us-central1", "europe-west4", "us-central-a", "US-central1-a"]},
        "network": {"good": ["", "default", "projects/p/global/networks/n"], "bad": ["-net", "my net", "net\n"]},
        "subnetwork": {"good": ["", "lab", "regions/us-central1/subnetworks/lab"], "context": {"network": "n"},
                       "bad": ["/lab", "my lab"]},
        "service_account_email": {"good": ["", "nodes@my-project-123.iam.gserviceaccount.com"],
                                  "bad": ["me@example.com", "Nodes@p.iam.gserviceaccount.com"]},
        "gpu_type": {"good": ["nvidia-tesla-t4", "nvidia-l4"], "bad": ["", "nvidia-", "tesla-t4", "NVIDIA-L4"]},
    },
    "openstack": {
        "cloud": _OPENSTACK_NAME,
        "region": _OPENSTACK_NAME,
        "external_network": {**_OPENSTACK_NAME, "context": {"network": "lab", "floating_ip": "false"}},
        "network": _OPENSTACK_NAME,
        "flavor": {**_OPENSTACK_NAME, "good": ["", "m1.large", "x" * 255], "stricter": ["m1 large"]},
        "availability_zone": _OPENSTACK_NAME,
    },
}
#: what every sample adds unless its own context says otherwise (options a provider requires)
BASE_OPTIONS = {"aws": {}, "gcp": {"project": "my-project-123"}, "openstack": {"external_network": "public"}}


def model_accepts(name: str, key: str, value: str, context: dict) -> bool:
    try:
        PROVIDERS[name].parse_options({**BASE_OPTIONS[name], **context, key: value})
    except ConfigError as exc:
        assert exc.field == f"provider_options.{key}", f"the sample's context is refused: {exc}"
        return False
    return True


@pytest.mark.parametrize("name", PROVIDERS)
def test_module_regexes_and_provider_model_agree_on_values(name):
    validations = regex_validations(name)
    assert validations and set(validations) == set(SAMPLES[name]), "a sample table per regex-validated option"
    for key, (pattern, whole) in validations.items():
        samples = SAMPLES[name][key]
        context = samples.get("context", {})
        for value in samples["good"]:
            assert re.fullmatch(pattern, value), (key, value, "the module refuses a good value")
            assert model_accepts(name, key, value, context), (key, value, "the model refuses a good value")
        for value in samples["bad"]:
            assert not model_accepts(name, key, value, context), (key, value, "the model accepts a bad value")
            if whole:
                assert not re.fullmatch(pattern, value), (key, value, "the module accepts what the model refuses")
        for value in samples.get("stricter", []):
            assert re.fullmatch(pattern, value) and not model_accepts(name, key, value, context), (key, value)


# --- GCP: firewall intent --------------------------------------------------------------------------

def test_gcp_firewall_ssh_only_from_allowed_cidrs_and_grpc_only_between_members():
    assert local("gcp", "tag") == "tfcluster-${var.cluster_name}"
    tag = ["${local.tag}"]
    rules = resources("gcp", "google_compute_firewall")
    allows = {n: r for n, r in rules.items() if "allow" in r}
    denies = {n: r for n, r in rules.items() if "deny" in r}
    assert allows and denies
    ssh = grpc = 0
    for name, rule in allows.items():
        assert rule["direction"] == "INGRESS" and rule["target_tags"] == tag, name
        ports = [p for a in rule["allow"] for p in a.get("ports", [])]
        assert ports, f"{name}: an allow rule without ports opens every port"
        if ports == ["22"]:
            assert rule["source_ranges"] == "${var.allowed_ssh_cidrs}", name
            assert "source_tags" not in rule, name
            ssh += 1
        elif ports == ["${tostring(var.tf_port)}"]:
            assert rule["source_tags"] == tag, f"{name}: gRPC must come from cluster members only"
            assert "source_ranges" not in rule, f"{name}: gRPC must never come from an address range"
            grpc += 1
        else:
            pytest.fail(f"{name}: unexpected allowed ports {ports}")
    assert (ssh, grpc) == (1, 1)
    for name, rule in denies.items():
        assert rule["deny"] == [{"protocol": "all"}] and rule["source_ranges"] == ["0.0.0.0/0"], name
        assert rule["target_tags"] == tag, name
        assert all(rule["priority"] > a["priority"] for a in allows.values()), f"{name} must rank below the allows"
        assert rule["priority"] < 65534, f"{name} must rank above the default network's permissive rules"


def test_gcp_instances_carry_the_tag_the_key_the_identity_and_the_run_limit():
    (node,) = resources("gcp", "google_compute_instance").values()
    assert node["tags"] == ["${local.tag}"]
    meta = node["metadata"]
    assert "var.ssh_public_key" in meta["ssh-keys"] and "local.ssh_user" in meta["ssh-keys"]
    assert meta["block-project-ssh-keys"] == "true"
    assert meta["startup-script"] == "${local.startup_script}"
    # a backstop from boot: max_runtime_minutes plus the configuration allowance (tf_node re-arms the halt
    # from the run's deadline); Compute Engine deletes the VM no earlier than that
    assert "shutdown -h +${local.halt_after_minutes}" in local("gcp", "startup_script")
    assert local("gcp", "halt_after_minutes") == "${var.max_runtime_minutes + local.configure_allowance_minutes}"
    assert local("gcp", "configure_allowance_minutes") >= 30
    (sched,) = node["scheduling"]
    assert sched["instance_termination_action"] == "DELETE"
    assert sched["max_run_duration"] == [{"seconds": "${local.halt_after_minutes * 60}"}]
    dynamic = {name: block for d in node["dynamic"] for name, block in d.items()}
    # only the jobs whose tasks use storage run as the service account: a ps VM has none
    sa = dynamic["service_account"]
    assert sa["for_each"] == ("${contains(var.storage_access.jobs, each.value.role) ? "
                              "[local.service_account_email] : []}")
    assert sa["content"] == [{"email": "${service_account.value}",
                              "scopes": ["https://www.googleapis.com/auth/devstorage.read_write"]}]
    gpu = dynamic["guest_accelerator"]
    assert gpu["content"][0]["count"] == "${local.gpus[each.value.role]}"
    assert '"TERMINATE"' in local("gcp", "on_host_maintenance")


def test_gcp_identity_is_limited_to_the_cluster_runs_and_its_data():
    """Two conditional bucket-level grants and nothing else: objectUser on the cluster's runs, objectViewer on
    each data prefix (issue 14: no bucket-wide objectAdmin); conditions need uniform bucket-level access."""
    types = resource_types("gcp")
    assert not {t for t in types if t.startswith(("google_project_iam", "google_service_account_key"))}, types
    assert not {t for t in types if t.endswith(("_iam_binding", "_iam_policy"))}, types  # members only: no
    members = resources("gcp", "google_storage_bucket_iam_member")                        # one else's grants lost
    assert set(members) == {"cluster_runs", "training_data"}
    runs, data = members["cluster_runs"], members["training_data"]
    assert (runs["role"], data["role"]) == ("roles/storage.objectUser", "roles/storage.objectViewer")
    for member in members.values():
        assert member["member"] == "serviceAccount:${google_service_account.nodes[0].email}"
    assert runs["bucket"] == "${data.google_storage_bucket.granted[var.bucket].name}"
    assert runs["condition"][0]["expression"] == "${local.cluster_runs_condition}"
    assert data["for_each"] == "${local.create_service_account ? local.data_grants : {}}"
    assert data["bucket"] == "${data.google_storage_bucket.granted[each.value.bucket].name}"
    assert data["condition"][0]["expression"] == "${each.value.condition}"
    (check,) = runs["lifecycle"][0]["precondition"]
    assert check["condition"] == '${startswith(var.storage_access.read_write, "${var.prefix}/")}'
    buckets = [named["granted"] for block in module_config("gcp")["data"]
               for dtype, named in block.items() if dtype == "google_storage_bucket"]
    assert [b["for_each"] for b in buckets] == ["${local.create_service_account ? local.granted_buckets : toset([])}"]
    (ubla,) = buckets[0]["lifecycle"][0]["postcondition"]
    assert ubla["condition"] == "${self.uniform_bucket_level_access == true}"


_CEL_TERM = re.compile(r'resource\.name\.startsWith\("([^"\\]*)"\)'
                       r'|api\.getAttribute\("storage\.googleapis\.com/objectListPrefix", ""\)'
                       r'\.startsWith\("([^"\\]*)"\)')


def cel_allows(expression: str, name: str, list_prefix: str | None = None) -> bool:
    """The conditions access.tf writes, evaluated for one request: ``name`` is the resource's name (an
    object's, or the bucket's for a listing with ``list_prefix``). Only the two forms of term it uses, joined
    by ``||``, are understood; anything else fails the test."""
    result = False
    for term in expression.split(" || "):
        match = _CEL_TERM.fullmatch(term)
        assert match, f"unexpected condition term {term!r}"
        obj, listing = match.groups()
        result |= name.startswith(obj) if obj is not None else (list_prefix or "").startswith(listing)
    return result


@pytest.mark.skipif(not Path(TERRAFORM_BIN).exists() and not shutil.which(TERRAFORM_BIN), reason="no terraform")
def test_gcp_conditions_evaluated_by_terraform(tmp_path):
    """The IAM conditions for a cluster file with data in another bucket, computed by tfcluster/access.py and
    rendered by Terraform itself (variables.tf and access.tf: no provider needed), then applied to the names
    the nodes use: the cluster's runs read-write and listable, exactly the data prefixes readable, no more."""
    from tfcluster.access import storage_access
    from tfcluster.config import resolve

    spec = resolve(overrides={"cluster": "exp1", "storage.bucket": "tfct-runs", "storage.prefix": "team/runs",
                              "data.train": "s3://tfct-data/sets/train-*.tfrecord",
                              "data.test": "s3://tfct-data/eval/"})
    shutil.copy(MODULES["gcp"] / "variables.tf", tmp_path / "variables.tf")
    shutil.copy(MODULES["gcp"] / "access.tf", tmp_path / "access.tf")
    inputs = {**GOOD, "bucket": "tfct-runs", "prefix": "team/runs", "provider_options": GOOD_OPTIONS["gcp"],
              "storage_access": storage_access(spec).module_input()}
    (tmp_path / "inputs.tfvars.json").write_text(json.dumps(inputs))
    env = terraform_env(tmp_path)
    subprocess.run([TERRAFORM_BIN, "init", "-input=false", "-backend=false"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=120)
    res = subprocess.run([TERRAFORM_BIN, "console", "-var-file=inputs.tfvars.json"], cwd=tmp_path, env=env,
                         input="jsonencode([local.cluster_runs_condition, local.data_grants, local.granted_buckets])\n",
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    runs, data, buckets = json.loads(json.loads(res.stdout))
    assert runs == ('resource.name.startsWith("projects/_/buckets/tfct-runs/objects/team/runs/exp1/") || '
                    'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("team/runs/exp1/")')
    assert data == {
        "tfct-data/eval/": {"bucket": "tfct-data", "prefix": "eval/", "condition":
                            'resource.name.startsWith("projects/_/buckets/tfct-data/objects/eval/")'},
        "tfct-data/sets/train-": {"bucket": "tfct-data", "prefix": "sets/train-", "condition":
                                  'resource.name.startsWith("projects/_/buckets/tfct-data/objects/sets/train-")'},
    }
    assert sorted(buckets) == ["tfct-data", "tfct-runs"]

    def obj(bucket: str, key: str) -> str:
        return f"projects/_/buckets/{bucket}/objects/{key}"

    run = "team/runs/exp1/20260101-abcd"
    for key in (f"{run}/checkpoints/ckpt-100.index", f"{run}/model/saved_model.pb", f"{run}/_SUCCESS"):
        assert cel_allows(runs, obj("tfct-runs", key)), key
    for prefix in (f"{run}/checkpoints/", f"{run}/_SUCCESS"):  # what the harness lists
        assert cel_allows(runs, "projects/_/buckets/tfct-runs", list_prefix=prefix), prefix
    for key in ("team/runs/exp2/x/_SUCCESS", "datasets/digits-0123456789ab/train.npz", "team/runs/exp1"):
        assert not cel_allows(runs, obj("tfct-runs", key)), key
    for prefix in ("", "team/runs/", "team/runs/exp2/"):
        assert not cel_allows(runs, "projects/_/buckets/tfct-runs", list_prefix=prefix), prefix
    readable = [g["condition"] for g in data.values()]
    for key in ("sets/train-00.tfrecord", "eval/part-0.tfrecord"):
        assert any(cel_allows(c, obj("tfct-data", key)) for c in readable), key
    for bucket, key in (("tfct-data", "sets/other.tfrecord"), ("tfct-data", "private/x"), ("tfct-runs", "eval/x")):
        assert not any(cel_allows(c, obj(bucket, key)) for c in readable), (bucket, key)
    assert not any(cel_allows(c, "projects/_/buckets/tfct-data", list_prefix="sets/") for c in readable)


# --- OpenStack: security-group intent --------------------------------------------------------------

def test_openstack_rules_ssh_only_from_allowed_cidrs_and_grpc_only_from_the_group():
    group = "${openstack_networking_secgroup_v2.cluster.id}"
    rules = resources("openstack", "openstack_networking_secgroup_rule_v2")
    assert set(resources("openstack", "openstack_networking_secgroup_v2")) == {"cluster"}
    ssh = grpc = 0
    for name, rule in rules.items():
        assert rule["security_group_id"] == group, name
        assert rule["direction"] == "ingress", f"{name}: only ingress rules are added (egress is Neutron's default)"
        assert rule["protocol"] == "tcp" and rule["port_range_min"] == rule["port_range_max"], name
        if rule["port_range_min"] == 22:
            assert rule["for_each"] == "${toset(var.allowed_ssh_cidrs)}", name
            assert rule["remote_ip_prefix"] == "${each.key}", name
            assert "remote_group_id" not in rule, name
            ssh += 1
        elif rule["port_range_min"] == "${var.tf_port}":
            assert rule["remote_group_id"] == group, f"{name}: gRPC must come from the cluster's group only"
            assert "remote_ip_prefix" not in rule, f"{name}: gRPC must never come from an address range"
            grpc += 1
        else:
            pytest.fail(f"{name}: unexpected port {rule['port_range_min']}")
    assert (ssh, grpc) == (1, 1)


def test_openstack_ports_carry_only_the_cluster_group():
    (port,) = resources("openstack", "openstack_networking_port_v2").values()
    assert port["security_group_ids"] == ["${openstack_networking_secgroup_v2.cluster.id}"]
    assert port["port_security_enabled"] is True
    (server,) = resources("openstack", "openstack_compute_instance_v2").values()
    assert "security_groups" not in server, "groups belong on the port, or the project default group applies"
    assert server["network"] == [{"port": "${openstack_networking_port_v2.node[each.key].id}"}]
    assert server["key_pair"] == "${openstack_compute_keypair_v2.run.name}"
    (keypair,) = resources("openstack", "openstack_compute_keypair_v2").values()
    assert keypair["public_key"] == "${trimspace(var.ssh_public_key)}"


def test_openstack_creates_no_credentials_and_limits_the_run():
    types = resource_types("openstack")
    assert not {t for t in types if "credential" in t or t.startswith("openstack_identity")}, types
    template = (MODULES["openstack"] / "templates" / "user-data.yaml.tftpl").read_text()
    assert template.startswith("#cloud-config\n")
    assert '[shutdown, -h, "+${minutes}"' in template
    assert "minutes        = var.max_runtime_minutes + 60 " in (MODULES["openstack"] / "main.tf").read_text()


# --- default images: Debian 12 (Python 3.11) everywhere, and their users ---------------------------

def test_default_images_are_debian_12_with_their_users():
    images = [named["debian"] for block in module_config("gcp")["data"]
              for dtype, named in block.items() if dtype == "google_compute_image"]
    assert [(i["family"], i["project"]) for i in images] == [("debian-12", "debian-cloud")]
    assert local("gcp", "ssh_user") == '${var.ssh_user == "" ? "debian" : var.ssh_user}'
    assert "data.google_compute_image.debian" in local("gcp", "image")
    assert local("openstack", "ssh_user") == '${var.ssh_user == "" ? "debian" : var.ssh_user}'
    assert 'create_user    = local.ssh_user != "debian"' in (MODULES["openstack"] / "main.tf").read_text()


OPENSTACK_IMAGES = {"debian-12-genericcloud-amd64": True, "Debian 12 bookworm": True, "debian12": True,
                    "debian-12": True, "debian-120": False, "Debian 11 bullseye": False, "ubuntu-22.04": False}


@pytest.mark.skipif(not Path(TERRAFORM_BIN).exists() and not shutil.which(TERRAFORM_BIN), reason="no terraform")
def test_openstack_default_image_regex_finds_debian_12_only(tmp_path):
    """Evaluated by Terraform itself (RE2, as the image lookup's name_regex is by the provider's Go code)."""
    pattern = re.search(r'lookup\(local.opts, "image_regex", "([^"]+)"\)',
                        (MODULES["openstack"] / "main.tf").read_text()).group(1)
    names = json.dumps(list(OPENSTACK_IMAGES))
    expr = f'jsonencode([for n in {names} : length(regexall("{pattern}", n)) > 0])\n'
    res = subprocess.run([TERRAFORM_BIN, "console"], input=expr, capture_output=True, text=True, cwd=tmp_path,
                         env=terraform_env(tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(json.loads(res.stdout)) == list(OPENSTACK_IMAGES.values())


# --- input validations, evaluated by Terraform on variables.tf alone -------------------------------

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGQ3 tfcluster\n"
GOOD = {
    "cluster_name": "exp1", "ps_count": 1, "worker_count": 2, "chief_count": 1,
    "instance_types": {"ps": "", "worker": "", "chief": ""}, "images": {"ps": "", "worker": "", "chief": ""},
    "gpus": {"ps": 0, "worker": 0, "chief": 0}, "ssh_public_key": KEY, "ssh_user": "",
    "allowed_ssh_cidrs": ["203.0.113.0/24"], "tf_port": 2222, "bucket": "tfcluster", "prefix": "runs",
    "max_runtime_minutes": 60,
    "storage_access": {"jobs": ["worker", "chief"], "read_write": "runs/exp1/",
                       "read": [{"bucket": "tfcluster", "prefix": "datasets/digits-"}]},
}
GOOD_OPTIONS = {"gcp": {"project": "my-project-123"}, "openstack": {"external_network": "public"}}
# (module, input, bad value, text the error must contain)
BAD = [
    ("gcp", "allowed_ssh_cidrs", [], "at least one CIDR"),
    ("gcp", "allowed_ssh_cidrs", ["2001:db8::/48"], "IPv4 CIDR"),
    ("gcp", "provider_options", {}, "provider_options.project: required"),
    ("gcp", "provider_options", {"project": "my-project-123", "colour": "red"}, "known keys are"),
    ("gcp", "provider_options", {"project": "my-project-123", "zone": "us-east1-b", "region": "us-west1"},
     "provider_options.region"),
    ("gcp", "provider_options", {"project": "my-project-123", "subnetwork": "s"}, "needs provider_options.network"),
    ("gcp", "gpus", {"worker": 3}, "0, 1, 2, 4, 8 or 16"),
    ("gcp", "provider_options", {"project": "my-project-123", "public_ip": "false"}, "only through NAT"),
    ("gcp", "provider_options", {"project": "my-project-123", "public_ip": "false", "network": "n"},
     "network_has_nat true"),
    ("gcp", "ssh_user", "root", "other than root"),
    ("gcp", "storage_access", {**GOOD["storage_access"], "jobs": ["boss"]}, "storage_access.jobs"),
    ("gcp", "storage_access", {**GOOD["storage_access"], "read_write": "runs/exp1"}, "ending in '/'"),
    ("gcp", "storage_access", {**GOOD["storage_access"], "read": [{"bucket": "tfcluster", "prefix": "a$b/"}]},
     "storage_access.read"),
    ("openstack", "allowed_ssh_cidrs", [], "at least one CIDR"),
    ("openstack", "provider_options", {}, "provider_options.external_network: required"),
    ("openstack", "provider_options", {"external_network": "public", "colour": "red"}, "known keys are"),
    ("openstack", "provider_options", {"external_network": "public", "floating_ip": "yes"}, "true or false"),
    ("openstack", "provider_options", {"external_network": "public", "volume_size_gb": "-1"}, "volume_size_gb"),
    ("openstack", "tf_port", 80, "1024 to 65535"),
]


@pytest.fixture(scope="module")
def validation_dirs(tmp_path_factory):
    """One initialised directory per module holding only its variables.tf (no provider needed)."""
    dirs = {}
    for name, module in MODULES.items():
        work = tmp_path_factory.mktemp(f"vars-{name}")
        shutil.copy(module / "variables.tf", work / "variables.tf")
        env = terraform_env(work)
        res = subprocess.run([TERRAFORM_BIN, "init", "-input=false", "-backend=false"], cwd=work,
                             capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        dirs[name] = (work, env)
    return dirs


def plan(dirs, name: str, inputs: dict) -> subprocess.CompletedProcess:
    work, env = dirs[name]
    (work / "inputs.tfvars.json").write_text(json.dumps(inputs))
    return subprocess.run([TERRAFORM_BIN, "plan", "-input=false", "-no-color", "-var-file=inputs.tfvars.json"],
                          cwd=work, capture_output=True, text=True, env=env)


@pytest.mark.parametrize("name", MODULES)
def test_good_inputs_pass_validation(validation_dirs, name):
    res = plan(validation_dirs, name, {**GOOD, "provider_options": GOOD_OPTIONS[name]})
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(("name", "field", "value", "message"), BAD,
                         ids=[f"{b[0]}-{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_inputs_fail_validation_naming_what_is_allowed(validation_dirs, name, field, value, message):
    res = plan(validation_dirs, name, {**GOOD, "provider_options": GOOD_OPTIONS[name], field: value})
    assert res.returncode != 0
    assert message in " ".join(res.stderr.split()), res.stderr
