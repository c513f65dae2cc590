"""Loading a user model module and calling it (the interface is documented in ``models/digits.py``).

``model_module`` is either a bare name, looked up as ``<harness_dir>/models/<name>.py`` (the ``models``
folder next to this package), or an absolute path to a ``.py`` file.  Required: ``build_model()`` and
``make_dataset()``.  Optional: ``FROM_LOGITS`` (bool, default True) and ``make_optimizer(learning_rate)``
(default: Keras Adam).

Whatever goes wrong in the user's code (an import error, an exception in one of its functions, a value
the harness cannot use) is raised as :class:`ModelModuleError` naming the module's file and the
function, never as a bare traceback from inside the harness.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import ModelModuleError

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

__all__ = ["ModelModuleError", "build_model", "call", "check_output", "fail", "from_logits", "label", "load",
           "make_optimizer", "resolve_path"]


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
        raise fail(module, function, f"raised {type(exc).__name__}: {exc}") from exc


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
    for fn in ("build_model", "make_dataset"):
        if not callable(getattr(module, fn, None)):
            raise ModelModuleError(f"model module {label(module)} has no {fn}() function")
    return module


def from_logits(module: ModuleType) -> bool:
    """Whether ``build_model()`` outputs logits (True, the default) or probabilities."""
    value = getattr(module, "FROM_LOGITS", True)
    if not isinstance(value, bool):
        raise ModelModuleError(f"model module {label(module)}: FROM_LOGITS must be a bool (got {value!r})")
    return value


def make_optimizer(module: ModuleType, learning_rate: float):
    """The module's ``make_optimizer(learning_rate)``, or ``keras.optimizers.Adam``."""
    if getattr(module, "make_optimizer", None) is None:
        import keras
        return keras.optimizers.Adam(learning_rate=learning_rate)
    optimizer = call(module, "make_optimizer", learning_rate)
    if not callable(getattr(optimizer, "apply_gradients", None)):
        raise fail(module, "make_optimizer", f"returned {type(optimizer).__name__}, not a Keras optimizer")
    return optimizer


def build_model(module: ModuleType, example_shape: tuple[int, ...]):
    """A new model from ``build_model()``, built for ``[None, *example_shape]`` inputs if it is not yet."""
    model = call(module, "build_model")
    if not callable(model) or not hasattr(model, "trainable_variables"):
        raise fail(module, "build_model", f"returned {type(model).__name__}, not a Keras model")
    if not model.built:
        try:
            model.build((None, *example_shape))
        except Exception as exc:
            raise fail(module, "build_model", f"returned a model that cannot take inputs of shape "
                       f"{(None, *example_shape)}: {type(exc).__name__}: {exc}") from exc
    return model


def check_output(module: ModuleType, model, x, num_classes: int) -> None:
    """Run ``model`` on a few examples: it must give one score per class (``[n, >= num_classes]``)."""
    try:
        out = model(x, training=False)
    except Exception as exc:
        raise fail(module, "build_model", f"returned a model that fails on inputs of shape {tuple(x.shape)}: "
                   f"{type(exc).__name__}: {exc}") from exc
    shape = tuple(out.shape)
    if len(shape) != 2 or shape[0] != len(x) or shape[1] < max(num_classes, 2):
        raise fail(module, "build_model", f"returned a model whose output has shape {shape} for {len(x)} "
                   f"examples; it must output one score per class ([{len(x)}, >= {max(num_classes, 2)}]): "
                   "the harness trains classifiers with sparse categorical cross-entropy")
