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
"""

from __future__ import annotations

import keras
import tensorflow as tf


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
