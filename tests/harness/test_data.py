"""Dataset handling: shard selection, npz round trip, ensure_dataset against moto."""

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


@pytest.mark.parametrize("x, y, fragment", [
    (np.zeros((3, 2)), np.zeros(2, dtype=np.int64), "need x [N, ...] and y [N]"),
    (np.zeros((3, 2)), np.zeros(3, dtype=np.float32), "integer class ids"),
    (np.zeros((3, 2), dtype=np.int64), np.zeros(3, dtype=np.int64), "floating point"),
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
    assert first == {"uploaded": True, "keys": ["datasets/tiny/train.npz", "datasets/tiny/test.npz"],
                     "rows": {"train": 6, "test": 2}}
    second = data.ensure_dataset(s3_client, "dsets", "datasets/tiny", module)
    assert second["uploaded"] is False and len(calls) == 1
    x, y = data.load_split(s3_client, "dsets", "datasets/tiny", "test")
    assert x.shape == (2, 2, 2, 1) and y.tolist() == [0, 1]


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
    ({"train": (X, Y.astype(np.float64)), "test": (X, Y)},
     "make_dataset() returned y with float64 values; y must hold integer class ids (the harness trains "
     "classifiers: regression targets are not supported) (in the 'train' split)"),
    ({"train": (X, Y), "test": (X.astype(np.int32), Y)},
     "make_dataset() returned x with int32 values; x must be floating point (in the 'test' split)"),
    ({"train": (X, Y[:3]), "test": (X, Y)},
     "make_dataset() returned x with shape (4, 2, 2, 1) and y with shape (3,); need x [N, ...] and y [N]"),
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
