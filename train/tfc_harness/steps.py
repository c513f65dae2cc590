"""The model side of one training step, the same under every strategy.

:func:`make_replica_step` returns ``replica_step(x, y) -> loss``: forward pass, the module's loss (its mean
over the batch, plus the model's own regularisation losses), gradients, optimizer update.  A strategy
(:mod:`tfc_harness.strategies`) decides where it runs and how steps are dispatched.
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
