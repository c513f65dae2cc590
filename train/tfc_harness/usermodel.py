"""Loading a user model module (the interface is documented in ``models/digits.py``).

``model_module`` is either a bare name, looked up as ``<harness_dir>/models/<name>.py`` (the ``models``
folder next to this package), or an absolute path to a ``.py`` file.  Required: ``build_model()`` and
``make_dataset()``.  Optional: ``FROM_LOGITS`` (bool, default True) and ``make_optimizer(learning_rate)``
(default: Keras Adam).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ModelModuleError(ValueError):
    """The model module cannot be found or lacks part of the interface."""


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


def load(model_module: str | ModuleType, models_dir: Path = MODELS_DIR) -> ModuleType:
    """Import the model module (a module object is checked and returned as is)."""
    if isinstance(model_module, ModuleType):
        module = model_module
    else:
        path = resolve_path(model_module, models_dir)
        name = f"tfc_user_model_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    for fn in ("build_model", "make_dataset"):
        if not callable(getattr(module, fn, None)):
            raise ModelModuleError(f"model module {module.__name__} has no {fn}() function")
    return module


def from_logits(module: ModuleType) -> bool:
    """Whether ``build_model()`` outputs logits (True, the default) or probabilities."""
    value = getattr(module, "FROM_LOGITS", True)
    if not isinstance(value, bool):
        raise ModelModuleError(f"{module.__name__}.FROM_LOGITS must be a bool (got {value!r})")
    return value


def make_optimizer(module: ModuleType, learning_rate: float):
    """The module's ``make_optimizer(learning_rate)``, or ``keras.optimizers.Adam``."""
    factory = getattr(module, "make_optimizer", None)
    if factory is not None:
        return factory(learning_rate)
    import keras
    return keras.optimizers.Adam(learning_rate=learning_rate)
