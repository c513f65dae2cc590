"""TensorFlow's import, the lean way, in the controller's harness processes that always need it: the module
check of ``validate`` and ``up`` (:func:`tfc_harness.prepare.load`, before a module that imports TensorFlow or
Keras when it loads, else :func:`tfc_harness.prepare.check` after it), the verifying evaluator, and a task
started without a node's warm interpreter (the tests' own; a warm interpreter imported it already). (A run's data
check of files, :func:`tfc_harness.prepare.run`, imports neither the module nor TensorFlow where its stamp is there;
one of module arrays loads the module, and TensorFlow with it where the module imports it, but no more.)

Keras imports scikit-learn when it is installed, for wrappers no job uses (``keras.wrappers``). The controller's
venv has it (a module's ``make_dataset()`` may use it), the nodes do not (a module importing it when it
loads is refused): on the controller it cost ~0.45-0.55 s of the ~2.4-2.6 s of CPU TensorFlow's import takes, in every
process that imports TensorFlow. While TensorFlow and Keras import, ``sklearn`` is blocked; afterwards it
imports as usual, for a ``make_dataset()`` that wants it. Keras's scikit-learn wrappers (``keras.wrappers``)
stay without it for the rest of the process, as on the nodes: a model module cannot use them there either.
"""

from __future__ import annotations

import sys

#: imported only when something asks for it, not by Keras's own import
DEFERRED = "sklearn"


def import_tensorflow() -> None:
    """Import TensorFlow and Keras (once a process) without importing :data:`DEFERRED`."""
    if "tensorflow" in sys.modules:
        return
    blocked = DEFERRED not in sys.modules
    if blocked:
        sys.modules[DEFERRED] = None        # an import of it raises ImportError, which Keras takes as absent
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        if blocked and sys.modules.get(DEFERRED, False) is None:
            del sys.modules[DEFERRED]
