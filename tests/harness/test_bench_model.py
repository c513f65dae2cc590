"""The bench model (train/models/shapes32.py): a valid model module whose data are deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from tfc_harness import usermodel


@pytest.fixture(scope="module")
def splits():
    return usermodel.load("shapes32").make_dataset()


def test_dataset_shapes_range_and_balance(splits):
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    assert x_train.shape == (2048, 32, 32, 3) and x_test.shape == (512, 32, 32, 3)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.bincount(y_train)) == {2048 // 10, 2048 // 10 + 1}   # every class, balanced
    assert np.bincount(y_test, minlength=10).min() >= 51


def test_dataset_is_deterministic(splits):
    again = usermodel.load("shapes32").make_dataset()
    for name in ("train", "test"):
        assert np.array_equal(again[name][0], splits[name][0]) and np.array_equal(again[name][1], splits[name][1])


def test_a_valid_model_module_on_its_own_data(splits):
    pytest.importorskip("keras")
    module = usermodel.load("shapes32")
    assert usermodel.from_logits(module) is True and usermodel.has_dataset(module)
    x, y = splits["train"][0][:8], splits["train"][1][:8]
    model = usermodel.build_model(module, x.shape[1:])
    assert tuple(model(x).shape) == (8, 10)
    usermodel.check_batch(module, model, x, y)   # the harness's own check: model, loss and metric fit the labels
