"""The default optimizer: Keras's Adam, each variable's update one locked TensorFlow kernel.

Under ``parameter_server`` the workers' steps update the same variables at once, on the parameter server.
Keras's Adam updates a variable in separate ops: it adds the gradient into its first moment ``m``, then into
its second moment ``v``, then reads both and moves the variable by ``alpha * m / (sqrt(v) + epsilon)``. When
one worker's step reads ``m`` after another's gradient went into it but ``v`` before it did, and the
coordinate's ``v`` is still about 0 (its gradients were all 0 so far: a ReLU unit no batch has switched on
yet), that read divides by ``epsilon`` (1e-7): one step moves the coordinate by hundreds or thousands where
Adam's steps are a few thousandths. The diabetes example's regression run that diverged under
``parameter_server`` had exactly one such weight (704 in its second hidden layer, every other below 1).

:class:`LockedAdam` does the same arithmetic as Keras's Adam in TensorFlow's fused kernel
(``ResourceApplyAdam``) with ``use_locking``: the kernel holds the variable's, ``m``'s and ``v``'s locks for
the whole update, so another step's update of the same variable comes wholly before or wholly after it.
Sparse gradients (``tf.IndexedSlices``: an ``Embedding`` layer's) and ``amsgrad`` keep Keras's own update:
Keras's arithmetic on a sparse gradient is not the dense one (its second moment comes out otherwise, so the
kernel on the densified gradient would change the training), and the kernel has no ``amsgrad``; under
``parameter_server`` those updates are not atomic.

A model module's own ``make_optimizer`` gets the same protection under ``parameter_server`` when it returns
Keras's ``Adam`` or ``AdamW`` itself (:func:`for_parameter_server`): the harness makes that very object a
:class:`LockedAdam` and says so.  Any other optimizer but SGD and Lion (which never divide) is kept, with a
warning that its updates may not be atomic there.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

#: optimizers whose updates never divide by an accumulated moment: under ``parameter_server`` two workers'
#: interleaved updates of a variable can lose one another's part, but no step can be unbounded
NEVER_DIVIDE = ("SGD", "Lion")


@keras.saving.register_keras_serializable(package="tfc_harness")    # copy.deepcopy and Keras's deserializer find it
class LockedAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose update of each variable is atomic (see the module's text)."""

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            # Python runs this once per trace: the variables whose updates are Keras's own (not_atomic_updates)
            kind = "amsgrad" if self.amsgrad else "a sparse gradient"
            path = getattr(variable, "path", None) or variable.name
            self._tfc_keras_updates = getattr(self, "_tfc_keras_updates", frozenset()) | {(kind, path)}
            return super().update_step(gradient, variable, learning_rate)
        variable = variable.value if isinstance(variable, keras.Variable) else variable
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        return tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].value.handle, v=self._velocities[index].value.handle,
            beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step), lr=tf.cast(learning_rate, dtype),
            beta1=beta_1, beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype), use_locking=True)


def for_parameter_server(optimizer) -> tuple[Any, str | None]:
    """The optimizer to train with under ``parameter_server`` in place of ``optimizer`` (a model module's
    ``make_optimizer``'s), and a line for the user about the change or the risk (None: nothing to say).

    Keras's own ``Adam`` and ``AdamW`` (the classes themselves, not a subclass, whose update may be its own;
    not ``amsgrad``), also inside a ``LossScaleOptimizer``, become :class:`LockedAdam` in place: the same
    object, so everything the user set stays as it is (learning rate or schedule, betas, epsilon, weight
    decay and the variables it excludes, clipping, EMA, gradient accumulation), and :class:`LockedAdam` only
    replaces Adam's update of a variable by the same arithmetic in one locked kernel."""
    inner = _innermost(optimizer)
    name = _public_name(inner)
    if isinstance(inner, LockedAdam) or isinstance(inner, tuple(_classes(NEVER_DIVIDE))):
        return optimizer, None
    if type(inner) in (keras.optimizers.Adam, keras.optimizers.AdamW) and not inner.amsgrad:
        inner.__class__ = LockedAdam
        return optimizer, (f"make_optimizer's {name} runs as tfc_harness.optimizers.LockedAdam, the same "
                           "optimizer whose Adam update of each variable is one locked kernel: under "
                           "parameter_server Keras's own can interleave two workers' updates and diverge "
                           "(README, Known limits)")
    return optimizer, (f"warning: make_optimizer returns {name}: under parameter_server its updates of a "
                       "variable may interleave with another worker's, and an update that divides by a second "
                       "moment (Adam's amsgrad, RMSprop, Adagrad and the like) can then divide by about "
                       "epsilon and diverge (README, Known limits); tfc_harness.optimizers.LockedAdam is Adam "
                       "with atomic updates")


def _innermost(optimizer):
    """The optimizer that updates the variables: inside any ``LossScaleOptimizer``s around it."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _classes(names) -> list[type]:
    return [cls for cls in (getattr(keras.optimizers, n, None) for n in names) if cls is not None]


def _public_name(optimizer) -> str:
    """``keras.optimizers.RMSprop`` for Keras's own classes, ``module.Class`` for others."""
    cls = type(optimizer)
    if getattr(keras.optimizers, cls.__name__, None) is cls:
        return f"keras.optimizers.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def not_atomic_updates(optimizer) -> str | None:
    """For the user, once the train step was traced: which variables a :class:`LockedAdam` (also inside a
    ``LossScaleOptimizer``) updates with Keras's own update, which is not atomic under ``parameter_server``
    (their gradients are sparse, an ``Embedding``'s, or the optimizer has ``amsgrad``); None when none."""
    updates = sorted(getattr(_innermost(optimizer), "_tfc_keras_updates", ()))
    if not updates:
        return None
    kinds = sorted({kind for kind, _ in updates})
    paths = [path for _, path in updates]
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    return (f"warning: {len(paths)} variable(s) ({shown}) are updated by Keras's own Adam update ("
            f"{' and '.join(kinds)}), which is not atomic: under parameter_server two workers' updates can "
            "interleave and a step can divide by about epsilon and diverge (README, Known limits)")
