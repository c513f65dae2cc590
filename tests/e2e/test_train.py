"""End to end on the local provider: make up train down trains a real model and leaves it in S3.

One cluster serves the whole module (configuring nodes is the slow part): a default run, a second
configure that must change nothing, a run whose training fails, the down guard, and teardown.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import textwrap

import pytest

from tests.conftest import PYTHON, REPO, needs_root
from tests.integration.helpers import force_down, leftovers, make, ssh
from tests.reliability.runs import node_log

pytestmark = [pytest.mark.e2e, needs_root()]
CLUSTER = "tfct-e2e"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("e2e") / "state"
    h.mkdir()
    yield h
    force_down(h, CLUSTER)
    assert leftovers(h, CLUSTER) == []


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


def tfcluster(home, artifacts, *args, timeout=900):
    env = dict(os.environ, TFCLUSTER_HOME=str(home), TFCLUSTER_ARTIFACTS=str(artifacts), PYTHONUNBUFFERED="1")
    return subprocess.run([PYTHON, "-m", "tfcluster", *args, "--cluster", CLUSTER], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def s3_client(home):
    os.environ["TFCLUSTER_HOME"] = str(home)
    try:
        from tfcluster import config, store

        return store.client(config.resolve())
    finally:
        os.environ.pop("TFCLUSTER_HOME")


@pytest.fixture(scope="module")
def trained(home, artifacts):
    up = make("up", home, CLUSTER=CLUSTER, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    res = make("train", home, CLUSTER=CLUSTER, env={"TFCLUSTER_ARTIFACTS": str(artifacts)}, timeout=1500)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    return res


def test_train_publishes_a_verified_model(home, artifacts, trained):
    out = trained.stdout
    assert re.search(r"step \d+/600 \(\d+%\), loss [0-9.]+", out), "no training progress shown"
    acc = float(re.search(r"^test accuracy: ([0-9.]+)$", out, re.M).group(1))
    assert acc >= 0.90, out[-3000:]

    run = json.loads((home / CLUSTER / "run.json").read_text())
    assert run["state"] == "verified"
    bucket, prefix = re.match(r"s3://([^/]+)/(.+)/$", run["s3_prefix"]).groups()
    s3 = s3_client(home)
    keys = {o["Key"][len(prefix) + 1:] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]}
    assert {"_SUCCESS", "manifest.json", "metrics.json"} <= keys
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())
    assert any(k.endswith("saved_model.pb") for k in manifest["files"])
    for rel, meta in manifest["files"].items():   # every hash, read back independently
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}/{rel}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == meta["sha256"], rel
    metrics = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/metrics.json")["Body"].read())
    assert metrics["test_accuracy"] >= 0.90 and metrics["steps"] == 600
    local = artifacts / CLUSTER / run["run_id"]
    assert (local / "manifest.json").exists() and (local / "_SUCCESS").exists()

    for node in ("ps-0", "worker-0", "worker-1", "chief-0"):
        assert (home / CLUSTER / "logs" / run["run_id"] / f"{CLUSTER}-{node}" / "node.log").exists()


def test_status_and_logs(home, artifacts, trained):
    res = tfcluster(home, artifacts, "status")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "task: succeeded" in res.stdout and "verified" in res.stdout
    assert res.stdout.count("task: stopped") == 3       # ps and workers were stopped after the run
    res = tfcluster(home, artifacts, "logs", f"{CLUSTER}-chief-0")
    assert res.returncode == 0 and "task succeeded" in res.stdout, res.stdout + res.stderr


def test_tasks_ran_as_an_unprivileged_user_behind_the_node_firewall(home, artifacts, trained):
    """The training task is the `tfcluster` user's (what it wrote is that user's; the credentials' directory
    stays root's); each node's firewall lets the TensorFlow port answer the cluster's members only, and the host
    (any local user) gets a reset from it."""
    nodes = json.loads((home / CLUSTER / "nodes.json").read_text())
    members = sorted(n["private_ip"] for n in nodes)
    for n in nodes:
        out = ssh(home, CLUSTER, n["private_ip"], "stat -c '%U %a' /var/lib/tfcluster/task "
                  "/var/lib/tfcluster/task/status.json /etc/tfcluster; nft list table inet tfcluster_node")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        # the credentials' directory (their file exists only while the tasks run) stays root's alone
        assert lines[:3] == ["tfcluster 750", "tfcluster 644", "root 700"], (n["name"], lines[:3])
        rule = next(line for line in lines if "accept" in line and "2222" in line)
        assert sorted(re.findall(r"\d+\.\d+\.\d+\.\d+", rule)) == members, rule
        assert any("2222 reject with tcp reset" in line for line in lines), lines
        # the warm interpreter each task was forked from is the same user's, in a directory of its own
        warm = ssh(home, CLUSTER, n["private_ip"], "stat -c '%U %a' /var/lib/tfcluster/warm && ps -o user= -p "
                   "$(python3 -c \"import json; print(json.load(open('/var/lib/tfcluster/warm/warm.json'))['pid'])\")")
        assert warm.stdout.split() == ["tfcluster", "700", "tfcluster"], (n["name"], warm.stdout, warm.stderr)
    probe = (f"import socket\ntry:\n    socket.create_connection(('{members[0]}', 2222), timeout=5)\n"
             "    print('open')\nexcept OSError as e:\n    print(type(e).__name__)")
    res = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=30)
    assert res.stdout.strip() == "ConnectionRefusedError", res.stdout + res.stderr


def test_second_configure_changes_nothing(home, artifacts, trained):
    # every node holds the digest of what configure would apply: nothing to do, no playbook
    res = tfcluster(home, artifacts, "configure")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "every node is configured with this content already" in res.stdout, res.stdout[-3000:]
    assert "PLAY RECAP" not in res.stdout
    # the playbook itself, asked for, finds nothing to change either
    res = tfcluster(home, artifacts, "configure", "--full")
    assert res.returncode == 0, res.stdout[-4000:]
    recap = re.findall(rf"^\s*({CLUSTER}-\S+)\s+: ok=\d+\s+changed=(\d+)", res.stdout, re.M)
    assert len(recap) == 4 and all(changed == "0" for _, changed in recap), recap


def test_a_run_stopped_after_its_chief_published_is_verified_not_trained_again(home, artifacts, trained):
    """Ctrl-C (or a lost controller) can land after the chief published but before the controller saw it:
    the record says interrupted while the model is whole in S3. The next train verifies that run."""
    path = home / CLUSTER / "run.json"
    run = json.loads(path.read_text())
    assert run["state"] == "verified"
    path.write_text(json.dumps(dict(run, state="interrupted")))
    res = tfcluster(home, artifacts, "train", "--skip-configure")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert f"resuming run {run['run_id']}" in res.stdout
    assert f"run {run['run_id']} was published before it was stopped: verifying it" in res.stdout
    assert "start the tasks" not in res.stdout
    after = json.loads(path.read_text())
    assert after["state"] == "verified" and after["run_id"] == run["run_id"]
    assert after["test_accuracy"] == run["test_accuracy"]


@pytest.mark.parametrize("example, headline, good", [("diabetes", "mae", lambda v: v < 48),
                                                      ("cancer", "auc", lambda v: v > 0.97)])
def test_an_example_with_its_data_in_the_store_trains_on_the_same_cluster(home, artifacts, trained, example,
                                                                          headline, good):
    """The regression example (CSV shards) and the binary classifier (TFRecord shards), as a user runs them."""
    res = tfcluster(home, artifacts, "example-data")
    assert res.returncode == 0, res.stdout + res.stderr
    res = tfcluster(home, artifacts, "train", "-c", str(REPO / "examples" / f"{example}.yml"), timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    value = float(re.search(rf"^test {headline}: ([0-9.]+)$", res.stdout, re.M).group(1))
    # the chief's log (every progress line, the dispatch size, checkpoints, lost peers): a bad model's story
    assert good(value), res.stdout[-2000:] + "\nchief-0's log:\n" + harness_lines(home, "chief-0")
    assert re.search(r"^test loss: [0-9.]+$", res.stdout, re.M)
    run = json.loads((home / CLUSTER / "run.json").read_text())
    assert run["state"] == "verified" and run["headline"] == f"test_{headline}"
    files = run["data"]["train"]
    assert run["data"]["source"] == "files" and len(files) == 6 and all(f["etag"] and f["size"] for f in files)
    assert run["metrics"]["data"] == run["data"]        # metrics.json names the same files, each with its ETag


def harness_lines(home, node: str) -> str:
    """The lines the harness and its supervisor wrote to ``node``'s log in the newest run, TensorFlow's own
    (E0000 ..., gRPC details) left out."""
    noise = re.compile(r"^([EIW]\d{4} |Additional GRPC|:UNKNOWN:|This could happen|WARNING: All log|To enable)")
    lines = node_log(home, CLUSTER, node).splitlines()
    return "\n".join(line for line in lines if line.strip() and not noise.match(line))


def test_a_changed_make_dataset_trains_on_the_new_data(home, artifacts, trained, tmp_path):
    """Data sets are stored by content: changing make_dataset() gives a new data set, never the old copy. (The
    module's make_optimizer returns Keras's Adam: the chief says it runs it as LockedAdam.)"""
    (tmp_path / "rows.txt").write_text("100")
    module = tmp_path / "sized.py"
    module.write_text(textwrap.dedent("""\
        from pathlib import Path
        import numpy as np


        def make_dataset():
            n = int((Path(__file__).parent / "rows.txt").read_text())
            rng = np.random.default_rng(n)
            x = rng.random((4 * n, 4), dtype=np.float32)
            y = (x.sum(axis=1) > 2).astype(np.int64)
            return {"train": (x[n:], y[n:]), "test": (x[:n], y[:n])}


        def build_model():
            import keras
            return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(2)])


        def make_optimizer(learning_rate):      # Keras's own Adam: parameter_server runs it as LockedAdam
            import keras
            return keras.optimizers.Adam(learning_rate, beta_2=0.99)
        """))
    runs = []
    for rows in (100, 150):
        (tmp_path / "rows.txt").write_text(str(rows))
        res = tfcluster(home, artifacts, "train", "--set", f"training.model={module}", "--set", "training.steps=40",
                        timeout=900)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr
        assert f"{3 * rows} training and {rows} test examples" in res.stdout
        assert (f"{CLUSTER}-chief-0: make_optimizer's keras.optimizers.Adam runs as tfc_harness.optimizers.LockedAdam"
                in res.stdout), res.stdout[-4000:]
        runs.append(json.loads((home / CLUSTER / "run.json").read_text()))
        assert runs[-1]["metrics"]["test_examples"] == rows and runs[-1]["verified_metrics"]["n"] == rows
    # these later runs' tasks were forked by each node's warm interpreter, which the module's first run
    # started: none of them imported TensorFlow again
    for node in ("ps-0", "worker-0", "worker-1", "chief-0"):
        log = node_log(home, CLUSTER, node)
        assert "forked from the warm interpreter" in log and "warm interpreter: starting" not in log, log[-2000:]
    first, second = runs
    assert first["run_id"] != second["run_id"]
    assert first["data"]["sha256"] != second["data"]["sha256"]
    assert second["dataset_prefix"] == f"datasets/sized-{second['data']['sha256'][:12]}" != first["dataset_prefix"]


def test_failed_training_fetches_logs_and_down_guard(home, artifacts, trained, tmp_path):
    broken = tmp_path / "broken_model.py"
    broken.write_text(
        "import numpy as np\n\n\n"
        "def make_dataset():\n"
        "    rng = np.random.default_rng(0)\n"
        "    x, y = rng.random((64, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 64)\n"
        "    return {'train': (x, y), 'test': (x[:16], y[:16])}\n\n\n"
        "def build_model():\n"
        "    import keras\n"
        "    return keras.Sequential([keras.Input(shape=(8, 8, 1)), keras.layers.Flatten(),\n"
        "                             keras.layers.Dense(10)])\n\n\n"
        "def make_optimizer(learning_rate):   # only the chief calls it: the controller's checks pass\n"
        "    raise RuntimeError('injected model failure')\n")
    # the default restarts: the chief's error is one a restart would repeat, so it is not restarted at all
    res = tfcluster(home, artifacts, "train", "--set", f"training.model={broken}",
                    "--set", "max_runtime_minutes=5", timeout=900)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr
    # the chief's own error on the failure's first line
    assert ("training failed: the chief's task ended 'failed' (exit 6, restarts 0; not restarted: a restart would "
            "fail the same way): ModelModuleError: model module broken_model.py: "
            "make_optimizer() raised RuntimeError at line 17: injected model failure; logs in ") in res.stderr, \
        res.stderr[-3000:]
    run = json.loads((home / CLUSTER / "run.json").read_text())
    assert run["state"] == "failed"
    chief_log = home / CLUSTER / "logs" / run["run_id"] / f"{CLUSTER}-chief-0" / "node.log"
    assert "injected model failure" in chief_log.read_text()

    # a model published but not verified: down refuses, FORCE=1 goes ahead
    run["state"] = "unverified"
    (home / CLUSTER / "run.json").write_text(json.dumps(run))
    res = make("down", home, CLUSTER=CLUSTER)
    assert res.returncode != 0 and "refusing to destroy" in res.stderr, res.stdout + res.stderr
    assert leftovers(home, CLUSTER), "the guard must keep the cluster"
    res = make("down", home, CLUSTER=CLUSTER, FORCE="1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert leftovers(home, CLUSTER) == []


def test_make_all_with_bad_data_exits_2_and_leaves_nothing(tmp_path):
    """The data check runs before configure: a glob that matches nothing ends `make all` in seconds, and the
    cluster it brought up is gone."""
    cluster, home = "tfct-baddata", tmp_path / "state"
    home.mkdir()
    (tmp_path / "reg.py").write_text("import keras\nloss = 'mse'\ndef build_model():\n"
                                     "    return keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])\n")
    cfg = tmp_path / "bad.yml"
    cfg.write_text(f"cluster: {cluster}\ntraining: {{model: reg.py}}\n"
                   "data: {train: 's3://tfcluster/no/such/train-*.csv', test: 's3://tfcluster/no/such/test/', "
                   "format: csv, label: y}\n")
    try:
        res = make("all", home, CONFIG=str(cfg), timeout=600)
        assert res.returncode == 2, res.stdout[-3000:] + res.stderr
        assert "data.train: s3://tfcluster/no/such/train-*.csv matches no object" in res.stderr
        assert "configure" not in res.stdout.split("check the training job")[-1]
        assert leftovers(home, cluster) == []
    finally:
        force_down(home, cluster)
