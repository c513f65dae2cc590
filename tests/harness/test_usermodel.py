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


@pytest.mark.parametrize("extra, message", [
    ("loss = 'mse'\ndef metric():\n    return ['mae']\n",
     "defines metric() but no metrics(): a run reads metrics only, and without it reports the loss alone"),
    ("def Metrics():\n    return ['mae']\n", "defines Metrics() but no metrics(): a run reads metrics only, and "
     "without it reports accuracy alone (the default loss's metric)"),
    ("def make_optimiser(learning_rate):\n    return None\n",
     "defines make_optimiser() but no make_optimizer(): a run reads make_optimizer only, and without it trains "
     "with Adam"),
    ("def make_optimiser():\n    return None\n", "defines make_optimiser() but no make_optimizer()"),
    ("FROM_LOGIT = False\n", "defines FROM_LOGIT = False but no FROM_LOGITS = ...: a run reads FROM_LOGITS only, "
     "and without it takes build_model's outputs for logits; rename it FROM_LOGITS, or give a helper of yours a "
     "name unlike it (or one starting with _)"),
    ("from_logits = False\n", "defines from_logits = False but no FROM_LOGITS"),
])
def test_a_slip_for_a_name_whose_default_would_apply_silently_is_refused(tmp_path, extra, message):
    """A misspelt optional name would be ignored and its default used with no error (a `metric()`: the run
    reports the loss alone): refused, naming the slip, the name and what the run would do without it."""
    path = tmp_path / "slip.py"
    path.write_text("def build_model(hparams):\n    return None\n" + extra)
    with pytest.raises(usermodel.ModelModuleError) as refused:
        usermodel.load(str(path))
    assert str(refused.value).startswith(f"model module slip.py {message}"), str(refused.value)


@pytest.mark.parametrize("extra", [
    "def metric(y_true, y_pred):\n    return 0\n",                  # a custom metric function: not metrics()
    "def metrics():\n    return ['mae']\ndef metric():\n    return 0\n",   # metrics() is there
    "def optimizer(learning_rate):\n    return None\n",             # not close enough to make_optimizer
    "def custom_metrics():\n    return []\n",
    "def decoder(hparams):\n    return None\n",                     # decode's absence is never silent
    "from os.path import join as metric\n",                          # imported, not the module's own
    "FROM_LOGIT = 'x'\n",                                            # not a bool
    "FROM_LOGIT = True\n",                                           # the default: the run does what it says
    # the module's own loss decides, whatever FROM_LOGITS would say
    "import keras\nfrom_logits = False\nloss = keras.losses.BinaryCrossentropy(from_logits=from_logits)\n",
    "def metric(*, y_true, y_pred):\n    return 0\n",               # cannot be called as metrics() is
    "def numerics():\n    return []\n",                             # not close enough
    "def _metric():\n    return []\n",                              # private
])
def test_names_that_are_not_slips_load(tmp_path, extra):
    path = tmp_path / "fine.py"
    path.write_text("def build_model(hparams):\n    return None\n" + extra)
    assert usermodel.load(str(path)).build_model


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
    path.write_text("def make_dataset():\n    return None\n")
    with pytest.raises(usermodel.ModelModuleError, match=r"^model module half.py has no build_model\(\) function$"):
        usermodel.load(str(path))
    path.write_text("def build_modle(hparams):\n    return None\n")
    with pytest.raises(usermodel.ModelModuleError, match=r"^model module half.py has no build_model\(\) function "
                       r"\(it defines build_modle\(\): a misspelt name\?\)$"):
        usermodel.load(str(path))
    path.write_text("def build_model():\n    return None\nmetrics = ['auc']\n")
    with pytest.raises(usermodel.ModelModuleError, match=r"^model module half.py: metrics must be a function "
                       r"\(got list\)$"):
        usermodel.load(str(path))
    path.write_text("import json as metrics\ndef build_model():\n    return None\n")
    with pytest.raises(usermodel.ModelModuleError, match=r"^model module half.py: metrics must be a function "
                       r"\(got module\): the module json, bound to that name by an import; import it under "
                       r"another name \(import json as \.\.\.\): a run calls metrics\(\) as a function the "
                       r"module defines$"):
        usermodel.load(str(path))
    path.write_text("from email import message as make_optimizer\ndef build_model():\n    return None\n")
    with pytest.raises(usermodel.ModelModuleError, match=r"make_optimizer must be a function \(got module\): "
                       r"the module email.message, .* \(from email import message as \.\.\.\): a run calls "
                       r"make_optimizer\(\) as a function the module defines$"):
        usermodel.load(str(path))
    path.write_text("def build_model():\n    return None\n")   # data may come from files in storage
    assert not usermodel.has_dataset(usermodel.load(str(path)))
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
     "build_model() raised RuntimeError at line 2: layer sizes wrong"),
    ("def build_model():\n    return 42\n", "build_model() returned int, not a Keras model"),
])
def test_build_model_problems_are_named(tmp_path, body, fragment):
    module = usermodel.load(_write(tmp_path, "broken", body + "def make_dataset(): pass\n"))
    with pytest.raises(usermodel.ModelModuleError) as err:
        usermodel.build_model(module, (8, 8, 1))
    assert str(err.value) == f"model module broken.py: {fragment}"


REGRESSOR = """
    import keras
    loss = "mse"
    def metrics():
        return [keras.metrics.MeanAbsoluteError(name="mae")]
    def build_model():
        return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
"""
BINARY = """
    import keras
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    def metrics():
        return [keras.metrics.AUC(name="auc", from_logits=True), "accuracy"]
    def build_model(hparams):
        return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(hparams.get("units", 2)),
                                 keras.layers.Dense(1)])
"""
MULTICLASS = """
    import keras
    def build_model():
        return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])
"""


@pytest.mark.parametrize("body, y, loss_name, metric_names, probabilities", [
    (REGRESSOR, np.array([0.5, -1.25], dtype=np.float32), "mean_squared_error", ["mae"], None),
    (BINARY, np.array([0, 1]), "BinaryCrossentropy", ["auc", "accuracy"], "sigmoid"),
    (MULTICLASS, np.array([0, 2]), "SparseCategoricalCrossentropy", ["accuracy"], "softmax"),
])
def test_regression_binary_and_multiclass_modules(tmp_path, body, y, loss_name, metric_names, probabilities):
    pytest.importorskip("keras")
    module = usermodel.load(_write(tmp_path, "job", body))
    loss = usermodel.loss_fn(module)
    assert usermodel.loss_name(loss) == loss_name
    assert [m.name for m in usermodel.metric_objects(module, loss)] == metric_names
    assert usermodel.probability_fn(loss) == probabilities
    model = usermodel.build_model(module, (4,), {"units": 5} if usermodel.takes_hparams(module) else None)
    usermodel.check_batch(module, model, np.zeros((2, 4), dtype=np.float32), y, loss)


def test_hparams_reach_build_model_or_are_refused(tmp_path):
    pytest.importorskip("keras")
    binary = usermodel.load(_write(tmp_path, "binary", BINARY))
    assert usermodel.build_model(binary, (4,), {"units": 7}).layers[0].units == 7
    plain = usermodel.load(_write(tmp_path, "plain", MULTICLASS))
    with pytest.raises(usermodel.ModelModuleError, match=r"^model module plain.py: build_model\(\) takes no "
                       r"parameter, but training.hparams is set \(\{'units': 7\}\)"):
        usermodel.build_model(plain, (4,), {"units": 7})
    reads = usermodel.hparams_reads(binary, {"units": 7, "unit": 8})
    assert (reads.read, reads.whole, reads.given) == ({"units"}, False, ("units", "unit"))


def test_the_chief_gives_build_model_a_plain_dict(tmp_path):
    pytest.importorskip("keras")
    seen = usermodel.load(_write(tmp_path, "seen", BINARY.replace(
        "def build_model(hparams):", "SEEN = []\n    def build_model(hparams):\n        SEEN.append(type(hparams))")))
    usermodel.build_model(seen, (4,), {"units": 7})
    assert seen.SEEN == [dict]


@pytest.mark.parametrize("use, read, whole", [
    (lambda h: h.get("units", 16), {"units"}, False), (lambda h: h["units"], {"units"}, False),
    (lambda h: "units" in h and h.setdefault("layers", 1), {"units", "layers"}, False),
    (lambda h: h.pop("units"), {"units"}, False), (lambda h: h.get("depth"), {"depth"}, False),
    (lambda h: str(h), set(), False),                                # shown, not used
    # the whole mapping: each name may be used
    (lambda h: dict(h), set(), True), (lambda h: (lambda units, layers: 0)(**h), set(), True),
    (lambda h: {**h}, set(), True), (lambda h: list(h), set(), True), (lambda h: h.items(), set(), True),
    (lambda h: h.copy(), set(), True), (lambda h: h | {}, set(), True),
    (lambda h: __import__("json").dumps(h), set(), True), (lambda h: __import__("copy").deepcopy(h), set(), True),
])
def test_the_names_build_model_looks_up_are_noted(use, read, whole):
    given = usermodel.ReadHparams({"units": 4, "layers": 2})
    use(given)
    assert (given.whole, given.given) == (whole, ("units", "layers"))
    assert whole or given.read == read      # (unpacking looks each name up too)


CONDITIONAL = """
    import keras
    def build_model(hparams):
        if hparams["arch"] == "cnn":
            hidden = [keras.layers.Reshape((4, 1)), keras.layers.Conv1D(int(hparams["filters"]), 2),
                      keras.layers.Flatten()]
        else:
            hidden = [keras.layers.Dense(int(hparams["units"]))]
        return keras.Sequential([keras.Input(shape=(4,)), *hidden, keras.layers.Dense(1)])
"""


def test_every_hparam_must_be_read_by_build_model_with_one_of_the_values_at_least(tmp_path):
    pytest.importorskip("keras")
    from tfc_harness import prepare

    module = usermodel.load(_write(tmp_path, "cond", CONDITIONAL))
    cnn, mlp = {"arch": "cnn", "filters": 8, "units": 4}, {"arch": "mlp", "filters": 8, "units": 4}
    prepare.check_hparams_read(module, [cnn, mlp])           # a sweep over both: each name read by one
    with pytest.raises(usermodel.ModelModuleError, match=r"^model module cond.py: build_model\(\) never reads "
                       r"training.hparams 'units' \(it reads arch, filters\): a misspelt name"):
        prepare.check_hparams_read(module, [cnn])            # one run: units does nothing
    binary = usermodel.load(_write(tmp_path, "binary", BINARY))      # hparams.get("units", 2)
    with pytest.raises(usermodel.ModelModuleError, match=r"never reads training.hparams 'unit' with any trial's "
                       r"values \(it reads none of them; it looks up units, not set\)"):
        prepare.check_hparams_read(binary, [{"unit": 4}, {"unit": 8}])
    with pytest.raises(usermodel.ModelModuleError, match=r"build_model\(\) raised ValueError at line 8: invalid "
                       r"literal for int\(\) with base 10: 'a' \(training.hparams \{'arch': 'mlp', 'units': 'a'\}\)"):
        prepare.check_hparams_read(module, [mlp, {"arch": "mlp", "units": "a"}])
    prepare.check_hparams_read(module, [None])               # no hparams: nothing to check


def test_a_model_that_is_built_later_may_read_its_hparams_then(tmp_path):
    pytest.importorskip("keras")
    from tfc_harness import prepare

    later = usermodel.load(_write(tmp_path, "later", """
        import keras
        class Net(keras.Model):
            def __init__(self, hparams):
                super().__init__()
                self.hparams = hparams
            def build(self, shape):
                self.dense = keras.layers.Dense(self.hparams["units"])
            def call(self, x):
                return self.dense(x)
        def build_model(hparams):
            return Net(hparams)
    """))
    assert usermodel.hparams_reads(later, {"units": 3}) is None   # not built yet: cannot tell
    prepare.check_hparams_read(later, [{"units": 3}])


@pytest.mark.parametrize("body, y, fragment", [
    # class ids beyond the model's 3 outputs
    (MULTICLASS, np.array([0, 7]), "model module misfit.py: the data hold the label 7, outside the model's 3 classes "
                                   "(class ids 0 to 2) among the 2 examples checked"),
    # binary labels for a model with 3 outputs and a binary loss
    ("import keras\nloss = 'binary_crossentropy'\n"
     "def build_model():\n    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])\n",
     np.array([0.0, 1.0]), "labels of shape () per example do not fit the model's outputs of shape (3,) under "
                           "loss binary_crossentropy: Keras would broadcast them"),
    # class ids for a multi-class model under the categorical (one-hot) cross-entropy: its sparse form named
    ("import keras\nloss = 'categorical_crossentropy'\n"
     "def build_model():\n    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])\n",
     np.array([0, 2]), "under loss categorical_crossentropy: Keras would broadcast them and train on nonsense; for "
                       "class ids (one number per example) use loss = keras.losses.SparseCategoricalCrossentropy("
                       "from_logits=...) or the default loss; else have make_dataset() give labels of shape (3,), "
                       "or change the model's outputs"),
    # three values per example for one output under mse: Keras broadcasts them without an error
    ("import keras\nloss = 'mse'\n"
     "def build_model():\n    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])\n",
     np.zeros((2, 3)), "labels of shape (3,) per example do not fit the model's outputs of shape (1,) under loss "
                       "mean_squared_error: Keras would broadcast them and train on nonsense; have make_dataset() "
                       "give labels of shape (1,) or () for a single value, or change the model's outputs"),
    # CSV data: its labels are one column (whatever else the module defines)
    ("import keras\nloss = 'binary_crossentropy'\ndef make_dataset(): pass\n"
     "def build_model():\n    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(2)])\n",
     np.array([0.0, 1.0]), "labels of shape () per example do not fit the model's outputs of shape (2,) under loss "
                           "binary_crossentropy: Keras would broadcast them and train on nonsense; the csv files' "
                           "label column (data.label) gives one number per example: change the model's outputs"),
    # TFRecord data: decode() gives them
    ("import keras\nloss = 'mse'\ndef make_dataset(): pass\n"
     "def build_model():\n    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])\n",
     np.zeros((2, 3)), "train on nonsense; have decode() give labels of shape (1,) or () for a single value, or "
                       "change the model's outputs"),
    # a binary classifier left with the default loss (sparse categorical cross-entropy: an output per class)
    ("import keras\ndef build_model():\n    return keras.Sequential([keras.Input(shape=(4,)), "
     "keras.layers.Dense(1, activation='sigmoid')])\n",
     np.array([0, 1]), "Received a label value of 1 which is outside the valid range of [0, 1)"),
    ("import keras\ndef build_model():\n    return keras.Sequential([keras.Input(shape=(4,)), "
     "keras.layers.Dense(1, activation='sigmoid')])\n",
     np.array([0, 1]), "(the module sets no loss, and the default is sparse categorical cross-entropy from "
                       "logits, which wants an output per class; a model with one output unit wants loss = "
                       "'binary_crossentropy' as a binary classifier"),
    ("import keras\nloss = None\nFROM_LOGITS = False\ndef build_model():\n    return keras.Sequential(["
     "keras.Input(shape=(4,)), keras.layers.Dense(1, activation='sigmoid')])\n",
     np.array([0, 1]), "(the module sets no loss, and the default is sparse categorical cross-entropy, which wants"),
    ("import keras\nloss = 'sparse_categorical_crossentropy'\ndef build_model():\n"
     "    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1, activation='sigmoid')])\n",
     np.array([0, 1]), "[Op:SparseSoftmaxCrossEntropyWithLogits] (a model with one output unit wants loss = "
                       "'binary_crossentropy'"),
    # a softmax model under the default loss, which takes logits: a softmax twice
    ("import keras\ndef build_model():\n    return keras.Sequential([keras.Input(shape=(4,)), "
     "keras.layers.Dense(3, activation='softmax')])\n",
     np.array([0, 2]), "build_model's outputs are probabilities (each example's 3 sum to 1: a softmax), but the loss "
                       "(the default, SparseCategoricalCrossentropy) takes logits and applies a softmax again; set "
                       "FROM_LOGITS = False"),
    ("import keras\nloss = keras.losses.CategoricalCrossentropy(from_logits=True)\ndef build_model():\n"
     "    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3, activation='softmax')])\n",
     np.eye(3)[[0, 2]], "takes logits and applies a softmax again; give the loss from_logits=False, or drop"),
    # a categorical metric on class ids (and its sparse twin on one-hot labels): no error, a wrong figure
    (MULTICLASS + "    def metrics():\n        return [keras.metrics.CategoricalAccuracy(name='acc')]\n",
     np.array([0, 2]), "metric 'acc' (CategoricalAccuracy) wants labels of shape (3,) per example, not (): it would "
                       "score nonsense without an error; use SparseCategoricalAccuracy for these labels, or have "
                       "make_dataset() give labels of shape (3,)"),
    ("import keras\nloss = 'categorical_crossentropy'\ndef build_model():\n    return keras.Sequential(["
     "keras.Input(shape=(4,)), keras.layers.Dense(3, activation='softmax')])\n"
     "def metrics():\n    return [keras.metrics.SparseTopKCategoricalAccuracy(k=2, name='top2')]\n",
     np.eye(3)[[0, 2]], "metric 'top2' (SparseTopKCategoricalAccuracy) wants labels of shape () (a class id each) per "
                        "example, not (3,): it would score nonsense without an error; use TopKCategoricalAccuracy"),
    # several outputs: one tensor is what the loss, the metrics and the export take
    ("import keras\ndef build_model():\n    x = keras.Input(shape=(4,))\n"
     "    return keras.Model(x, [keras.layers.Dense(3)(x), keras.layers.Dense(1)(x)])\n",
     np.array([0, 2]), "build_model() returned a model with several outputs (list of 2); tfcluster trains a model "
                       "with one output tensor"),
    # class ids from 1 (or a model of too few units): the label and the classes, not TensorFlow's op names
    (MULTICLASS, np.array([1, 3]), "the data hold the label 3, outside the model's 3 classes (class ids 0 to 2) among "
                                   "the 2 examples checked: number the classes from 0, or give the model's last layer "
                                   "one unit per class"),
    # a binary classifier's classes numbered 1 and 2: binary cross-entropy raises nothing, its loss goes negative
    ("import keras\nloss = keras.losses.BinaryCrossentropy(from_logits=True)\ndef build_model():\n"
     "    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])\n",
     np.array([1, 2]), "make_dataset()'s labels hold the label 2, outside 0 to 1: BinaryCrossentropy takes 0 or 1 "
                       "for a class, or a probability between: number the two classes 0 and 1"),
    ("import keras\nloss = 'binary_crossentropy'\ndef build_model():\n"
     "    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1, activation='sigmoid')])\n",
     np.array([0.0, -1.0]), "hold the label -1, outside 0 to 1: binary_crossentropy takes 0 or 1"),
    ("import keras\nloss = 'categorical_crossentropy'\ndef build_model():\n    return keras.Sequential(["
     "keras.Input(shape=(4,)), keras.layers.Dense(3, activation='softmax')])\n",
     np.eye(3)[[0, 2]] * 2, "hold the label 2, outside 0 to 1: categorical_crossentropy takes one-hot labels, or a "
                            "probability per class: one-hot encode class ids"),
    # labels decoded as strings
    (MULTICLASS, np.array([b"0", b"1"]), "the labels are text (b'0', ...), not numbers (the loss and the metrics "
                                         "need numeric labels"),
    (MULTICLASS, np.array(["cat", "dog"], dtype=object), "the labels are text ('cat', ...), not numbers"),
])
def test_labels_that_do_not_fit_the_loss_are_named(tmp_path, body, y, fragment):
    pytest.importorskip("keras")
    module = usermodel.load(_write(tmp_path, "misfit", body))
    model = usermodel.build_model(module, (4,))
    data_format = "csv" if "the csv files'" in fragment else "tfrecord" if "have decode()" in fragment else None
    with pytest.raises(usermodel.ModelModuleError) as err:
        usermodel.check_batch(module, model, np.zeros((len(y), 4), dtype=np.float32), y, data_format=data_format)
    assert str(err.value).startswith("model module misfit.py: ") and fragment in str(err.value)


def test_data_of_other_features_than_the_model_takes_gives_keras_cause_on_one_line(tmp_path):
    """Two feature columns for a model that takes five: Keras's own cause, without its styling, the line
    that introduces it and its list of the call's arguments."""
    pytest.importorskip("keras")
    module = usermodel.load(_write(tmp_path, "wide", "import keras\nloss = 'mse'\ndef build_model():\n"
                                   "    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])\n"))
    model = usermodel.build_model(module, (2,))
    with pytest.raises(usermodel.ModelModuleError) as err:
        usermodel.check_batch(module, model, np.zeros((3, 2), dtype=np.float32), np.zeros(3, dtype=np.float32))
    message = str(err.value)
    assert message.startswith("model module wide.py: build_model() returned a model that fails on the data's "
                              "features, of shape (2,) per example (what decode() or make_dataset() gives, or "
                              "the CSV's columns but the label; a batch (3, 2)): ValueError: Input 0 "), message
    assert message.endswith("expected axis -1 of input shape to have value 5, but received input with shape "
                            "(3, 2)"), message
    assert "\n" not in message and "\x1b" not in message and "Arguments received" not in message, message


def test_names_and_functions_meet_outputs_of_shape_n_1_as_keras_loss_classes_do(tmp_path):
    """[N] labels (CSV labels are always scalars) against [N, 1] outputs: no broadcast to [N, N]."""
    pytest.importorskip("keras")
    y, out = np.array([1.0, 2.0, 3.0], dtype=np.float32), np.array([[1.5], [2.0], [2.0]], dtype=np.float32)
    custom = usermodel.load(_write(tmp_path, "custom", """
        import keras
        def loss(y_true, y_pred):      # the textbook per-example MSE
            return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)
        def build_model(): pass
    """))
    assert float(usermodel.loss_fn(custom)(y, out)) == pytest.approx(np.mean([0.25, 0.0, 1.0]))
    named = usermodel.load(_write(tmp_path, "named", """
        loss = "binary_crossentropy"   # on sigmoid outputs [N, 1]
        def metrics():
            return ["accuracy"]
        def build_model(): pass
    """))
    loss = usermodel.loss_fn(named)
    probs = np.array([[0.2], [0.9], [0.6]], dtype=np.float32)
    assert float(loss(np.array([0.0, 1.0, 0.0]), probs)) > 0
    accuracy, = usermodel.metric_objects(named, loss)
    accuracy.update_state(np.array([0.0, 1.0, 0.0]), probs)
    assert type(accuracy).__name__ == "BinaryAccuracy" and float(accuracy.result()) == pytest.approx(2 / 3)


@pytest.mark.parametrize("body, fragment", [
    ("loss = 'mean_squired_error'\n", "loss 'mean_squired_error' is not a Keras loss name"),
    ("loss = 3\n", "loss must be a Keras loss name, a keras.losses object or a function"),
    ("def metrics():\n    return ['acuracy']\n", "metrics() returned 'acuracy', which is not a Keras metric name"),
    ("def metrics():\n    return 'mae'\n", "metrics() returned str; it must return a list of Keras metrics"),
    ("def metrics():\n    return ['mae', 'mae']\n", "metrics() returned metrics with the same name"),
    ("def within(y_true, y_pred):\n    return abs(y_true - y_pred) < 1\ndef metrics():\n    return [within]\n",
     "metrics() returned function, not a keras.metrics.Metric (or name); wrap a function of (y_true, y_pred) as "
     "keras.metrics.MeanMetricWrapper(within, name=...)"),
])
def test_loss_and_metrics_keras_cannot_resolve(tmp_path, body, fragment):
    pytest.importorskip("keras")
    module = usermodel.load(_write(tmp_path, "unresolved", "def build_model(): pass\n" + body))
    with pytest.raises(usermodel.ModelModuleError) as err:
        usermodel.metric_objects(module)
    assert str(err.value).startswith("model module unresolved.py: ") and fragment in str(err.value)


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


def test_a_reason_keeps_where_in_the_user_s_code_a_traced_keras_error_was_raised():
    exc = ValueError('in user code:\n\n    File "/m/mymodel.py", line 12, in call\n        return self.d(x)\n\n'
                     "    ValueError: Exception encountered when calling MyLayer.call().\n\n"
                     "    \x1b[1mInput 0 is incompatible with layer dense: expected axis -1 of 3\x1b[0m\n\n"
                     "    Arguments received by MyLayer.call():\n      • x=tf.Tensor(shape=(2, 4), dtype=float32)")
    assert usermodel.reason(exc) == ('in user code: File "/m/mymodel.py", line 12, in call return self.d(x) '
                                     "Input 0 is incompatible with layer dense: expected axis -1 of 3")


def test_a_reason_leaves_out_the_batchs_numbers_and_stays_short():
    batch = np.arange(160, dtype=np.float64).reshape(8, 4, 5) / 7
    exc = ValueError(f"Invalid input shape for input {batch}. Expected shape (None, 20), but input has "
                     f"incompatible shape (8, 4, 5)")
    assert usermodel.reason(exc) == ("Invalid input shape for input [...]. Expected shape (None, 20), but input "
                                     "has incompatible shape (8, 4, 5)")
    long = usermodel.reason(ValueError("word " * 400))
    assert len(long) == usermodel.REASON_CHARS and long.endswith("...")


@pytest.mark.parametrize("loss, outputs, labels", [
    ("sparse_categorical_crossentropy", (7, 5), (7,)),      # a class id per token of a sequence
    ("sparse_categorical_crossentropy", (7, 5), (7, 1)),
    (None, (3,), (1,)),                                      # the default loss, class ids as [1]
    ("mse", (7, 1), (7,)),                                   # a last axis of 1: Keras squeezes it
    ("mse", (7,), (7, 1)),
    ("categorical_crossentropy", (3,), (3,)),                # one-hot labels
    ("binary_crossentropy", (1,), ()),
    ("huber", (), ()),
    ("cosine_similarity", (4,), (4,)),
])
def test_labels_of_shapes_keras_pairs_with_the_outputs_pass(tmp_path, loss, outputs, labels):
    """Keras's own losses, judged: each pairs these shapes itself (no error raised here)."""
    pytest.importorskip("keras")
    body = (f"loss = {loss!r}\n" if loss else "") + "def build_model(): pass\n"
    module = usermodel.load(_write(tmp_path, "fits", body))
    usermodel._check_label_shape(module, usermodel.loss_fn(module), labels, outputs)


def test_a_loss_of_the_modules_own_or_an_unusual_keras_one_is_not_judged(tmp_path):
    pytest.importorskip("keras")
    module = usermodel.load(_write(tmp_path, "own", """
        import keras
        class Weighted(keras.losses.MeanSquaredError):   # a subclass of the module's own
            pass
        loss = Weighted()
        def build_model(): pass
    """))
    usermodel._check_label_shape(module, usermodel.loss_fn(module), (3,), (1,))
    ctc = usermodel.load(_write(tmp_path, "ctc", "import keras\nloss = keras.losses.CTC()\ndef build_model(): pass\n"))
    usermodel._check_label_shape(ctc, usermodel.loss_fn(ctc), (12,), (30, 28))


def test_accuracy_under_a_loss_of_the_modules_own_is_picked_from_the_shapes_as_keras_compile_does(tmp_path):
    """'accuracy' with a loss Keras does not name: binary, sparse or categorical accuracy by the first batch's
    shapes, as Model.compile picks it (an exact equality refused class ids against scores)."""
    pytest.importorskip("keras")
    import keras

    module = usermodel.load(_write(tmp_path, "own", """
        import keras
        def loss(y_true, y_pred):
            return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        def build_model():
            return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])
        def metrics():
            return ["accuracy"]
    """))
    model = usermodel.build_model(module, (4,))
    usermodel.check_batch(module, model, np.zeros((2, 4), np.float32), np.array([0, 2]))
    scores = np.array([[5.0, 0, 0], [0, 0, 5.0], [0, 5.0, 0]], np.float32)
    for labels, want in ((np.array([0, 2, 0]), "SparseCategoricalAccuracy"),
                         (np.eye(3, dtype=np.float32)[[0, 2, 0]], "CategoricalAccuracy")):
        metric, = usermodel.metric_objects(module)
        metric.update_state(labels, scores)
        assert type(metric.chosen).__name__ == want and float(metric.result()) == pytest.approx(2 / 3)
    binary, = usermodel.metric_objects(module)
    binary.update_state(np.array([[1.0], [0.0]]), np.array([[0.9], [0.2]]))
    assert type(binary.chosen).__name__ == "BinaryAccuracy" and float(binary.result()) == 1.0
    focal = keras.losses.CategoricalFocalCrossentropy(from_logits=True)
    assert type(usermodel._accuracy_for(focal)).__name__ == "CategoricalAccuracy"
