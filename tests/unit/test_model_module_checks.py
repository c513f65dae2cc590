"""The user's model module is imported (in a subprocess) and checked by `validate` and `up` before anything
is created: exit status 2, one line naming the module and what is wrong, no traceback, no cluster state (where
the job names files on a running local store, the listing that comes first may make the store's keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import QUIET_SUBNET, run_cli
from tests.unit.test_config import _cluster_traces

GOOD_MODEL = ("import keras\ndef build_model():\n"
              "    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])\n")

# (id, module text, extra cluster file text, what the one error line must say)
CASES = [
    ("syntax error", "def build_model(:\n    pass\n", "",
     "model module job.py: importing it raised SyntaxError"),
    ("import error", "import no_such_package_here\n" + GOOD_MODEL, "",
     "model module job.py: importing it raised ModuleNotFoundError: No module named 'no_such_package_here'"),
    ("no build_model", "def make_dataset():\n    return {}\n", "",
     "model module job.py has no build_model() function"),
    ("no data source", GOOD_MODEL + "loss = 'mse'\n", "",
     "model module job.py has no data: define make_dataset() or name files in the cluster file's data.train"),
    ("tfrecord without decode", GOOD_MODEL + "loss = 'mse'\n",
     "data:\n  train: s3://tfcluster/d/train-*\n  test: s3://tfcluster/d/test-*\n",
     "model module job.py has no decode(record) function; data.format tfrecord needs one"),
    ("a misspelt decode()", GOOD_MODEL + "loss = 'mse'\ndef decod(record):\n    return record, 0\n",
     "data:\n  train: s3://tfcluster/d/train-*\n  test: s3://tfcluster/d/test-*\n",
     "model module job.py has no decode(record) function (it defines decod(): a misspelt name?); data.format "
     "tfrecord needs one"),
    ("a misspelt metrics()", GOOD_MODEL + "loss = 'mse'\ndef make_dataset(): pass\n"
     "def metric():\n    return ['mae']\n", "",
     "model module job.py defines metric() but no metrics(): a run reads metrics only, and without it reports the "
     "loss alone"),
    ("loss Keras cannot resolve", GOOD_MODEL + "loss = 'mean_squired_error'\ndef make_dataset(): pass\n", "",
     "model module job.py: loss 'mean_squired_error' is not a Keras loss name"),
    ("metric Keras cannot resolve", GOOD_MODEL + "loss = 'mse'\ndef make_dataset(): pass\n"
     "def metrics():\n    return ['mean_absolut_error']\n", "",
     "model module job.py: metrics() returned 'mean_absolut_error', which is not a Keras metric name"),
    ("build_model raises", "def build_model():\n    raise ValueError('units must be > 0')\ndef make_dataset(): pass\n",
     "", "model module job.py: build_model() raised ValueError at line 2: units must be > 0"),
    ("hparams for a build_model without them", GOOD_MODEL + "def make_dataset(): pass\n",
     "training:\n  hparams: {units: 8}\n",
     "model module job.py: build_model() takes no parameter, but training.hparams is set"),
    ("an hparam build_model never reads", "import keras\ndef build_model(hparams):\n"
     "    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(hparams.get('units', 16))])\n"
     "def make_dataset(): pass\n", "training:\n  hparams: {units: 8, layrs: 2}\n",
     "model module job.py: build_model() never reads training.hparams 'layrs' (it reads units): a misspelt name"),
    # the controller has scikit-learn (make_dataset may use it), the nodes do not: imported at the top, the module
    # loads here and fails on every node; in a class body too (it runs when the module loads)
    ("a package the nodes lack, imported when it loads", GOOD_MODEL + "if True:\n    class Data:\n"
     "        from sklearn import datasets\nloss = 'mse'\ndef make_dataset(): pass\n", "",
     "model module job.py imports sklearn (scikit-learn) when it loads (line 6), which the nodes do not install "
     "(they have TensorFlow's packages, tensorflow-cpu-"),
]


# `up` runs the same check as `validate`: every case through validate, a few through up too.
RUNS = [("validate", *case) for case in CASES] + [("up", *case) for case in CASES if case[0] in (
    "syntax error", "no data source", "metric Keras cannot resolve",
    "a package the nodes lack, imported when it loads")]


@pytest.mark.parametrize("command,case_id,module,cluster_text,message", RUNS,
                         ids=[f"{r[0]}: {r[1]}" for r in RUNS])
def test_a_bad_model_module_is_refused_before_anything_exists(home, tmp_path, command, case_id, module,
                                                              cluster_text, message):
    (tmp_path / "job.py").write_text(module)
    cfg = tmp_path / "cluster.yml"
    training = cluster_text.removeprefix("training:\n") if cluster_text.startswith("training:\n") else ""
    cfg.write_text(f"cluster: tfct-mod\ntraining:\n  model: {tmp_path / 'job.py'}\n  steps: 10\n{training}"
                   + ("" if training else cluster_text))
    res = run_cli(command, "-c", str(cfg), home=home, timeout=180)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    # no cluster state; at most the local store's keys, which a listing of data files makes when the store runs
    # (the module is checked in the same process as the files, after their listing)
    made = sorted(p.relative_to(home).as_posix() for p in home.rglob("*"))
    assert made in ([], ["_store", "_store/credentials.env"]), made
    assert _cluster_traces("tfct-mod") == []


@pytest.mark.parametrize("command", ["validate", "up"])
def test_a_tensorflow_release_that_does_not_exist_is_refused(home, command):
    res = run_cli(command, "--cluster", "tfct-mod", "--set", "tensorflow.version=2.99.0", home=home, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "tensorflow.version: got '2.99.0'; allowed: a release tfcluster knows: 2.16.x" in res.stderr
    assert list(home.iterdir()) == []


def test_validate_says_what_the_module_gives(home, tmp_path):
    (tmp_path / "regress.py").write_text(GOOD_MODEL + "loss = 'mse'\ndef make_dataset(): pass\n"
                                         "def metrics():\n    return ['mae']\n")
    res = run_cli("validate", "--set", f"training.model={tmp_path / 'regress.py'}",
                  "--set", f"network.subnet={QUIET_SUBNET}", home=home, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "model module regress.py: data from make_dataset, loss mean_squared_error, metrics " \
           "mean_absolute_error" in res.stderr
    again = run_cli("validate", "--set", f"training.model={tmp_path / 'regress.py'}",
                    "--set", f"network.subnet={QUIET_SUBNET}", home=home, timeout=180)
    assert again.returncode == 0 and again.stderr == res.stderr    # the cached check says the same


def test_the_job_check_process_gets_a_temporary_directory_of_its_own_removed_after_it(monkeypatch, tmp_path):
    """AutoGraph's files of the functions the check converts (a CSV parser, the user's decode), and the bytecode
    Python writes beside them, which TensorFlow's exit leaves behind, go to that directory, not /tmp."""
    import subprocess

    from tfcluster import job

    given = []

    def run(argv, env, **kw):
        directory = Path(env["TMPDIR"])
        assert directory.is_dir() and directory != Path("/tmp") and list(directory.iterdir()) == []
        (directory / "__pycache__").mkdir()
        (directory / "__pycache__" / "__autograph_generated_file1.cpython-311.pyc").write_bytes(b"x")
        given.append(directory)
        return subprocess.CompletedProcess(argv, 0, stdout='{"probe": "checked"}\n', stderr="")

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(job.tempfile, "tempdir", None)       # gettempdir() reads TMPDIR again
    monkeypatch.setattr(job.subprocess, "run", run)
    assert job._call("run", {"module": "m.py"}, {}, 60) == {"probe": "checked"}
    assert len(given) == 1 and given[0].parent == tmp_path and not given[0].exists()


FILES_MODULE = GOOD_MODEL + "loss = 'mse'\n"


@pytest.fixture
def files_home(home):
    """A state root holding the local store's keys, as one that started the (running) store does."""
    from tfcluster import store

    (home / "_store").mkdir()
    (home / "_store" / "credentials.env").write_text("AWS_ACCESS_KEY_ID=tfctest\nAWS_SECRET_ACCESS_KEY=tfctest\n")
    (home / "_store" / "credentials.env").chmod(0o600)
    assert store.is_running()     # the tests' own store (tests/conftest.py)
    return home


def _files_config(tmp_path, train: str, test: str):
    (tmp_path / "job.py").write_text(FILES_MODULE)
    cfg = tmp_path / "cluster.yml"
    cfg.write_text(f"cluster: tfct-mod\ntraining:\n  model: {tmp_path / 'job.py'}\n  steps: 10\n"
                   f"network: {{subnet: {QUIET_SUBNET}}}\n"
                   f"data:\n  train: {train}\n  test: {test}\n  format: csv\n  label: y\n")
    return cfg


@pytest.fixture
def bucket():
    """The tests' store's bucket ``tfct-files``, and a prefix of this test's own in it."""
    import uuid

    from tfcluster import config, store

    s3 = store.client(config.resolve({"cluster": "tfct-mod"}))
    try:
        s3.create_bucket(Bucket="tfct-files")
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    return s3, f"set-{uuid.uuid4().hex[:8]}"


def _put(s3, prefix: str, *names: str) -> None:
    for name in names:
        s3.put_object(Bucket="tfct-files", Key=f"{prefix}/{name}", Body=b"a,b,c,d,y\n1,2,3,4,5\n")


@pytest.mark.parametrize("command, case", [
    *[("up", case) for case in ("no such bucket", "a glob that matches nothing", "fewer files than workers",
                                "no label column", "a model that does not fit the data")],
    ("plan", "no such bucket"), ("validate", "a glob that matches nothing"), ("validate", "no such bucket"),
    ("validate", "no label column"), ("validate", "a model that does not fit the data")])
def test_data_files_the_local_store_lacks_are_refused_before_anything_exists(files_home, tmp_path, bucket, command,
                                                                            case):
    """On the local store the files are listed by plan and up, not first when train starts: a mistyped glob or
    bucket, or too few files for the training tasks, never boots a node. Where nothing is there yet (no bucket,
    nothing matches) validate names the problem and passes: the configuration is valid, and its data may be
    uploaded after it; files that are there but do not fit are its error too."""
    s3, prefix = bucket
    _put(s3, prefix, "train-0.csv", "test-0.csv")
    train, message = {
        "no such bucket": (f"s3://tfct-nobucket/{prefix}/train-*.csv", f"data.train: s3://tfct-nobucket/{prefix}/"
                           "train-*.csv: the bucket s3://tfct-nobucket/ does not exist in the object store (a typo, "
                           "or data not uploaded yet)"),
        "a glob that matches nothing": (f"s3://tfct-files/{prefix}/trian-*.csv", f"data.train: s3://tfct-files/"
                                        f"{prefix}/trian-*.csv matches no object in s3://tfct-files/"),
        "fewer files than workers": (f"s3://tfct-files/{prefix}/train-*.csv", "data.train: 1 file for 2 workers: "
                                     "worker 1 would have no data"),
        "no label column": (f"s3://tfct-files/{prefix}/nolabel-*.csv", f"s3://tfct-files/{prefix}/nolabel-0.csv: "
                            "label column 'y' (data.label) is not in the header (a, b, c, d, price)"),
        # 3 feature columns for a model of 4 inputs: found by TensorFlow on the first records, before any node
        "a model that does not fit the data": (f"s3://tfct-files/{prefix}/three-*.csv", "model module job.py: "
                                               "build_model() returned a model that fails on the data's "
                                               "features, of shape (3,) per example"),
    }[case]
    if case == "a model that does not fit the data":     # every file of this test's own prefix: 3 features
        for name in ("three-0.csv", "three-1.csv", "test-0.csv"):
            s3.put_object(Bucket="tfct-files", Key=f"{prefix}/{name}", Body=b"a,b,c,y\n1,2,3,5\n")
    s3.put_object(Bucket="tfct-files", Key=f"{prefix}/nolabel-0.csv", Body=b"a,b,c,d,price\n1,2,3,4,5\n")
    s3.put_object(Bucket="tfct-files", Key=f"{prefix}/nolabel-1.csv", Body=b"a,b,c,d,price\n1,2,3,4,5\n")
    cfg = _files_config(tmp_path, train, f"s3://tfct-files/{prefix}/test-*.csv")
    res = run_cli(command, "-c", str(cfg), home=files_home, timeout=180)
    assert "Traceback" not in res.stdout + res.stderr
    if command == "validate" and case in ("no such bucket", "a glob that matches nothing"):   # they may come later
        assert res.returncode == 0 and f"data: not ready ('up' refuses until it is): {message}" in res.stderr, \
            res.stderr
    else:
        assert res.returncode == 2, res.stdout + res.stderr
        errors = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("==>")]
        assert len(errors) == 1 and message in errors[0], res.stderr
    assert sorted(p.name for p in files_home.iterdir()) == ["_store"]     # no cluster state
    assert _cluster_traces("tfct-mod") == []


def test_a_state_root_without_the_stores_keys_still_checks_the_files(home, tmp_path, bucket):
    """The store running, but this checkout never made its keys (another checkout started it, or it was started
    before 'store start' made them): plan still lists the files, with keys made now (0600), and refuses a glob
    that matches nothing instead of passing it on to the nodes."""
    s3, prefix = bucket
    _put(s3, prefix, "train-0.csv", "test-0.csv")
    assert not (home / "_store").exists()
    cfg = _files_config(tmp_path, f"s3://tfct-files/{prefix}/trian-*.csv", f"s3://tfct-files/{prefix}/test-*.csv")
    res = run_cli("plan", "-c", str(cfg), home=home, timeout=180)
    assert res.returncode == 2 and f"{prefix}/trian-*.csv matches no object" in res.stderr, res.stdout + res.stderr
    keys = home / "_store" / "credentials.env"
    assert keys.stat().st_mode & 0o777 == 0o600 and "AWS_SECRET_ACCESS_KEY=" in keys.read_text()


def test_validate_says_which_files_it_found(files_home, tmp_path, bucket):
    s3, prefix = bucket
    _put(s3, prefix, "train-0.csv", "train-1.csv", "test-0.csv")
    cfg = _files_config(tmp_path, f"s3://tfct-files/{prefix}/train-*.csv", f"s3://tfct-files/{prefix}/test-*.csv")
    res = run_cli("validate", "-c", str(cfg), home=files_home, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "data: 2 training files and 1 test file in s3://tfct-files/" in res.stderr


def test_a_store_that_fails_the_listing_is_one_error_line_not_a_traceback(monkeypatch, capsys):
    """A storage failure while validate/plan/up list the files (not a bad name: a store answering 5xx) is the
    CLI's one-line error (exit 1), and the retries' lines go to stderr, not into validate's JSON."""
    from tfc_harness import prepare, s3io

    from tfcluster import config, job, store
    from tfcluster.errors import JobError, TfclusterError

    spec = config.resolve({"cluster": "tfct-mod", "data": {"train": "s3://tfct-files/x/train-*.csv",
                                                           "test": "s3://tfct-files/x/test.csv", "format": "csv"}})
    for name in ("is_local_store", "is_running"):
        monkeypatch.setattr(store, name, lambda *a: True)
    monkeypatch.setattr(store, "client", lambda spec: None)

    def failing(client, args):
        print("list s3://tfct-files/x/train-: InternalError: ...; retry 1/4 in 0.5s")
        raise s3io.TransferError("list s3://tfct-files/x/train- failed after 5 tries: InternalError")

    monkeypatch.setattr(prepare, "check_listing", failing)
    with pytest.raises(TfclusterError) as err:
        job.check_files(spec)
    assert not isinstance(err.value, JobError) and str(err.value).startswith("object storage: list s3://tfct-files")
    out = capsys.readouterr()
    assert out.out == "" and "retry 1/4" in out.err


def test_only_the_imports_that_run_when_the_module_loads_must_be_on_the_nodes(tmp_path):
    """Imports inside functions (make_dataset's scikit-learn) run on the controller only; the standard library,
    the harness and the nodes' locked packages are there; a name no distribution provides is left to Python."""
    import types

    from tfc_harness import prepare
    from tfc_harness.errors import ModelModuleError

    from tfcluster import wheelhouse

    nodes = wheelhouse.node_packages("2.21.0", [0, 0, 0])
    assert {"tensorflow-cpu", "keras", "numpy", "boto3"} <= set(nodes["packages"]) and "scikit-learn" not in \
        nodes["packages"]
    path = tmp_path / "m.py"
    path.write_text("from __future__ import annotations\nimport os, json\nimport numpy as np\nimport keras\n"
                    "from tensorflow import keras as k\nimport tfc_harness.usermodel\nfrom . import sibling\n"
                    "try:\n    import not_a_distribution_anywhere\nexcept ImportError:\n    pass\n"
                    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ansible\n"
                    "try:\n    import sklearn\nexcept (ModuleNotFoundError, OSError):\n    sklearn = None\n"
                    "import contextlib\nwith contextlib.suppress(ImportError):\n    import ansible\n"
                    "if __name__ == '__main__':\n    import ansible\n"
                    "def make_dataset():\n    from sklearn.datasets import load_iris\n    return load_iris()\n"
                    "build = lambda: __import__('sklearn')\n")
    module = types.SimpleNamespace(__file__=str(path), __name__="m")
    prepare.check_imports(module, nodes)
    gpu_nodes = wheelhouse.node_packages("2.21.0", [1, 1, 1])     # tensorflow[and-cuda]: TensorFlow all the same
    assert "tensorflow-cpu" not in gpu_nodes["packages"] and "tensorflow" in gpu_nodes["packages"]
    prepare.check_imports(module, gpu_nodes)
    guarded = path.read_text()
    for tail, line in (("import sklearn.datasets as d\n", 28),
                       ("from sklearn import datasets\n", 28),
                       ("try:\n    import ansible\nexcept ValueError:\n    pass\n", 29),   # not an import's guard
                       ("if __name__ != '__main__':\n    import ansible\n", 29)):         # it runs on import
        path.write_text(guarded + tail)
        with pytest.raises(ModelModuleError,
                           match=rf"imports (sklearn|sklearn.datasets|ansible) \(.*\) when it loads \(line {line}\)"):
            prepare.check_imports(module, nodes)


def _distribution(site, name: str, files: list[str]) -> None:
    """An installed distribution ``name`` holding ``files`` (each a module of one line), under ``site``."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    for f in files:
        (site / f).parent.mkdir(parents=True, exist_ok=True)
        (site / f).write_text("X = 1\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files + [f"{info.name}/METADATA"]))


def test_a_namespace_package_is_judged_by_the_distribution_that_holds_the_imported_module(tmp_path, monkeypatch):
    """``google`` is shared by protobuf and google-cloud-storage: importing ``google.cloud.storage`` needs the
    latter on the nodes, whatever else provides ``google``."""
    import types

    from tfc_harness import prepare
    from tfc_harness.errors import ModelModuleError

    site = tmp_path / "site"
    _distribution(site, "tfct_ns_proto", ["tfctns/protobuf/__init__.py"])
    _distribution(site, "tfct_ns_core", ["tfctns/cloud/client.py"])
    _distribution(site, "tfct_ns_storage", ["tfctns/cloud/storage/__init__.py"])
    monkeypatch.syspath_prepend(str(site))
    nodes = {"packages": ["tfct-ns-proto", "tfct-ns-core"], "locks": ["x.txt"]}
    path = tmp_path / "m.py"
    module = types.SimpleNamespace(__file__=str(path), __name__="m")
    for source in ("import tfctns.protobuf\n", "from tfctns.cloud import client\n", "from tfctns import protobuf\n",
                   "import tfctns.cloud\n"):
        path.write_text(source)
        prepare.check_imports(module, nodes)
    for source, shown in (("from tfctns.cloud import storage\n", "tfctns.cloud"),
                          ("import tfctns.cloud.storage as s\n", "tfctns.cloud.storage"),
                          ("from tfctns.cloud.storage import X\n", "tfctns.cloud.storage")):
        path.write_text(source)
        with pytest.raises(ModelModuleError, match=rf"imports {shown} \(tfct-ns-storage\) when it loads \(line 1\)"):
            prepare.check_imports(module, nodes)


def test_files_found_are_checked_with_the_module_in_one_process(monkeypatch):
    """Where the local store holds the job's files, the data's check (which checks the module's interface first,
    in its own process) stands for the module's check: TensorFlow is imported once, not twice."""
    from tfcluster import job

    calls = []
    monkeypatch.setattr(job, "check", lambda spec: calls.append("check") or {"module": "job.py"})
    monkeypatch.setattr(job, "prepare", lambda spec: calls.append("run") or {"interface": {"module": "job.py"}})
    assert job.check_with_data(object(), "2 training files and 1 test file in s3://b/") == {"module": "job.py"}
    assert calls == ["run"]
    assert job.check_with_data(object(), None) == {"module": "job.py"}      # no files: the module's check
    assert calls == ["run", "check"]


def test_preflight_checks_the_module_before_naming_the_listing_and_imports_tensorflow_once(monkeypatch):
    """plan and up: the listing (no TensorFlow) first; a module's error still comes before the listing's, and
    files found are checked with the module in one process."""
    from types import SimpleNamespace

    from tfcluster import cluster, job
    from tfcluster.errors import JobError

    calls = []
    monkeypatch.setattr(cluster, "ClusterState", lambda name: None)
    monkeypatch.setattr(cluster, "check_fits_the_cluster_up", lambda spec, state: None)
    monkeypatch.setattr(cluster, "get_provider", lambda name, state: SimpleNamespace(check=lambda spec: None))
    spec = SimpleNamespace(cluster="tfct-mod", provider="local")

    def listing_fails(spec):
        calls.append("listing")
        raise JobError("data.train: s3://nope/train-*: no such bucket")

    def module_fails(spec):
        calls.append("check")
        raise JobError("model module job.py has no build_model() function")

    monkeypatch.setattr(job, "check_files", listing_fails)
    monkeypatch.setattr(job, "check", module_fails)
    with pytest.raises(JobError, match="has no build_model"):
        cluster.preflight(spec)
    assert calls == ["listing", "check"]
    monkeypatch.setattr(job, "check", lambda spec: calls.append("check") or {"module": "job.py"})
    with pytest.raises(JobError, match="no such bucket"):       # a good module: the listing's own error
        cluster.preflight(spec)
    calls.clear()
    found = "2 training files and 1 test file in s3://b/"
    monkeypatch.setattr(job, "check_files", lambda spec: calls.append("listing") or found)
    monkeypatch.setattr(job, "prepare", lambda spec: calls.append("run") or {"interface": {"module": "job.py"}})
    _, checked = cluster.preflight(spec)
    assert calls == ["listing", "run"] and checked == {"module": "job.py", "files": found}
