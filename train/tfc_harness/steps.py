"""The model side of one training step, the same under every strategy.

:func:`make_replica_step` returns ``replica_step(x, y) -> loss``: forward pass, the module's loss (its mean
over the batch, plus the model's own regularisation losses), gradients, optimizer update.  A strategy
(:mod:`tfc_harness.strategies`) decides where it runs and how steps are dispatched; :func:`run_steps` is the
loop of several steps a strategy's function runs.
"""

from __future__ import annotations

import contextlib


def make_replica_step(model, optimizer, loss, weights=None):
    """One step on one replica's batch; ``loss(y_true, y_pred)`` is the module's loss (see
    :func:`tfc_harness.usermodel.loss_fn`).  Returns the batch's mean loss.  ``weights`` is how the step reads
    the trainable weights and sends their gradients (:meth:`tfc_harness.strategies.Strategy.weights_io`):
    None, the model reads its own variables; a :class:`tfc_harness.packing.Packed`, in one tensor per ps."""
    import tensorflow as tf

    leave_replica_scaling_to_the_step()
    weights = weights or OwnVariables(model)

    def replica_step(x, y):
        with tf.GradientTape() as tape, weights.reading(tape) as values:
            out = model(x, training=True)
            value = tf.reduce_mean(loss(y, out))
            if model.losses:
                value += tf.add_n(model.losses)
            # The optimizer sums the replicas' gradients (one replica per task under a synchronous strategy, one
            # per step under parameter servers): scaled, the update follows the mean over all replicas' batches.
            # And scaled as the optimizer asks (a LossScaleOptimizer's loss scale, a loss_scale_factor), which
            # its update divides out of the gradients: without it a mixed-precision module's LossScaleOptimizer
            # took steps 2**15 times too small.
            scaled = optimizer.scale_loss(value / tf.distribute.get_replica_context().num_replicas_in_sync)
        grads = weights.send(tape.gradient(scaled, values))
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return value

    return replica_step


class OwnVariables:
    """The plain way: the model reads its variables, and the gradients go to the optimizer as they are."""

    def __init__(self, model):
        self.model = model

    @contextlib.contextmanager
    def reading(self, _tape):
        yield self.model.trainable_variables

    def send(self, grads: list) -> list:
        return grads


def leave_replica_scaling_to_the_step() -> None:
    """Keras 3's mean loss reductions divide by the replicas of the active ``tf.distribute`` strategy (for its
    own ``fit``, which sums the replicas' gradients and multiplies the loss back for its progress).  The replica
    step divides the whole loss itself, the model's own losses included, which Keras leaves undivided: with both,
    a synchronous strategy's n replicas reported 1/n of the loss and each replica's loss was scaled by 1/n^2, so
    the summed update followed 1/n of the mean gradient (an SGD learning rate n times too small).  So Keras's
    division is turned off in the process that trains; it does nothing without a strategy of several replicas,
    and the harness calls no ``fit``."""
    from keras.src.losses import loss as keras_loss

    keras_loss.scale_loss_for_distribution = _unscaled


def _unscaled(value):
    return value


def all_finite(variables) -> bool:
    """Whether every floating-point value of ``variables`` (the model's weights, the optimizer's state) is
    finite.  Eager, one variable at a time: under ``parameter_server`` each is read from its ps, as the
    checkpoint that follows reads it again."""
    import tensorflow as tf

    return all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in variables if tf.as_dtype(v.dtype).is_floating)


def run_steps(strategy, replica_step, iterator, n):
    """Inside a ``tf.function``: ``n`` steps of ``replica_step`` under ``strategy``, each on the next batch of
    ``iterator``; returns the last step's loss, the mean over the replicas (float32).

    A step averages its loss over this task's own replicas only; the one reduction across tasks comes after
    the loop: under a synchronous strategy each is a collective between the tasks, and one per step made a
    step of the digits CNN slower (3 tasks on loopback, two A/B runs, noisy: 7.92/8.20 ms against
    6.94/7.09 ms).  The replica step is traced once.  The loop is a ``tf.while_loop`` of its own and the
    callers' functions are traced without AutoGraph (``autograph=False``): converting them and the replica step
    took half of the chief's trace of the parameter-server function, in every run's first call (1.0-1.4 s with
    AutoGraph, 0.5-0.6 s without, profiled at this machine's slow phase).  Nothing here branches on a tensor,
    and Keras's code, the user's layers and loss among it, was never converted."""
    import tensorflow as tf

    def step(i, _loss):
        x, y = next(iterator)
        local = strategy.experimental_local_results(strategy.run(replica_step, args=(x, y)))
        return i + 1, tf.cast(tf.add_n(local) / len(local), tf.float32)

    _, loss = tf.while_loop(lambda i, _loss: i < n, step, (tf.zeros_like(n), tf.constant(0.0)))
    # reduce() of a plain tensor returns it as it is under a mirrored strategy: a per-replica value (the
    # identity run on every replica) is what makes it a collective across the tasks
    return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(tf.identity, args=(loss,)), axis=None)
