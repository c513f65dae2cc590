"""Loading a user model module and calling it: the model-module contract, version 2.

The contract (documented for users in ``train/README.md``, "The model module")::

    def build_model(): ...              # required; may take one parameter, ``hparams`` (a dict)
    def make_dataset(): ...             # small data built on the controller: {"train": (x, y), "test": (x, y)}
    def decode(record): ...             # TFRecord data in object storage: serialized record -> (features, label)
    loss = "mse"                        # a Keras loss name, a keras.losses object or fn(y_true, y_pred);
                                        #   default: sparse categorical cross-entropy (from logits: FROM_LOGITS)
    def metrics(): ...                  # Keras metrics on the test split, the first is the headline;
                                        #   default: accuracy with the default loss, none (the loss) otherwise
    def make_optimizer(learning_rate): ...   # optional, default Adam (optimizers.LockedAdam)
    FROM_LOGITS = True                  # optional, version 1: whether build_model outputs logits

Data comes from ``make_dataset()`` or from files in object storage (the cluster file's ``data:``, read with
``decode`` for TFRecord), so ``make_dataset`` is no longer required by :func:`load`.

``model_module`` is either a bare name, looked up as ``<harness_dir>/models/<name>.py`` (the ``models``
folder next to this package), or an absolute path to a ``.py`` file.  Whatever goes wrong in the user's
code (an import error, an exception in one of its functions, a value the harness cannot use) is raised as
:class:`ModelModuleError` naming the module's file and the function, never as a bare traceback.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import ModelModuleError, label_outside_the_classes, message_lines, outside_the_classes

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

__all__ = ["ModelModuleError", "build_model", "call", "check_batch", "fail", "from_logits", "label", "load",
           "loss_fn", "make_optimizer", "metric_objects", "probability_fn", "resolve_path"]

#: the optional names whose absence changes a run without an error (their defaults apply): what a slip of the
#: module's own for each would be (a function taking one of these numbers of parameters, or a bool) and what the
#: run then does (``FROM_LOGITS`` only where it would matter: under the default loss, and a slip that says False)
_SILENT_DEFAULTS = {"metrics": ((0,), "reports the loss alone"),
                    "make_optimizer": ((0, 1), "trains with Adam"),
                    "FROM_LOGITS": (bool, "takes build_model's outputs for logits")}
#: how close a name must be to one of them to be taken for a slip (difflib's ratio, case ignored, above
#: this): ``metric`` and ``make_optimiser`` are; ``optimizer``, ``numerics`` and ``custom_metrics`` are not
_SLIP_RATIO = 0.8

# Loss classes whose logits the served model turns into probabilities, and how.
_SOFTMAX_LOSSES = {"SparseCategoricalCrossentropy", "CategoricalCrossentropy", "CategoricalFocalCrossentropy"}
_SIGMOID_LOSSES = {"BinaryCrossentropy", "BinaryFocalCrossentropy"}


def label(module: ModuleType) -> str:
    """How messages name the module: its file name (``mymodel.py``), else its import name."""
    path = getattr(module, "__file__", None)
    return Path(path).name if path else module.__name__


def fail(module: ModuleType, function: str, problem: str) -> ModelModuleError:
    """``model module mymodel.py: make_dataset() <problem>``"""
    return ModelModuleError(f"model module {label(module)}: {function}() {problem}")


def call(module: ModuleType, function: str, *args) -> Any:
    """``module.<function>(*args)``; an exception from the user's code becomes a :class:`ModelModuleError`."""
    try:
        return getattr(module, function)(*args)
    except ModelModuleError:
        raise
    except Exception as exc:
        raise fail(module, function, f"raised {type(exc).__name__}{_where(module, exc)}: {exc}") from exc


def _where(module: ModuleType, exc: BaseException) -> str:
    """`` at line N``: the module's line the error last passed through (where it was raised, or the call into
    the library that raised it), or '' when the traceback holds none of the module's lines."""
    path, line, frame = getattr(module, "__file__", None), None, exc.__traceback__
    while frame is not None:
        if path and frame.tb_frame.f_code.co_filename == path:
            line = frame.tb_lineno
        frame = frame.tb_next
    return f" at line {line}" if line else ""


def resolve_path(model_module: str, models_dir: Path = MODELS_DIR) -> Path:
    """The .py file that ``model_module`` names."""
    if model_module.endswith(".py") or "/" in model_module:
        path = Path(model_module)
        if not path.is_absolute():
            raise ModelModuleError(f"model_module path must be absolute (got {model_module!r})")
    elif _NAME.match(model_module):
        path = models_dir / f"{model_module}.py"
    else:
        raise ModelModuleError(f"model_module must be a module name or an absolute .py path "
                               f"(got {model_module!r})")
    if not path.is_file():
        raise ModelModuleError(f"model module {model_module!r} not found at {path}")
    return path


def _import(path: Path) -> ModuleType:
    name = f"tfc_user_model_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if isinstance(exc, Exception):
            raise ModelModuleError(f"model module {path.name}: importing it raised "
                                   f"{type(exc).__name__}: {exc}") from exc
        raise
    return module


def load(model_module: str | ModuleType, models_dir: Path = MODELS_DIR) -> ModuleType:
    """Import the model module (a module object is checked and returned as is)."""
    if isinstance(model_module, ModuleType):
        module = model_module
    else:
        module = _import(resolve_path(model_module, models_dir))
    if not callable(getattr(module, "build_model", None)):
        raise ModelModuleError(f"model module {label(module)} has no build_model() function"
                               + slip_hint(module, "build_model", (0, 1)))
    for optional in ("make_dataset", "decode", "metrics", "make_optimizer"):
        value = getattr(module, optional, None)
        if value is not None and not callable(value):
            hint = _module_hint(optional, value) if isinstance(value, ModuleType) else ""
            raise ModelModuleError(f"model module {label(module)}: {optional} must be a function "
                                   f"(got {type(value).__name__}){hint}")
    _refuse_slips(module)
    return module


def _module_hint(name: str, value: ModuleType) -> str:
    """What to do when an import bound a module to a name the run reads as a function."""
    parent, _, leaf = value.__name__.rpartition(".")
    rebind = f"from {parent} import {leaf} as ..." if parent else f"import {leaf} as ..."
    return (f": the module {value.__name__}, bound to that name by an import; import it under another name "
            f"({rebind}): a run calls {name}() as a function the module defines")


def slip_hint(module: ModuleType, name: str, shape) -> str:
    """`` (it defines decod(): a misspelt name?)`` for a function missing under ``name`` (:func:`_slips_of`), or
    ''."""
    slips = _slips_of(module, name, shape)
    return f" (it defines {slips[0]}(): a misspelt name?)" if slips else ""


def _slips_of(module: ModuleType, name: str, shape) -> list[str]:
    """The module's own top-level names that look like a slip for ``name``: close to it (case ignored) and of
    its ``shape`` (``bool``: the value False, the one that changes what a missing ``FROM_LOGITS`` means; or the
    numbers of parameters its function may take: a function defined in the module, not one it imported)."""
    found = []
    for own, value in vars(module).items():
        if own == name or own.startswith("_") or \
                difflib.SequenceMatcher(None, own.lower(), name.lower()).ratio() <= _SLIP_RATIO:
            continue
        if shape is bool:
            fits = value is False
        else:
            own_function = inspect.isfunction(value) and value.__module__ == module.__name__
            takes = _required_and_most(value) if own_function else None
            fits = takes is not None and any(takes[0] <= n <= takes[1] for n in shape)
        if fits:
            found.append(own)
    return sorted(found)


def _required_and_most(function) -> tuple[int, float] | None:
    """How many positional parameters ``function`` requires and takes at most (inf with ``*args``); None when
    it cannot be called with positional arguments alone (a required keyword-only parameter)."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    most = float("inf") if any(p.kind is p.VAR_POSITIONAL for p in params) else len(positional)
    return required, most


def _refuse_slips(module: ModuleType) -> None:
    """Refuse a module that lacks one of the optional names a run would silently do without (``metrics``: the
    loss alone reported; ``make_optimizer``: Adam; ``FROM_LOGITS``: logits assumed) but defines what looks
    like a slip for it (``metric()``, ``make_optimiser(lr)``, ``FROM_LOGIT = False``): that run would ignore it."""
    for name, (shape, default) in _SILENT_DEFAULTS.items():
        if hasattr(module, name) or (name == "FROM_LOGITS" and getattr(module, "loss", None) is not None):
            continue
        slips = _slips_of(module, name, shape)
        if slips:
            if name == "metrics" and getattr(module, "loss", None) is None:
                default = "reports accuracy alone (the default loss's metric)"
            what = f"{name} = ..." if shape is bool else f"{name}()"
            got = f"{slips[0]} = {getattr(module, slips[0])!r}" if shape is bool else f"{slips[0]}()"
            raise ModelModuleError(f"model module {label(module)} defines {got} but no {what}: a run reads "
                                   f"{name} only, and without it {default}; rename it {name}, or give a "
                                   f"helper of yours a name unlike it (or one starting with _)")


def has_dataset(module: ModuleType) -> bool:
    """Whether the module builds its own (small) data set with ``make_dataset()``."""
    return callable(getattr(module, "make_dataset", None))


def from_logits(module: ModuleType) -> bool:
    """Whether ``build_model()`` outputs logits (True, the default) or probabilities."""
    value = getattr(module, "FROM_LOGITS", True)
    if not isinstance(value, bool):
        raise ModelModuleError(f"model module {label(module)}: FROM_LOGITS must be a bool (got {value!r})")
    return value


def make_optimizer(module: ModuleType, learning_rate: float):
    """The module's ``make_optimizer(learning_rate)``, or Keras's Adam with atomic updates
    (:class:`tfc_harness.optimizers.LockedAdam`)."""
    if getattr(module, "make_optimizer", None) is None:
        from .optimizers import LockedAdam
        return LockedAdam(learning_rate=learning_rate)
    optimizer = call(module, "make_optimizer", learning_rate)
    if not callable(getattr(optimizer, "apply_gradients", None)):
        raise fail(module, "make_optimizer", f"returned {type(optimizer).__name__}, not a Keras optimizer")
    return optimizer


def takes_hparams(module: ModuleType) -> bool:
    """Whether ``build_model`` takes a parameter (it then gets ``training.hparams``)."""
    try:
        params = inspect.signature(module.build_model).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


class ReadHparams(dict):
    """``training.hparams`` as the job's check passes them to ``build_model``, noting the names it looks up
    (``read``: ``h["units"]``, ``h.get``, ``in``, ``setdefault``, ``pop``) and whether it went through them all
    (``whole``: iterated, listed, copied or unpacked them, so each may be used)."""

    def __init__(self, values: dict):
        super().__init__(values)
        self.given = tuple(values)      # not what build_model adds itself
        self.read: set = set()
        self.whole = False

    def _named(self, key):
        self.read.add(key)
        return key

    def __getitem__(self, key):
        return super().__getitem__(self._named(key))

    def __contains__(self, key):
        return super().__contains__(self._named(key))

    def get(self, key, default=None):
        return super().get(self._named(key), default)

    def setdefault(self, key, default=None):
        return super().setdefault(self._named(key), default)

    def pop(self, key, *default):
        return super().pop(self._named(key), *default)

    def _all(self):
        self.whole = True
        return self

    def __iter__(self):
        return super(ReadHparams, self._all()).__iter__()

    def keys(self):
        return super(ReadHparams, self._all()).keys()

    def items(self):
        return super(ReadHparams, self._all()).items()

    def values(self):
        return super(ReadHparams, self._all()).values()

    def copy(self):
        return dict(self._all().items())

    def __or__(self, other):
        return dict(self._all().items()) | other


def hparams_reads(module: ModuleType, hparams: dict) -> ReadHparams | None:
    """What ``build_model(hparams)`` looks up in ``hparams``, or None where that cannot be told: it takes no
    hparams, went through the whole mapping, returned a model not built yet that may read more when built, or
    fails only with the noting mapping. Its own errors are raised as :func:`build_model` raises them."""
    if not hparams or not takes_hparams(module):
        return None
    given = ReadHparams(hparams)
    try:
        model = module.build_model(given)
    except Exception:
        build_model(module, None, hparams)      # the user's own error, named as the check names it
        return None
    unread = [k for k in given.given if k not in given.read]
    if given.whole or unread and not getattr(model, "built", True):
        return None
    return given


def build_model(module: ModuleType, example_shape: tuple[int, ...] | None, hparams: dict | None = None):
    """A new model from ``build_model([hparams])``, built for ``[None, *example_shape]`` if it is not yet."""
    if takes_hparams(module):
        model = call(module, "build_model", dict(hparams or {}))
    elif hparams:
        raise fail(module, "build_model", f"takes no parameter, but training.hparams is set ({hparams}); "
                   "define build_model(hparams) to use them")
    else:
        model = call(module, "build_model")
    if not callable(model) or not hasattr(model, "trainable_variables"):
        raise fail(module, "build_model", f"returned {type(model).__name__}, not a Keras model")
    if not model.built and example_shape is not None:
        try:
            model.build((None, *example_shape))
        except Exception as exc:
            raise fail(module, "build_model", f"returned a model that cannot take inputs of shape "
                       f"{(None, *example_shape)}: {type(exc).__name__}: {reason(exc)}") from exc
    return model


def loss_fn(module: ModuleType):
    """The module's ``loss`` as a Keras loss object; the default is sparse categorical cross-entropy (from
    logits unless ``FROM_LOGITS = False``).  A loss name or a plain function ``fn(y_true, y_pred)`` is wrapped
    so that labels of shape ``[N]`` meet outputs of shape ``[N, 1]`` as ``[N, 1]`` (as Keras's own loss
    classes do), not broadcast to ``[N, N]``."""
    import keras

    value = getattr(module, "loss", None)
    if value is None:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits(module))
    if isinstance(value, str):
        try:
            fn = keras.losses.get(value)
        except (ValueError, TypeError):
            raise ModelModuleError(f"model module {label(module)}: loss {value!r} is not a Keras loss name "
                                   "(e.g. 'mse', 'mae', 'binary_crossentropy', "
                                   "'sparse_categorical_crossentropy'), a keras.losses object or a function "
                                   "fn(y_true, y_pred)") from None
        return fn if isinstance(fn, keras.losses.Loss) else _aligned(fn, getattr(fn, "__name__", value))
    if isinstance(value, keras.losses.Loss):
        return value
    if callable(value):
        return _aligned(value, getattr(value, "__name__", "loss"))
    raise ModelModuleError(f"model module {label(module)}: loss must be a Keras loss name, a keras.losses "
                           f"object or a function fn(y_true, y_pred) (got {type(value).__name__})")


def _aligned(fn, name: str):
    """``fn(y_true, y_pred)`` as a Keras loss whose labels get the outputs' rank when they lack a last axis
    of size 1 (Keras's ``squeeze_or_expand_to_same_rank`` rule, which its loss classes apply)."""
    import keras

    class AlignedLoss(keras.losses.Loss):
        def call(self, y_true, y_pred):
            if len(y_true.shape) == len(y_pred.shape) - 1 and y_pred.shape[-1] == 1:
                y_true = keras.ops.expand_dims(y_true, -1)
            return fn(y_true, y_pred)

    loss = AlignedLoss(name=name)
    loss.fn_name = getattr(fn, "__name__", name)
    loss.keras_own = getattr(fn, "__module__", "").startswith("keras.")    # a name Keras resolved, or fn
    return loss


#: Keras's own losses whose labels have the shape of the outputs (their names, lower case, without "_"):
#: for these a label that does not is broadcast against them, without an error
SAME_SHAPE_LOSSES = frozenset({
    "meansquarederror", "meanabsoluteerror", "meanabsolutepercentageerror", "meansquaredlogarithmicerror",
    "huber", "logcosh", "binarycrossentropy", "binaryfocalcrossentropy", "categoricalcrossentropy",
    "categoricalfocalcrossentropy", "hinge", "squaredhinge", "categoricalhinge", "kldivergence", "kld",
    "poisson", "cosinesimilarity", "dice", "tversky"})
#: Keras's own losses that take class ids against the outputs' scores: labels of the outputs' shape less its
#: last axis (or with 1 there)
SPARSE_LOSSES = frozenset({"sparsecategoricalcrossentropy"})
#: Keras's own losses whose labels are probabilities (0 or 1 for a class, or between): a label of 2 under binary
#: cross-entropy raises nothing, its loss goes negative and the run trained and verified a model on it (test
#: accuracy 0.34, test loss -1.62, reported as a success)
PROBABILITY_LOSSES = frozenset({"binarycrossentropy", "binaryfocalcrossentropy", "categoricalcrossentropy",
                                "categoricalfocalcrossentropy"})


def _keras_own(loss) -> bool:
    """Whether ``loss`` is one of Keras's own (a class of it, or a name or function Keras resolved)."""
    return getattr(loss, "keras_own", type(loss).__module__.startswith("keras."))


def probability_labels(loss) -> bool:
    """Whether ``loss`` is one of Keras's own that takes labels between 0 and 1 (:data:`PROBABILITY_LOSSES`)."""
    return _keras_own(loss) and loss_name(loss).replace("_", "").lower() in PROBABILITY_LOSSES


def probability_label_advice(loss) -> str:
    """What a loss of :data:`PROBABILITY_LOSSES` takes, and what to do about a label outside 0 to 1."""
    name = loss_name(loss)
    if name.replace("_", "").lower().startswith("binary"):
        return f"{name} takes 0 or 1 for a class, or a probability between: number the two classes 0 and 1"
    return (f"{name} takes one-hot labels, or a probability per class: one-hot encode class ids, or give them to "
            "sparse_categorical_crossentropy (the default loss)")


def shown_label(value) -> str:
    """A label in a message: ``2`` for 2.0, ``0.5``, ``1000000``."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def outside_0_to_1(labels) -> float | None:
    """The first of ``labels`` (an array or tensor) below 0 or above 1, or None."""
    import numpy as np

    values = np.asarray(labels, dtype=np.float64)
    outside = values[(values < 0) | (values > 1)]
    return float(outside.flat[0]) if outside.size else None


def check_probability_labels(module: ModuleType, loss, labels, data_format: str | None) -> None:
    """Under a loss of :data:`PROBABILITY_LOSSES`, every label (a numpy array) is between 0 and 1."""
    value = outside_0_to_1(labels) if probability_labels(loss) else None
    if value is not None:
        source = "the data files" if data_format else "make_dataset()'s labels"
        raise ModelModuleError(f"model module {label(module)}: {source} hold the label {shown_label(value)}, "
                               f"outside 0 to 1: {probability_label_advice(loss)}")


def _check_label_shape(module: ModuleType, loss, label_shape: tuple, output_shape: tuple,
                       data_format: str | None = None) -> None:
    """Under one of Keras's own same-shape losses (:data:`SAME_SHAPE_LOSSES`) an example's label has the shape
    of the model's output for it, but for a last axis of 1 on either side (Keras squeezes or expands it); under a
    sparse one (:data:`SPARSE_LOSSES`) the outputs' shape less its last axis. Otherwise Keras broadcasts them,
    ``[3]`` labels against a ``[1]`` output say, and trains on nonsense without an error. Other losses (CTC,
    a loss of the module's own) may want other shapes: not judged."""
    if not _keras_own(loss):
        return
    name = loss_name(loss)
    wanted = _wanted_labels(name, SAME_SHAPE_LOSSES, SPARSE_LOSSES, label_shape, output_shape)
    if wanted:
        raise ModelModuleError(f"model module {label(module)}: labels of shape {label_shape} per example do not "
                               f"fit the model's outputs of shape {output_shape} under loss {name}: "
                               f"Keras would broadcast them and train on nonsense; "
                               f"{_sparse_fix(name, label_shape, output_shape)}{_label_fix(data_format, wanted)}")


def _sparse_fix(name: str, label_shape: tuple, output_shape: tuple) -> str:
    """Under the categorical cross-entropy (one-hot labels), one number per example against several outputs:
    class ids, which its sparse form takes."""
    if name.lower().replace("_", "") == "categoricalcrossentropy" and all(d == 1 for d in label_shape) and \
            len(output_shape) == 1 and output_shape[0] > 1:
        return ("for class ids (one number per example) use loss = "
                "keras.losses.SparseCategoricalCrossentropy(from_logits=...) or the default loss; else ")
    return ""


#: Keras's own metrics (their class names, lower case) whose labels have the outputs' shape (one-hot for the
#: categorical ones), and those that take class ids: the other kind of label gives a figure, and a wrong one
SAME_SHAPE_METRICS = frozenset({"categoricalaccuracy", "topkcategoricalaccuracy", "categoricalcrossentropy"})
SPARSE_METRICS = frozenset({"sparsecategoricalaccuracy", "sparsetopkcategoricalaccuracy",
                            "sparsecategoricalcrossentropy"})


def _check_metric_label_shape(module: ModuleType, metric, label_shape: tuple, output_shape: tuple,
                              data_format: str | None) -> None:
    """A categorical metric of Keras's own (:data:`SAME_SHAPE_METRICS`, :data:`SPARSE_METRICS`) on labels of the
    other kind computes without an error, and scores nonsense: ``CategoricalAccuracy`` on class ids 0.0."""
    if not type(metric).__module__.startswith("keras."):
        return
    kind = type(metric).__name__
    wanted = _wanted_labels(kind, SAME_SHAPE_METRICS, SPARSE_METRICS, label_shape, output_shape)
    giver = _label_giver(data_format)
    if wanted:
        other = "Sparse" + kind if kind.lower() in SAME_SHAPE_METRICS else kind.removeprefix("Sparse")
        raise ModelModuleError(f"model module {label(module)}: metric {metric.name!r} ({kind}) wants labels of "
                               f"shape {wanted} per example, not {label_shape}: it would score nonsense without an "
                               f"error; use {other} for these labels" + (f", or have {giver} give labels of shape "
                                                                           f"{wanted}" if giver else ""))


def _wanted_labels(name: str, same_shape: frozenset, sparse: frozenset, label_shape: tuple,
                   output_shape: tuple) -> str | None:
    """The label shape per example that ``name`` (a loss's or metric's, matched lower case without "_" against
    ``same_shape`` and ``sparse``) wants for these outputs when ``label_shape`` is not it, else None."""
    kind = name.replace("_", "").lower()

    def squeezed(shape: tuple) -> tuple:
        return shape[:-1] if shape[-1:] == (1,) else shape

    if kind in sparse:
        fits = squeezed(label_shape) == output_shape[:-1]
        wanted = f"{output_shape[:-1]} (a class id each)"
    elif kind in same_shape:
        fits = squeezed(label_shape) == squeezed(output_shape)
        wanted = f"{output_shape}" + (" or () for a single value" if output_shape == (1,) else "")
    else:
        return None
    return None if fits else wanted


def _check_not_softmax_twice(module: ModuleType, loss, outputs) -> None:
    """A softmax cross-entropy on logits (the default loss) over outputs that are already a softmax's (each
    example's several outputs in [0, 1], summing to 1) applies the softmax twice: the model learns slowly if at
    all, and the served ``probabilities`` are a softmax of probabilities. Refused, naming both fixes."""
    import numpy as np

    if probability_fn(loss) != "softmax":
        return
    values = np.asarray(outputs, dtype=np.float64)
    if values.ndim < 2 or values.shape[-1] < 2 or not np.all((values >= 0) & (values <= 1)) or \
            not np.allclose(values.sum(axis=-1), 1.0, atol=1e-4):
        return
    unset = getattr(module, "loss", None) is None
    fix = "set FROM_LOGITS = False (the default loss then takes probabilities)" if unset else \
        "give the loss from_logits=False"
    raise ModelModuleError(f"model module {label(module)}: build_model's outputs are probabilities (each example's "
                           f"{values.shape[-1]} sum to 1: a softmax), but the loss ({'the default, ' if unset else ''}"
                           f"{loss_name(loss)}) takes logits and applies a softmax again; {fix}, or drop the "
                           f"model's last softmax")


def _label_fix(data_format: str | None, wanted: str) -> str:
    """How to make the labels fit, by where they come from (:func:`_label_giver`): the module's own code that
    gives them, or a label column's one number per example (then only the model's outputs can change)."""
    giver = _label_giver(data_format)
    if giver:
        return f"have {giver} give labels of shape {wanted}, or change the model's outputs"
    return (f"the {data_format} files' label column (data.label) gives one number per example: change the "
            f"model's outputs")


def _label_giver(data_format: str | None) -> str | None:
    """The module's function that gives the labels (``data_format``: the data files' format, None for
    ``make_dataset()``'s arrays), or None: a label column of the files."""
    if data_format is None:
        return "make_dataset()"
    from . import formats

    return "decode()" if formats.get(data_format).needs_decode else None


def _loss_hint(module: ModuleType, loss, output_shape) -> str:
    """A likely cause of a sparse cross-entropy failing on a model with one output unit: a binary classifier (or
    a regression) under the default loss, which wants one output per class."""
    if loss_name(loss).replace("_", "").lower() not in SPARSE_LOSSES or tuple(output_shape)[-1:] != (1,):
        return ""
    unset = "" if getattr(module, "loss", None) is not None else (
        f"the module sets no loss, and the default is sparse categorical cross-entropy"
        f"{' from logits' if from_logits(module) else ''}, which wants an output per class; ")
    return (f" ({unset}a model with one output unit wants loss = 'binary_crossentropy' as a binary classifier "
            f"(keras.losses.BinaryCrossentropy(from_logits=True) on logits) or e.g. 'mse' as a regression)")


def loss_name(loss) -> str:
    """What the loss is called in messages: the wrapped function's name, or the Keras class's."""
    return getattr(loss, "fn_name", None) or type(loss).__name__


def probability_fn(loss) -> str | None:
    """``"softmax"`` or ``"sigmoid"`` when ``loss`` is a classification loss on logits (the served model
    then also returns probabilities), else None."""
    kind = type(loss).__name__
    try:
        on_logits = bool(loss.get_config().get("from_logits"))
    except Exception:
        return None
    if on_logits and kind in _SOFTMAX_LOSSES:
        return "softmax"
    if on_logits and kind in _SIGMOID_LOSSES:
        return "sigmoid"
    return None


_ACCURACY_BY_LOSS = {"sparsecategoricalcrossentropy": "SparseCategoricalAccuracy",
                     "categoricalcrossentropy": "CategoricalAccuracy",
                     "categoricalfocalcrossentropy": "CategoricalAccuracy",
                     "binarycrossentropy": "BinaryAccuracy", "binaryfocalcrossentropy": "BinaryAccuracy"}


def _accuracy_for(loss):
    """What ``"accuracy"`` means for this loss: sparse, categorical or binary accuracy (threshold 0 on logits)
    for Keras's cross-entropies; for another loss (the module's own), what ``Model.compile`` decides from the
    shapes at the first batch (:func:`_shape_accuracy`)."""
    import keras

    kind = _ACCURACY_BY_LOSS.get(loss_name(loss).replace("_", "").lower())
    if kind is None:
        return _shape_accuracy()
    if kind == "BinaryAccuracy":
        return keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0 if probability_fn(loss) else 0.5)
    return getattr(keras.metrics, kind)(name="accuracy")


def _shape_accuracy():
    """``"accuracy"`` as Keras's ``compile`` picks it from the labels' and outputs' shapes: one output, binary
    accuracy; class ids against scores, sparse categorical; else categorical (not an exact equality, which
    refused class ids against scores and scored one-hot labels against scores as nonsense)."""
    import keras

    class ShapeAccuracy(keras.metrics.Metric):
        def __init__(self, name="accuracy"):
            super().__init__(name=name)
            self.chosen = None      # the accuracy the first batch's shapes pick

        def update_state(self, y_true, y_pred, sample_weight=None):
            if self.chosen is None:
                true, pred = tuple(y_true.shape), tuple(y_pred.shape)
                if pred[-1:] == (1,):
                    self.chosen = keras.metrics.BinaryAccuracy(name=self.name)
                elif len(true) < len(pred) or (true[-1:] == (1,) and pred[-1] > 1):
                    self.chosen = keras.metrics.SparseCategoricalAccuracy(name=self.name)
                else:
                    self.chosen = keras.metrics.CategoricalAccuracy(name=self.name)
            self.chosen.update_state(y_true, y_pred, sample_weight)

        def result(self):
            return self.chosen.result() if self.chosen is not None else 0.0

        def reset_state(self):
            if self.chosen is not None:
                self.chosen.reset_state()

    return ShapeAccuracy()


def metric_objects(module: ModuleType, loss=None) -> list:
    """New Keras metric objects from ``metrics()`` (names unique; strings resolved by Keras, ``"accuracy"``
    as ``compile`` would for this loss).  Default: accuracy with the default loss, else none."""
    import keras

    loss = loss if loss is not None else loss_fn(module)
    if getattr(module, "metrics", None) is None:
        return [_accuracy_for(loss)] if getattr(module, "loss", None) is None else []
    items = call(module, "metrics")
    if not isinstance(items, (list, tuple)):
        raise fail(module, "metrics", f"returned {type(items).__name__}; it must return a list of Keras metrics")
    out = []
    for item in items:
        if isinstance(item, str) and item in ("accuracy", "acc"):
            item = _accuracy_for(loss)
        elif isinstance(item, str):
            try:
                item = keras.metrics.get(item)
            except (ValueError, TypeError):
                raise fail(module, "metrics", f"returned {item!r}, which is not a Keras metric name (e.g. 'mae', "
                           "'mse', 'root_mean_squared_error', 'accuracy'); a keras.metrics object is the other "
                           "choice") from None
        if not isinstance(item, keras.metrics.Metric):
            hint = (f"; wrap a function of (y_true, y_pred) as keras.metrics.MeanMetricWrapper("
                    f"{getattr(item, '__name__', 'fn')}, name=...)") if callable(item) else ""
            raise fail(module, "metrics", f"returned {type(item).__name__}, not a keras.metrics.Metric (or name)"
                       f"{hint}")
        out.append(item)
    names = [m.name for m in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise fail(module, "metrics", f"returned metrics with the same name {twice}; give each its own name=")
    return out


#: a printed array (its numbers, brackets and separators) as long as a line or more
_ARRAY = re.compile(r"\[[\[\]\s\d.eE+\-,]{60,}\]")
REASON_CHARS = 600          # a reason longer than this is cut


#: the end of an eager op's error in TensorFlow: the op's name, empty
_NO_OP_NAME = re.compile(r"\s+name:\s*$")


def reason(exc: Exception) -> str:
    """An exception's message on one line: the cause inside Keras's wrapper of a layer's call, after what came
    before the wrapper (:func:`tfc_harness.errors.message_lines`)."""
    text = " ".join(ln.strip() for ln in message_lines(str(exc), keep_before=True))
    text = _ARRAY.sub("[...]", text)     # the batch's numbers, which Keras puts in some messages
    text = _NO_OP_NAME.sub("", text)
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def check_batch(module: ModuleType, model, x, y, loss=None, data_format: str | None = None) -> None:
    """Run ``model`` on one batch and the loss and metrics on its output: the labels must fit the loss.
    ``data_format``: the format of the data files the batch comes from (None: ``make_dataset()``'s arrays),
    for the advice on labels that do not fit.

    Raises :class:`ModelModuleError` naming what failed (the model, the loss or a metric) and the shapes.
    """
    import numpy as np

    loss = loss if loss is not None else loss_fn(module)
    try:
        out = model(x, training=False)
    except Exception as exc:
        raise fail(module, "build_model", f"returned a model that fails on the data's features, of shape "
                   f"{tuple(x.shape)[1:]} per example (what decode() or make_dataset() gives, or the CSV's columns "
                   f"but the label; a batch {tuple(x.shape)}): "
                   f"{type(exc).__name__}: {reason(exc)}") from exc
    if not hasattr(out, "shape"):     # a list or dict of outputs: the loss, metrics and export take one tensor
        raise fail(module, "build_model", f"returned a model with several outputs ({type(out).__name__} of "
                   f"{len(out)}); tfcluster trains a model with one output tensor")
    shapes = f"labels of shape {tuple(np.shape(y))} and model outputs of shape {tuple(out.shape)}"
    labels = np.asarray(y)
    if labels.dtype.kind not in "biuf":      # bool, integers, floats
        first = labels.flat[0] if labels.size else None
        first = first.item() if hasattr(first, "item") else first      # numpy's bytes_/str_ as Python's
        what = f"text ({first!r}, ...)" if isinstance(first, (str, bytes)) else f"{labels.dtype} values"
        raise ModelModuleError(f"model module {label(module)}: the labels are {what}, not numbers (the loss and "
                               f"the metrics need numeric labels: have decode() or make_dataset() return them as "
                               f"numbers, e.g. class ids)")
    _check_label_shape(module, loss, tuple(np.shape(y))[1:], tuple(out.shape)[1:], data_format)
    check_probability_labels(module, loss, labels, data_format)
    _check_not_softmax_twice(module, loss, out)
    try:
        values = np.asarray(loss(y, out))
    except Exception as exc:
        hint = _loss_hint(module, loss, out.shape)
        outside = None if hint else label_outside_the_classes(exc)
        if outside:     # (TensorFlow's words name its op and list the batch's labels)
            value, classes = outside
            # said without the batch's shapes: "labels of shape (8,)" (the examples checked) read as 8 features
            raise ModelModuleError(f"model module {label(module)}: " + outside_the_classes(
                value, classes, f" among the {len(labels)} examples checked")) from exc
        raise ModelModuleError(f"model module {label(module)}: the loss fails on {shapes}: "
                               f"{type(exc).__name__}: {reason(exc)}{hint}") from exc
    n = len(x)
    if values.ndim >= 2 and values.shape[:2] == (n, n) and n > 1:
        raise ModelModuleError(f"model module {label(module)}: the loss broadcasts {shapes} to "
                               f"{values.shape}; make the labels' shape match the outputs'")
    if not np.all(np.isfinite(values)):
        raise ModelModuleError(f"model module {label(module)}: the loss is not finite on {shapes} "
                               f"(labels outside what the loss accepts?){_loss_hint(module, loss, out.shape)}")
    for metric in metric_objects(module, loss):
        _check_metric_label_shape(module, metric, tuple(np.shape(y))[1:], tuple(out.shape)[1:], data_format)
        try:
            metric.update_state(y, out)
            float(metric.result())
        except Exception as exc:
            raise ModelModuleError(f"model module {label(module)}: metric {metric.name!r} fails on {shapes}: "
                                   f"{type(exc).__name__}: {reason(exc)}") from exc
