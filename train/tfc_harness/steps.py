"""The model side of one training step, the same under every strategy.

:func:`make_replica_step` returns ``replica_step(x, y) -> loss``: forward pass, the module's loss (its mean
over the batch, plus the model's own regularisation losses), gradients, optimizer update.  A strategy
(:mod:`tfc_harness.strategies`) decides where it runs and how steps are dispatched; :func:`run_steps` is the
loop of several steps a strategy's function runs.
"""

from __future__ import annotations


def make_replica_step(model, optimizer, loss):
    """One step on one replica's batch; ``loss(y_true, y_pred)`` is the module's loss (see
    :func:`tfc_harness.usermodel.loss_fn`).  Returns the batch's mean loss."""
    import tensorflow as tf

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            value = tf.reduce_mean(loss(y, out))
            if model.losses:
                value += tf.add_n(model.losses)
            # The optimizer sums the replicas' gradients (one replica per task under a synchronous strategy, one
            # per step under parameter servers): scaled, the update follows the mean over all replicas' batches.
            scaled = value / tf.distribute.get_replica_context().num_replicas_in_sync
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return value

    return replica_step


def run_steps(strategy, replica_step, iterator, n):
    """Inside a ``tf.function``: ``n`` (>= 1) steps of ``replica_step`` under ``strategy``, each on the next batch
    of ``iterator``; returns the last step's loss, the mean over the replicas (float32).

    Only the last step's loss is reduced: under a synchronous strategy each reduction is one more collective
    between the tasks, and one per step made a step of the digits CNN ~15 % slower (3 tasks on loopback)."""
    import tensorflow as tf

    for _ in tf.range(n - 1):
        x, y = next(iterator)
        strategy.run(replica_step, args=(x, y))
    x, y = next(iterator)
    losses = strategy.run(replica_step, args=(x, y))
    return tf.cast(strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None), tf.float32)
