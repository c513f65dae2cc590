"""Dataset handling: shard selection, npz round trip, content-named ensure_dataset against moto."""

from __future__ import annotations

import types

import numpy as np
import pytest
from tfc_harness import data, s3io
from tfc_harness.errors import ModelModuleError


@pytest.mark.parametrize("rows, workers", [(10, 1), (10, 2), (11, 3), (1437, 2)])
def test_shards_are_disjoint_and_cover_everything(rows, workers):
    x = np.arange(rows, dtype=np.float32).reshape(rows, 1)
    y = np.arange(rows, dtype=np.int64)
    shards = [data.shard_rows(x, y, i, workers) for i in range(workers)]
    seen = np.concatenate([sy for _, sy in shards])
    assert sorted(seen.tolist()) == list(range(rows))
    for i, (sx, sy) in enumerate(shards):
        assert sy.tolist() == list(range(i, rows, workers))
        assert (sx[:, 0] == sy).all()


@pytest.mark.parametrize("index, workers", [(2, 2), (-1, 2), (0, 0)])
def test_shard_index_out_of_range(index, workers):
    with pytest.raises(ValueError, match="out of range"):
        data.shard_rows(np.zeros((4, 1)), np.zeros(4, dtype=np.int64), index, workers)


def test_npz_round_trip_casts_dtypes():
    x = np.random.default_rng(0).random((5, 2, 2, 1))  # float64 in, float32 out
    y = np.array([0, 1, 2, 1, 0], dtype=np.int32)
    x2, y2 = data.from_npz_bytes(data.to_npz_bytes(x, y))
    assert x2.dtype == np.float32 and y2.dtype == np.int64
    np.testing.assert_allclose(x2, x.astype(np.float32))
    assert y2.tolist() == y.tolist()


@pytest.mark.parametrize("y, dtype", [
    (np.array([0.5, 1.5, -2.0]), np.float32),                   # regression targets
    (np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]), np.float32),  # vector targets
    (np.array([True, False, True]), np.int64),                  # binary labels
])
def test_labels_may_be_any_numbers(y, dtype):
    x, y2 = data.check_arrays(np.zeros((3, 2), dtype=np.int32), y)
    assert x.dtype == np.float32 and y2.dtype == dtype and y2.shape == y.shape


@pytest.mark.parametrize("x, y, fragment", [
    (np.zeros((3, 2)), np.zeros(2, dtype=np.int64), "need x [N, ...] and y [N, ...]"),
    (np.zeros((3, 2)), np.array(["a", "b", "c"]), "y with <U1 values; y must be numeric"),
    (np.full((3, 2), np.nan), np.zeros(3), "NaN or infinite"),
])
def test_check_arrays_rejects(x, y, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        data.check_arrays(x, y)


def test_ensure_dataset_uploads_once(s3_client):
    s3_client.create_bucket(Bucket="dsets")
    calls = []

    def make_dataset():
        calls.append(1)
        x = np.ones((6, 2, 2, 1), dtype=np.float32)
        return {"train": (x, np.arange(6) % 2), "test": (x[:2], np.array([0, 1]))}

    module = types.ModuleType("tiny_model")
    module.build_model = lambda: None
    module.make_dataset = make_dataset

    first = data.ensure_dataset(s3_client, "dsets", "datasets/tiny/", module)
    prefix = first["prefix"]
    assert first["uploaded"] and prefix == f"datasets/tiny-{first['sha256'][:12]}"
    assert first["rows"] == {"train": 6, "test": 2}
    assert sorted(s3io.list_keys(s3_client, "dsets", "datasets/")) == [f"{prefix}/test.npz", f"{prefix}/train.npz"]
    second = data.ensure_dataset(s3_client, "dsets", "datasets/tiny", module)
    assert second["uploaded"] is False and second["prefix"] == prefix and len(calls) == 2
    x, y = data.load_split(s3_client, "dsets", prefix, "test")
    assert x.shape == (2, 2, 2, 1) and y.tolist() == [0, 1]


def test_changed_data_gets_a_new_prefix_and_the_old_stays(s3_client):
    """A user who changes make_dataset() trains on the new data, never on a stale copy."""
    s3_client.create_bucket(Bucket="dsets-changed")
    labels = [np.array([0, 1, 0, 1])]
    module = types.ModuleType("changing")
    module.build_model = lambda: None
    module.make_dataset = lambda: {"train": (np.ones((4, 3)), labels[0]), "test": (np.ones((2, 3)), labels[0][:2])}
    old = data.ensure_dataset(s3_client, "dsets-changed", "datasets/changing", module)
    labels[0] = np.array([1, 1, 0, 0])                     # one label changed, same shapes
    new = data.ensure_dataset(s3_client, "dsets-changed", "datasets/changing", module)
    assert new["uploaded"] and new["prefix"] != old["prefix"] and new["sha256"] != old["sha256"]
    assert data.load_split(s3_client, "dsets-changed", new["prefix"], "train")[1].tolist() == [1, 1, 0, 0]
    assert data.load_split(s3_client, "dsets-changed", old["prefix"], "train")[1].tolist() == [0, 1, 0, 1]


def test_content_hash_sees_dtype_shape_and_values():
    x, y = np.zeros((4, 2), dtype=np.float32), np.arange(4)
    base = data.content_hash({"train": (x, y), "test": (x, y)})
    assert base == data.content_hash({"train": (x.copy(), y.copy()), "test": (x, y)})
    assert base != data.content_hash({"train": (x.reshape(4, 2, 1), y), "test": (x, y)})
    assert base != data.content_hash({"train": (x, y.astype(np.int32)), "test": (x, y)})
    assert base != data.content_hash({"train": (x, y), "test": (x + 1, y)})


def _module(name: str, make_dataset):
    module = types.ModuleType(name)
    module.__file__ = f"/models/{name}.py"
    module.build_model = lambda: None
    module.make_dataset = make_dataset
    return module


def test_ensure_dataset_rejects_bad_make_dataset(s3_client):
    s3_client.create_bucket(Bucket="ds-bad")
    module = _module("bad_model", lambda: {"train": (np.zeros((2, 1)), np.zeros(2, dtype=np.int64))})
    with pytest.raises(ModelModuleError, match=r"^model module bad_model.py: make_dataset\(\) returned \['train'\]; "
                       r"it must return \{'train': \(x, y\), 'test': \(x, y\)\}$"):
        data.ensure_dataset(s3_client, "ds-bad", "datasets/bad", module)
    assert not list(s3io.list_keys(s3_client, "ds-bad", "datasets/bad"))   # nothing half-uploaded


X = np.zeros((4, 2, 2, 1), dtype=np.float32)
Y = np.array([0, 1, 0, 1])


@pytest.mark.parametrize("splits, fragment", [
    ({"train": (X, Y.astype(str)), "test": (X, Y)},
     "make_dataset() returned y with <U21 values; y must be numeric (in the 'train' split)"),
    ({"train": (X, Y), "test": (X[:, :1], Y)},
     "make_dataset() returned train and test splits whose examples differ in shape"),
    ({"train": (X, Y[:3]), "test": (X, Y)},
     "make_dataset() returned x with shape (4, 2, 2, 1) and y with shape (3,); need x [N, ...] and y [N, ...]"),
    ({"train": X, "test": (X, Y)}, "make_dataset() returned ndarray for the 'train' split; each split must be"),
    ([X, Y], "make_dataset() returned list; it must return"),
])
def test_make_dataset_problems_name_module_function_and_split(splits, fragment):
    with pytest.raises(ModelModuleError) as err:
        data.splits_from_module(_module("regress", lambda: splits))
    assert str(err.value).startswith("model module regress.py: ")
    assert fragment in str(err.value)


def test_an_exception_in_make_dataset_is_named():
    def make_dataset():
        raise FileNotFoundError("no such file: /data/train.csv")

    with pytest.raises(ModelModuleError, match=r"^model module mine.py: make_dataset\(\) raised FileNotFoundError: "
                       r"no such file: /data/train.csv$") as err:
        data.splits_from_module(_module("mine", make_dataset))
    assert isinstance(err.value.__cause__, FileNotFoundError)
