"""Loading model modules, and the digits example's interface."""

from __future__ import annotations

import numpy as np
import pytest
from harness_support import TRAIN_DIR
from tfc_harness import usermodel


def test_load_by_name_and_by_absolute_path():
    by_name = usermodel.load("digits")
    by_path = usermodel.load(str(TRAIN_DIR / "models" / "digits.py"))
    assert by_name.build_model and by_path.make_dataset
    assert usermodel.from_logits(by_name) is True


@pytest.mark.parametrize("name, fragment", [
    ("no_such_model", "not found"),
    ("models/digits.py", "must be absolute"),
    ("bad-name", "module name or an absolute"),
])
def test_bad_model_module_names(name, fragment):
    with pytest.raises(usermodel.ModelModuleError, match=fragment):
        usermodel.load(name)


def test_module_without_interface(tmp_path):
    path = tmp_path / "half.py"
    path.write_text("def build_model():\n    return None\nFROM_LOGITS = 'yes'\n")
    with pytest.raises(usermodel.ModelModuleError, match="no make_dataset"):
        usermodel.load(str(path))
    path.write_text("def build_model():\n    return None\ndef make_dataset():\n    return {}\nFROM_LOGITS = 'yes'\n")
    with pytest.raises(usermodel.ModelModuleError, match="FROM_LOGITS must be a bool"):
        usermodel.from_logits(usermodel.load(str(path)))


def test_digits_dataset_split():
    pytest.importorskip("sklearn")
    splits = usermodel.load("digits").make_dataset()
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    assert x_train.shape == (1437, 8, 8, 1) and x_test.shape == (360, 8, 8, 1)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert np.bincount(y_test).min() >= 35            # stratified: every class in the test split
    again = usermodel.load("digits").make_dataset()["test"][1]
    assert (again == y_test).all()                    # fixed seed


def test_digits_model_outputs_logits_for_ten_classes():
    pytest.importorskip("keras")
    model = usermodel.load("digits").build_model()
    out = model(np.zeros((3, 8, 8, 1), dtype=np.float32))
    assert tuple(out.shape) == (3, 10)
