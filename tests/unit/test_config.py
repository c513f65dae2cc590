"""Configuration: defaults, precedence, and one clear error per bad value, with nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import QUIET_SUBNET, run_cli
from tfcluster import config
from tfcluster.errors import ConfigError


def test_defaults_give_a_local_run():
    spec = config.resolve()
    assert spec.provider == "local"
    assert (spec.count("ps"), spec.count("worker"), spec.count("chief")) == (1, 2, 1)
    assert spec.storage.bucket == "tfcluster"
    assert spec.training.model == "digits"
    assert spec.node_total == 4


def test_precedence_defaults_file_overrides(tmp_path):
    f = tmp_path / "c.yml"
    f.write_text("cluster: fromfile\nnodes:\n  worker:\n    count: 3\ntraining:\n  steps: 50\n")
    spec = config.resolve(config.load_file(f), {"training.steps": "70"})
    assert spec.cluster == "fromfile"          # file beats default
    assert spec.count("worker") == 3            # file beats default
    assert spec.training.steps == 70     # override beats file, and is converted
    assert spec.count("ps") == 1                # default stays


def test_cli_named_options_beat_set_and_file(tmp_path):
    from tfcluster.cli import build_parser, spec_from_args

    f = tmp_path / "c.yml"
    f.write_text("nodes:\n  worker:\n    count: 3\n")
    args = build_parser().parse_args(["validate", "-c", str(f), "--set", "nodes.worker.count=4",
                                      "--workers", "5", "--steps", "12", "--set", "training.checkpoint_every=3"])
    spec = spec_from_args(args)
    assert spec.count("worker") == 5
    assert spec.training.steps == 12
    assert spec.training.checkpoint_every == 3


def test_set_of_one_hparam_keeps_the_files_others(tmp_path):
    from tfcluster.cli import build_parser, spec_from_args

    f = tmp_path / "c.yml"
    f.write_text("training:\n  hparams: {units: 16, dropout: 0.1}\n")

    def hparams(*sets):
        args = build_parser().parse_args(["validate", "-c", str(f), *[a for s in sets for a in ("--set", s)]])
        return spec_from_args(args).training.hparams

    assert hparams("training.hparams.units=32", "training.hparams.act=relu") == {"units": 32, "dropout": 0.1,
                                                                                 "act": "relu"}
    assert hparams("training.hparams={depth: 2}", "training.hparams.units=8") == {"depth": 2, "units": 8}
    with pytest.raises(ConfigError) as err:
        config.parse_set("training.hparams.a.b=1")
    assert err.value.field == "training.hparams.a.b"
    for bad in ("[1, 2]", "5", "abc", "[[a, 1], [b, 2]]"):      # the file's own hparams not a mapping
        f.write_text(f"training:\n  hparams: {bad}\n")
        with pytest.raises(ConfigError) as err:
            hparams("training.hparams.units=32")
        assert err.value.field == "training.hparams", bad


def test_set_values_are_yaml_typed():
    assert config.parse_set("network.allowed_ssh_cidrs=[10.0.0.0/8]") == ("network.allowed_ssh_cidrs",
                                                                         ["10.0.0.0/8"])
    assert config.parse_set("training.learning_rate=0.5") == ("training.learning_rate", 0.5)


# (description, file text or None, overrides, field named in the message, allowed-text fragment)
BAD = [
    ("negative workers", None, {"nodes.worker.count": "-1"}, "nodes.worker.count", "integer"),
    ("no ps with parameter_server", None, {"nodes.ps.count": "0"}, "nodes.ps.count", "parameter_server"),
    ("two chiefs", None, {"nodes.chief.count": "2"}, "nodes.chief.count", "from 0 to 1"),
    ("ps with multi_worker_mirrored", None, {"strategy": "multi_worker_mirrored", "nodes.ps.count": "1"},
     "nodes.ps.count", "exactly 0 with strategy multi_worker_mirrored (it has no ps nodes: leave nodes.ps.count out, "
     "or set it to 0: PS=0 for make)"),
    ("unknown provider", None, {"provider": "azure"}, "provider", "local, aws, gcp, openstack, im"),
    ("bucket with capitals", None, {"storage.bucket": "My_Bucket"}, "storage.bucket", "S3 bucket name"),
    ("bucket like an IP", None, {"storage.bucket": "192.168.1.1"}, "storage.bucket", "not an IP"),
    ("bucket too short", None, {"storage.bucket": "ab"}, "storage.bucket", "3-63"),
    ("non-numeric steps", None, {"training.steps": "many"}, "training.steps", "integer"),
    ("zero steps", None, {"training.steps": "0"}, "training.steps", "integer"),
    ("unknown key in file", "clusterr: x\n", {}, "clusterr", "known keys"),
    ("unknown nested key", "training:\n  epochs: 3\n", {}, "training.epochs", "known keys"),
    ("cluster name with underscore", None, {"cluster": "my_cluster"}, "cluster", "lowercase"),
    ("cluster name too long", None, {"cluster": "a" * 21}, "cluster", "2-20"),
    ("cluster name trailing dash", None, {"cluster": "abc-"}, "cluster", "lowercase"),
    ("negative learning rate", None, {"training.learning_rate": "-0.1"}, "training.learning_rate", "> 0"),
    ("batch size a word", None, {"training.batch_size": "big"}, "training.batch_size", "integer"),
    ("tf version malformed", None, {"tensorflow.version": "latest"}, "tensorflow.version", "X.Y.Z"),
    ("endpoint not a URL", None, {"storage.endpoint": "ftp://x"}, "storage.endpoint", "http"),
    ("privileged tf port", None, {"network.tf_port": "80"}, "network.tf_port", "1024"),
    ("public subnet", None, {"network.subnet": "8.8.8.0/24"}, "network.subnet", "private"),
    ("bad ssh cidr", None, {"network.allowed_ssh_cidrs": "[0.0.0.0/99]"}, "network.allowed_ssh_cidrs", "CIDR"),
    ("max runtime a word", None, {"max_runtime_minutes": "forever"}, "max_runtime_minutes", "integer"),
    ("gpus on local", None, {"nodes.worker.gpus": "1"}, "nodes.worker.gpus", "local provider"),
    ("too many local nodes", None, {"nodes.worker.count": "20"}, "nodes", "at most 16"),
    ("model path missing", None, {"training.model": "/nonexistent/model.py"}, "training.model", "no such file"),
    ("unknown bundled model", None, {"training.model": "resnet"}, "training.model", "digits"),
    ("boolean steps", "training:\n  steps: true\n", {}, "training.steps", "integer"),
    ("top level not a mapping", "- a\n- b\n", {}, "config file", "mapping"),
    ("YAML that does not parse", "cluster: x\nnodes:\n  worker: {count: 2\ntraining:\n  steps: 5\n", {},
     "config file", "valid YAML (line 4, column 9: expected ',' or '}', but got ':' (a flow mapping from line 3, "
     "column 11))"),
    ("section not a mapping", "nodes: 3\n", {}, "nodes", "mapping"),
    ("max runtime zero", None, {"max_runtime_minutes": "0"}, "max_runtime_minutes", "integer"),
]


@pytest.mark.parametrize("desc,text,overrides,field,allowed", BAD, ids=[b[0] for b in BAD])
def test_bad_value_names_field_value_and_allowed(tmp_path, desc, text, overrides, field, allowed):
    file_values = {}
    if text is not None:
        f = tmp_path / "c.yml"
        f.write_text(text)
        with pytest.raises(ConfigError) as err:
            file_values = config.load_file(f)
            config.resolve(file_values, overrides)
    else:
        with pytest.raises(ConfigError) as err:
            config.resolve(file_values, overrides)
    msg = str(err.value)
    assert err.value.field == field, msg
    assert f"{field}:" in msg and "got" in msg and allowed in msg, msg


CLI_BAD = [
    (["--workers", "-1"], "nodes.worker.count", "-1"),
    (["--ps", "0"], "nodes.ps.count", "0"),
    (["--set", "strategy=multi_worker_mirrored", "--ps", "2"], "nodes.ps.count", "2"),
    (["--provider", "azure"], "provider", "azure"),
    (["--steps", "ten"], "training.steps", "ten"),
    (["--set", "storage.bucket=UPPER"], "storage.bucket", "UPPER"),
    (["--cluster", "Bad_Name"], "cluster", "Bad_Name"),
    (["--set", "nosuch.key=1"], "nosuch.key", "1"),
    (["--set", "training.steps"], "--set", "training.steps"),
]


@pytest.mark.parametrize("args,field,value", CLI_BAD, ids=[" ".join(a[0]) for a in CLI_BAD])
def test_cli_up_refuses_bad_input_with_status_2_and_creates_nothing(home, args, field, value):
    res = run_cli("up", "--cluster", "tfct-cfg", *args, home=home, timeout=60)
    assert res.returncode == 2, res.stderr + res.stdout
    err = res.stderr.strip().splitlines()
    assert len(err) == 1, res.stderr   # one message, no traceback
    assert f"{field}:" in err[0] and value in err[0] and "allowed:" in err[0], err[0]
    assert list(home.iterdir()) == []
    assert _cluster_traces("tfct-cfg") == [] and _cluster_traces(args[-1]) == []


def test_cli_missing_config_file(home):
    res = run_cli("up", "-c", str(home / "nope.yml"), home=home, timeout=60)
    assert res.returncode == 2
    assert "config file" in res.stderr and "nope.yml" in res.stderr
    assert list(home.iterdir()) == []


def test_validate_prints_resolved_config(home):
    res = run_cli("validate", "--workers", "3", "--set", f"network.subnet={QUIET_SUBNET}", home=home, timeout=60)
    assert res.returncode == 0, res.stderr
    assert '"count": 3' in res.stdout
    assert "configuration is valid" in res.stderr


def test_multi_worker_mirrored_has_no_ps_unless_set():
    spec = config.resolve({}, {"strategy": "multi_worker_mirrored"})
    assert (spec.count("ps"), spec.count("worker"), spec.count("chief")) == (0, 2, 1)
    assert config.resolve(spec.to_dict()).count("ps") == 0          # a saved spec reads back the same
    assert config.resolve({}, {"strategy": "multi_worker_mirrored", "nodes.ps.count": "0"}).count("ps") == 0
    assert config.resolve({}, {}).count("ps") == 1                   # parameter_server keeps its default


def _cluster_traces(cluster: str) -> list[str]:
    """Namespaces, bridge and veths a cluster of this name would have (other tests may run beside)."""
    from tfcluster import localnode

    found = [ns for ns in localnode.list_netns() if ns.startswith(f"tfc_{cluster}_")]
    found += localnode.list_links(localnode.bridge_name(cluster)) + localnode.list_links(localnode.veth_prefix(cluster))
    return found


def test_credentials_file_must_exist_and_be_private(tmp_path):
    creds = tmp_path / "s3.env"
    creds.write_text("AWS_ACCESS_KEY_ID=a\nAWS_SECRET_ACCESS_KEY=b\n")
    creds.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        config.resolve(overrides={"storage.credentials_file": str(creds)})
    creds.chmod(0o600)
    assert config.resolve(overrides={"storage.credentials_file": str(creds)}).storage.credentials_file == str(creds)
    with pytest.raises(ConfigError, match="no such file"):
        config.resolve(overrides={"storage.credentials_file": str(tmp_path / "nope")})


def test_saved_spec_loads_without_its_model_file(tmp_path):
    model = tmp_path / "mymodel.py"
    model.write_text("def build_model():\n    pass\n")
    saved = config.resolve(overrides={"training.model": str(model)}).to_dict()
    model.unlink()
    with pytest.raises(ConfigError):
        config.resolve(saved)
    assert config.resolve(saved, check_files=False).training.model == str(model)


def test_json_schema_accepts_what_validates_and_refuses_what_editors_should_flag():
    """`tfcluster schema`: a valid JSON Schema under which a resolved configuration and a partial cluster
    file pass, and an unknown key or a wrong type is flagged, as an editor would."""
    import json

    import jsonschema

    res = run_cli("schema", home=Path("/nonexistent"), timeout=60)
    assert res.returncode == 0, res.stderr
    schema = json.loads(res.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert list(validator.iter_errors(config.resolve().to_dict())) == []
    assert list(validator.iter_errors({"nodes": {"worker": {"count": 3}}, "training": {"steps": 50}})) == []
    assert [e.validator for e in validator.iter_errors({"training": {"epochs": 3}})] == ["additionalProperties"]
    assert [e.validator for e in validator.iter_errors({"nodes": {"worker": {"count": "many"}}})] == ["type"]
    assert [e.validator for e in validator.iter_errors({"nodes": {"chief": {"count": 2}}})] == ["maximum"]
    # each provider's options: its keys are completed, others flagged; plain values as YAML gives them
    assert list(validator.iter_errors({"provider": "aws", "provider_options": {"region": "eu-west-1", "spot": True,
                                                                               "root_volume_gb": 80}})) == []
    assert [e.validator for e in validator.iter_errors({"provider": "aws", "provider_options": {"colour": "red"}})] \
        == ["additionalProperties"]
    assert [e.validator for e in validator.iter_errors({"provider_options": {"region": "x"}})] \
        == ["additionalProperties"]     # no provider named: local, whose only option is node_memory_mb


def test_the_cluster_file_takes_exactly_the_registered_providers():
    """config.PROVIDERS (the providers import config, so it cannot ask them) names every registered one."""
    from tfcluster.providers.base import REGISTRY

    assert set(config.PROVIDERS) == set(REGISTRY)
    assert config.json_schema()["properties"]["provider"]["enum"] == list(config.PROVIDERS)


@pytest.mark.parametrize("subnet, derived", [("auto", True), ("10.231.77.0/24", False)])
def test_a_local_subnet_another_network_routes_is_refused_saying_where_it_came_from(tmp_path, monkeypatch, subnet,
                                                                                   derived):
    """A subnet routed on this machine already (another tool's, another cluster's) is refused; one derived from the
    cluster's name says so, and how to get another."""
    from tfcluster.errors import ConfigError
    from tfcluster.paths import ClusterState
    from tfcluster.providers import local

    spec = config.resolve({"cluster": "tfct-route", "network": {"subnet": subnet}})
    taken = local.subnet_for(spec)
    monkeypatch.setattr(local, "_routes", lambda: [(taken, "br-other")])
    with pytest.raises(ConfigError) as err:
        local.LocalProvider(ClusterState("tfct-route", root=tmp_path)).check(spec)
    message = str(err.value)
    assert f"network.subnet: got '{taken}'; allowed: a network not already routed on this machine ({taken} is on " \
           f"br-other)" in message
    assert ("derived from the cluster's name; another name derives another, or set network.subnet" in message) \
        == derived
