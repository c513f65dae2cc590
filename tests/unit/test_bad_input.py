"""Every user-facing input refused before anything is created: exit status 2, the field named."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.unit.test_config import _cluster_traces

# (id, file text or None, CLI arguments after `up`, text that must name the field)
CASES = [
    ("file: negative workers", "nodes:\n  worker:\n    count: -2\n", [], "nodes.worker.count"),
    ("file: unknown top key", "nodez: {}\n", [], "nodez"),
    ("file: unknown training key", "training:\n  epochs: 3\n", [], "training.epochs"),
    ("file: steps a word", "training:\n  steps: lots\n", [], "training.steps"),
    ("file: bucket uppercase", "storage:\n  bucket: MyBucket\n", [], "storage.bucket"),
    ("file: list at top", "- 1\n", [], "config file"),
    ("file: broken YAML", "nodes: [\n", [], "config file"),
    ("file: provider_options not a map", "provider_options: 3\n", [], "provider_options"),
    ("file: bad option name", "provider_options:\n  Bad-Key: 1\n", [], "provider_options.Bad-Key"),
    ("file: prefix with ..", "storage:\n  prefix: a/../b\n", [], "storage.prefix"),
    ("file: region malformed", "storage:\n  region: moon\n", [], "storage.region"),
    ("file: tf version", "tensorflow:\n  version: '2.x'\n", [], "tensorflow.version"),
    ("override: workers -1", None, ["--workers", "-1"], "nodes.worker.count"),
    ("override: ps 0", None, ["--ps", "0"], "nodes.ps.count"),
    ("override: steps 1.5", None, ["--steps", "1.5"], "training.steps"),
    ("override: unknown provider", None, ["--provider", "azure"], "provider"),
    ("override: cluster with dots", None, ["--cluster", "a.b"], "cluster"),
    ("override: --set unknown", None, ["--set", "training.epoch=1"], "training.epoch"),
    ("override: --set without =", None, ["--set", "training.steps"], "--set"),
    ("override: lr zero", None, ["--set", "training.learning_rate=0"], "training.learning_rate"),
    ("override: restarts negative", None, ["--set", "training.max_restarts=-1"], "training.max_restarts"),
    ("override: checkpoint interval negative", None, ["--set", "training.checkpoint_min_interval_seconds=-1"],
     "training.checkpoint_min_interval_seconds"),
    ("override: start timeout tiny", None, ["--set", "training.start_timeout_seconds=1"],
     "training.start_timeout_seconds"),
    ("override: endpoint not http", None, ["--set", "storage.endpoint=s3://x"], "storage.endpoint"),
    ("override: subnet too big", None, ["--set", "network.subnet=10.0.0.0/8"], "network.subnet"),
    ("override: ssh user", None, ["--set", "ssh.user=Root!"], "ssh.user"),
    ("model: missing file", None, ["--set", "training.model=/nope/model.py"], "training.model"),
    ("model: unknown bundled", None, ["--set", "training.model=alexnet"], "training.model"),
    ("model: bad file name", None, ["--set", "training.model=__FILE__"], "training.model"),
    ("provider option unknown to local", None, ["--set", "provider_options.region=x"],
     "provider_options.region"),
    ("local node memory too small", None, ["--set", "provider_options.node_memory_mb=128"],
     "provider_options.node_memory_mb"),
    ("local node memory with a unit", "provider_options:\n  node_memory_mb: 1G\n", [],
     "provider_options.node_memory_mb"),
    ("gpus on local", None, ["--set", "nodes.chief.gpus=1"], "nodes.chief.gpus"),
    ("local endpoint elsewhere", None, ["--set", "storage.endpoint=http://192.0.2.9:9000"], "storage.endpoint"),
    ("local ssh user", None, ["--set", "ssh.user=ubuntu"], "ssh.user"),
    ("file: not UTF-8", "\udcff", [], "config file"),
]


def run_case(command: str, home, tmp_path, text, args, env: dict | None = None):
    """``tfcluster COMMAND`` with a case's file text (written to a cluster file) and arguments (``__FILE__``:
    a model file with a bad module name), on cluster tfct-bad unless the case names one."""
    if text is not None:
        cfg = tmp_path / "cluster.yml"
        cfg.write_bytes(text.encode("utf-8", "surrogateescape"))
        args = ["-c", str(cfg), *args]
    if "__FILE__" in " ".join(args):
        bad = tmp_path / "my-model.v2.py"
        bad.write_text("def build_model():\n    pass\n")
        args = [a.replace("__FILE__", str(bad)) for a in args]
    cluster = [] if "--cluster" in args else ["--cluster", "tfct-bad"]
    return run_cli(command, *cluster, *args, home=home, env=env, timeout=60)


@pytest.mark.parametrize("case_id,text,args,field", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_naming_the_field_and_creates_nothing(home, tmp_path, case_id, text, args, field):
    res = run_case("up", home, tmp_path, text, args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "allowed" in lines[0], res.stderr
    assert list(home.iterdir()) == []
    assert _cluster_traces("tfct-bad") == []


def test_cli_usage_errors_exit_2(home):
    for args in (["up", "--no-such-flag"], ["frobnicate"], ["logs", "--lines", "many", "x"]):
        res = run_cli(*args, home=home, timeout=60)
        assert res.returncode == 2, (args, res.stderr)
    res = run_cli("logs", "--cluster", "tfct-bad", "nosuch-node", home=home, timeout=60)
    assert res.returncode == 2 and "node" in res.stderr and "nosuch-node" in res.stderr, res.stderr
    assert list(home.iterdir()) == []


def test_logs_of_an_unknown_node_or_none_name_the_nodes_whose_logs_were_fetched(home):
    """`make logs` on a cluster that is down: the nodes whose logs the last run fetched are the choice; with no
    NODE= at all, the same one line instead of argparse's usage."""
    run = home / "tfct-bad" / "logs" / "r1"
    for node in ("tfct-bad-chief-0", "tfct-bad-worker-0"):
        (run / node).mkdir(parents=True)
        (run / node / "node.log").write_text(f"{node} says hello\n")
    (home / "tfct-bad" / "run.json").write_text('{"run_id": "r1", "state": "verified"}')
    for args in (["tfct-bad-chief-9"], []):
        res = run_cli("logs", "--cluster", "tfct-bad", *args, home=home, timeout=60)
        assert res.returncode == 2, res.stdout + res.stderr
        assert res.stderr.strip().splitlines() == [
            f"tfcluster: error: invalid configuration: node (make logs NODE=...): got {(args or [''])[0]!r}; "
            "allowed: a node of cluster tfct-bad's last run, whose logs were fetched: tfct-bad-chief-0, "
            "tfct-bad-worker-0"]
    res = run_cli("logs", "--cluster", "tfct-bad", "tfct-bad-worker-0", home=home, timeout=60)
    assert res.returncode == 0 and "tfct-bad-worker-0 says hello" in res.stdout, res.stdout + res.stderr
    # without CLUSTER (make logs NODE=...): the node's name says its cluster
    res = run_cli("logs", "tfct-bad-worker-0", home=home, timeout=60)
    assert res.returncode == 0 and "tfct-bad-worker-0 says hello" in res.stdout, res.stdout + res.stderr
    assert res.stdout.startswith("(node tfct-bad-worker-0 of cluster tfct-bad)")
    res = run_cli("logs", "tfct-bad-worker-9", home=home, timeout=60)      # not one of them: its cluster's named
    assert res.returncode == 2 and res.stderr.strip().endswith(
        "allowed: a node of cluster tfct-bad's last run, whose logs were fetched: tfct-bad-chief-0, "
        "tfct-bad-worker-0"), res.stderr


def test_logs_finds_a_node_of_a_sweep_group_from_the_clusters_name(home):
    """A sweep's group k is cluster <name>-gk: `make logs` of the cluster finds its nodes' logs too, and the
    error for an unknown node names every group's nodes."""
    for cluster in ("tfct-bad", "tfct-bad-g1"):
        node = home / cluster / "logs" / "r1" / f"{cluster}-chief-0"
        node.mkdir(parents=True)
        (node / "node.log").write_text(f"{cluster} chief says hello\n")
        (home / cluster / "run.json").write_text('{"run_id": "r1", "state": "verified"}')
    (home / "tfct-bad" / "groups.json").write_text('{"groups": ["tfct-bad-g1"]}')
    res = run_cli("logs", "--cluster", "tfct-bad", "tfct-bad-g1-chief-0", home=home, timeout=60)
    assert res.returncode == 0 and "tfct-bad-g1 chief says hello" in res.stdout, res.stdout + res.stderr
    res = run_cli("logs", "--cluster", "tfct-bad", "tfct-bad-g2-chief-0", home=home, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().endswith(
        "whose logs were fetched: tfct-bad-chief-0; a node of cluster tfct-bad-g1's last run, whose logs were "
        "fetched: tfct-bad-g1-chief-0"), res.stderr
    (home / "tfct-bad" / "groups.json").unlink()          # as down leaves it: the groups gone, their logs kept
    res = run_cli("logs", "--cluster", "tfct-bad", "tfct-bad-g1-chief-0", home=home, timeout=60)
    assert res.returncode == 0 and "tfct-bad-g1 chief says hello" in res.stdout, res.stdout + res.stderr
