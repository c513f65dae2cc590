"""examples/: the data writer (``tfcluster example-data``), the cluster files and the example model modules."""

from __future__ import annotations

import csv
import fnmatch
import importlib.util
import io
import math
import os
import signal
import socket
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, run_cli
from tfcluster import config, examples

EXAMPLES = REPO / "examples"
ROWS = {"diabetes": 442, "cancer": 569}
DATA_FILES = ("diabetes.yml", "cancer.yml")


def load_module(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_keys() -> set[str]:
    diabetes = {f"examples/diabetes/train/part-{i:05d}.csv" for i in range(6)} | \
               {f"examples/diabetes/test/part-{i:05d}.csv" for i in range(2)}
    cancer = {f"examples/cancer/train-{i:05d}-of-00006.tfrecord" for i in range(6)} | \
             {f"examples/cancer/test-{i:05d}-of-00002.tfrecord" for i in range(2)}
    return diabetes | cancer


# -- the writer, pure ---------------------------------------------------------------------------------
def test_shards_are_uneven_and_cover_every_row_once():
    bounds = examples.shard_bounds(353, examples.TRAIN_SHARES)
    sizes = [b - a for a, b in bounds]
    assert bounds[0][0] == 0 and bounds[-1][1] == 353
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(len(bounds) - 1))
    assert len(set(sizes)) == len(sizes) and min(sizes) >= 1
    with pytest.raises(ValueError, match="3 rows cannot make 6"):
        examples.shard_bounds(3, examples.TRAIN_SHARES)


def test_diabetes_shards_are_deterministic_and_standardised():
    first, again = examples.diabetes_shards(), examples.diabetes_shards()
    assert first == again
    train = np.vstack([rows(s.body)[1][:, :-1] for s in first if s.split == "train"])
    np.testing.assert_allclose(train.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(train.std(axis=0), 1, atol=1e-4)


def rows(body: bytes) -> tuple[list[str], np.ndarray]:
    """A CSV shard's header and its cells as floats (ValueError on a cell that is not a number)."""
    reader = list(csv.reader(io.StringIO(body.decode())))
    return reader[0], np.array([[float(c) for c in line] for line in reader[1:]])


# -- the writer into a local store of its own, through the CLI ----------------------------------------
@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """`tfcluster example-data` once, starting a local store of its own on loopback (not the session's,
    which another session may stop meanwhile); yields (the CLI's output, a function running it again,
    an S3 client of that store). The store is stopped at the end."""
    from tfc_harness import s3io

    from tfcluster import poll

    home = tmp_path_factory.mktemp("home")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"TFCLUSTER_STORE_IP": "127.0.0.1", "TFCLUSTER_STORE_PORT": str(port)}

    def again() -> str:
        result = run_cli("example-data", home=home, env=env, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    try:
        out = again()
        yield out, again, s3io.make_client(f"http://127.0.0.1:{port}", "us-east-1",
                                           credentials={"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"})
    finally:
        pid_file = home / "_store" / f"store-{port}.pid"
        pid = pid_file.exists() and poll.owned_pid(pid_file, b"moto.server")
        if pid:
            os.killpg(pid, signal.SIGTERM)


def stored(s3, prefix: str) -> dict[str, bytes]:
    from tfc_harness import s3io

    return {k: s3io.get_bytes(s3, "tfcluster", k) for k in s3io.list_keys(s3, "tfcluster", prefix)}


def test_example_data_writes_the_expected_keys(written):
    out, _, s3 = written
    assert set(stored(s3, "examples/diabetes")) | set(stored(s3, "examples/cancer")) == expected_keys()
    assert "diabetes: s3://tfcluster/examples/diabetes/: 8 shards (353 train rows, 89 test rows)" in out
    assert "cancer: s3://tfcluster/examples/cancer/: 8 shards (455 train rows, 114 test rows)" in out


def test_example_data_again_is_unchanged_and_removes_stale_keys(written):
    from tfc_harness import s3io

    _, again, s3 = written
    before = stored(s3, "examples")
    s3io.upload_bytes(s3, b"old layout", "tfcluster", "examples/cancer/train-00000-of-00009.tfrecord")
    out = again()
    assert "diabetes: s3://tfcluster/examples/diabetes/: 8 shards (353 train rows, 89 test rows): unchanged " \
           "(identical content already there)" in out
    assert "cancer: s3://tfcluster/examples/cancer/: 8 shards (455 train rows, 114 test rows): 0 written, " \
           "8 unchanged, 1 stale deleted" in out
    assert stored(s3, "examples") == before


def test_csv_shards_have_the_target_column_and_only_numbers(written):
    _, _, s3 = written
    splits = {"train": [], "test": []}
    for key, body in stored(s3, "examples/diabetes").items():
        header, cells = rows(body)
        assert header == ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6", "target"]
        assert cells.shape[1] == 11 and np.isfinite(cells).all()
        splits[key.split("/")[2]].append(cells)
    train, test = np.vstack(splits["train"]), np.vstack(splits["test"])
    assert_disjoint_and_complete(train, test, ROWS["diabetes"])
    assert 25 <= train[:, -1].min() and train[:, -1].max() <= 346  # the target in its own units


def test_tfrecord_shards_decode_with_the_example_module(written, tmp_path):
    import tensorflow as tf

    _, _, s3 = written
    decode = load_module("cancer").decode
    splits = {"train": [], "test": []}
    for key, body in stored(s3, "examples/cancer").items():
        path = tmp_path / Path(key).name
        path.write_bytes(body)
        records = tf.data.TFRecordDataset([str(path)]).map(decode)
        for x, y in records:
            assert x.shape == (30,) and x.dtype == tf.float32
            assert y.dtype == tf.float32 and float(y) in (0.0, 1.0)
            splits[Path(key).name.split("-")[0]].append(np.append(x.numpy(), y.numpy()))
    train, test = np.array(splits["train"]), np.array(splits["test"])
    assert_disjoint_and_complete(train, test, ROWS["cancer"])
    assert 0.5 < train[:, -1].mean() < 0.75 and abs(train[:, -1].mean() - test[:, -1].mean()) < 0.02  # stratified


def assert_disjoint_and_complete(train: np.ndarray, test: np.ndarray, total: int) -> None:
    assert len(train) + len(test) == total
    assert len(test) == math.ceil(total * examples.TEST_FRACTION)  # scikit-learn rounds the test split up
    as_rows = {tuple(r) for r in train}, {tuple(r) for r in test}
    assert len(as_rows[0]) == len(train) and len(as_rows[1]) == len(test)
    assert not as_rows[0] & as_rows[1]


# -- the cluster files --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["digits.yml", "diabetes.yml", "cancer.yml"])
def test_example_cluster_file_validates(name, monkeypatch):
    monkeypatch.chdir("/")   # a relative model path in a cluster file is relative to the file, not the cwd
    values = config.load_file(EXAMPLES / name)
    spec = config.resolve(values)
    assert spec.provider == "local" and (spec.count("ps"), spec.count("worker"), spec.count("chief")) == (1, 2, 1)
    assert spec.training.steps <= 600
    if name != "digits.yml":
        assert Path(spec.training.model) == EXAMPLES / name.replace(".yml", ".py")
    if "data" in values:
        assert spec.data.train.startswith("s3://tfcluster/examples/") and spec.data.format in ("csv", "tfrecord")


def url_matches(url: str, key: str) -> bool:
    """The contract's choice of keys: a prefix ending in '/', or a glob whose '*' does not cross '/'."""
    pattern = url.removeprefix("s3://tfcluster/")
    if pattern.endswith("/"):
        return key.startswith(pattern)
    folder, _, name = pattern.rpartition("/")
    return key.rpartition("/")[0] == folder and fnmatch.fnmatchcase(key.rpartition("/")[2], name)


@pytest.mark.parametrize("name", DATA_FILES)
def test_example_data_urls_choose_the_written_shards(name):
    data = config.load_file(EXAMPLES / name)["data"]
    shards = examples.DATASETS[name.removesuffix(".yml")]()
    for split in ("train", "test"):
        assert data[split].startswith("s3://tfcluster/")
        assert {s.key for s in shards if url_matches(data[split], s.key)} == {s.key for s in shards if s.split == split}
    assert data["format"] == {"diabetes.yml": "csv", "cancer.yml": "tfrecord"}[name]
    assert data.get("label") == ("target" if name == "diabetes.yml" else None)


# -- the model modules --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, features", [("diabetes", 10), ("cancer", 30)])
def test_example_module_output_fits_its_loss_and_metrics(name, features):
    import keras

    module = load_module(name)
    assert not hasattr(module, "make_dataset")  # its data comes from the cluster file
    model = module.build_model()
    x = np.random.default_rng(0).standard_normal((8, features)).astype(np.float32)
    y = np.array([0, 1] * 4, dtype=np.float32)  # one scalar label per example, as the harness batches them
    pred = model(x)
    assert tuple(pred.shape) == (8, 1)
    loss = keras.losses.get(module.loss) if isinstance(module.loss, str) else module.loss
    value = np.mean(keras.ops.convert_to_numpy(loss(y, pred)))
    assert np.isfinite(value)
    for metric in module.metrics():
        metric.update_state(y, pred)
        assert np.isfinite(float(metric.result()))


# -- a real training check: each module on the written data, in one plain Keras process ----------------
def dataset(name: str, module, files: list[str]):
    """The examples' files read as the harness's readers do: (float32 features, float32 label) per example."""
    import tensorflow as tf

    if name == "cancer":
        return tf.data.TFRecordDataset(files).map(module.decode)

    def parse(line):
        cells = tf.io.decode_csv(line, [[0.0]] * 11)
        return tf.stack(cells[:-1]), cells[-1]  # the label, target, is the last column

    return tf.data.Dataset.from_tensor_slices(files).interleave(lambda f: tf.data.TextLineDataset(f).skip(1)).map(parse)


@pytest.mark.parametrize("name, headline, good", [("diabetes", "mae", lambda v: v < 46.0),
                                                  ("cancer", "auc", lambda v: v > 0.98)])
def test_example_module_trains_to_its_documented_metric(written, tmp_path, name, headline, good):
    import keras

    _, _, s3 = written
    module = load_module(name)
    training = config.load_file(EXAMPLES / f"{name}.yml")["training"]
    files = {"train": [], "test": []}
    for key, body in sorted(stored(s3, f"examples/{name}").items()):
        path = tmp_path / key.replace("/", "_")
        path.write_bytes(body)
        files["test" if key.partition(f"{name}/")[2].startswith("test") else "train"].append(str(path))
    keras.utils.set_random_seed(0)
    model = module.build_model()
    model.compile(optimizer=keras.optimizers.Adam(training["learning_rate"]), loss=module.loss,
                  metrics=module.metrics())
    train = dataset(name, module, files["train"]).shuffle(1000, seed=0).repeat().batch(training["batch_size"])
    model.fit(train, steps_per_epoch=training["steps"], epochs=1, verbose=0)
    result = model.evaluate(dataset(name, module, files["test"]).batch(256), return_dict=True, verbose=0)
    print(f"{name}: test {result}")
    assert good(result[headline]), result
