"""Loading model modules, and the digits example's interface."""

from __future__ import annotations

import textwrap

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


def _write(tmp_path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_an_import_error_names_the_module(tmp_path):
    path = _write(tmp_path, "needs_torch", """
        import torch_that_is_not_here
        def build_model(): pass
        def make_dataset(): pass
    """)
    with pytest.raises(usermodel.ModelModuleError, match=r"^model module needs_torch.py: importing it raised "
                       r"ModuleNotFoundError: No module named 'torch_that_is_not_here'$"):
        usermodel.load(path)


@pytest.mark.parametrize("body, fragment", [
    ("def build_model():\n    raise RuntimeError('layer sizes wrong')\n",
     "build_model() raised RuntimeError: layer sizes wrong"),
    ("def build_model():\n    return 42\n", "build_model() returned int, not a Keras model"),
])
def test_build_model_problems_are_named(tmp_path, body, fragment):
    module = usermodel.load(_write(tmp_path, "broken", body + "def make_dataset(): pass\n"))
    with pytest.raises(usermodel.ModelModuleError) as err:
        usermodel.build_model(module, (8, 8, 1))
    assert str(err.value) == f"model module broken.py: {fragment}"


def test_a_regression_model_is_refused_before_training(tmp_path):
    pytest.importorskip("keras")
    module = usermodel.load(_write(tmp_path, "regressor", """
        import keras
        def build_model():
            return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
        def make_dataset(): pass
    """))
    model = usermodel.build_model(module, (4,))
    with pytest.raises(usermodel.ModelModuleError, match=r"^model module regressor.py: build_model\(\) returned a "
                       r"model whose output has shape \(2, 1\) for 2 examples; it must output one score per class "
                       r"\(\[2, >= 3\]\)"):
        usermodel.check_output(module, model, np.zeros((2, 4), dtype=np.float32), num_classes=3)
    wide = usermodel.load(_write(tmp_path, "classifier", """
        import keras
        def build_model():
            return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])
        def make_dataset(): pass
    """))
    usermodel.check_output(wide, usermodel.build_model(wide, (4,)), np.zeros((2, 4), dtype=np.float32), 3)


def test_make_optimizer_problems_are_named(tmp_path):
    module = usermodel.load(_write(tmp_path, "opt", """
        def build_model(): pass
        def make_dataset(): pass
        def make_optimizer(learning_rate):
            return {"lr": learning_rate}
    """))
    with pytest.raises(usermodel.ModelModuleError,
                       match=r"^model module opt.py: make_optimizer\(\) returned dict, not a Keras optimizer$"):
        usermodel.make_optimizer(module, 0.1)
