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
Keras's ``Adam`` or ``AdamW`` itself (:func:`for_parameter_server`): the harness runs it as a
:class:`LockedAdam` of the same configuration and says so.  Another optimizer that divides by a second
moment (RMSprop, Adagrad, ...) is kept, with a warning that its updates are not atomic there.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

#: Keras's optimizers whose update divides by an accumulated second moment (or a norm of it) in ops of its
#: own: under ``parameter_server`` two workers' updates of one variable can interleave, and a step can divide
#: by about ``epsilon``. The names absent from the installed Keras are skipped.
NOT_ATOMIC = ("Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Adafactor", "Ftrl", "Lamb")


class LockedAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` whose update of each variable is atomic (see the module's text)."""

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
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

    Keras's own ``Adam`` and ``AdamW`` (the classes themselves, not a subclass: its update may be its own)
    without ``amsgrad`` become a :class:`LockedAdam` of the same configuration (learning rate or schedule,
    betas, epsilon, weight decay, clipping): the same arithmetic, each variable's update atomic."""
    name = type(optimizer).__name__
    if isinstance(optimizer, LockedAdam):
        return optimizer, None
    if type(optimizer) in (keras.optimizers.Adam, keras.optimizers.AdamW) and not optimizer.amsgrad:
        try:
            locked = LockedAdam.from_config(optimizer.get_config())
        except Exception as exc:     # e.g. a schedule of the module's own that Keras cannot rebuild
            return optimizer, (f"warning: make_optimizer's keras.optimizers.{name} could not be made atomic "
                               f"({type(exc).__name__}: {exc}); under parameter_server its updates can "
                               "interleave and diverge (README, Known limits)")
        return locked, (f"make_optimizer's keras.optimizers.{name} runs as tfc_harness.optimizers.LockedAdam "
                        "with the same configuration: the same update, applied atomically on the parameter "
                        "servers (README, Known limits)")
    for risky in NOT_ATOMIC:
        cls = getattr(keras.optimizers, risky, None)
        if cls is not None and isinstance(optimizer, cls):
            return optimizer, (f"warning: make_optimizer returns {type(optimizer).__module__}.{name}, whose "
                               "update divides by a second moment in separate ops: under parameter_server two "
                               "workers' updates can interleave and a step can divide by about epsilon and "
                               "diverge (README, Known limits); tfc_harness.optimizers.LockedAdam is Adam "
                               "with atomic updates")
    return optimizer, None
