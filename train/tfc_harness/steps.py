"""The model side of one training step, the same under every strategy.

:func:`make_replica_step` returns ``replica_step(x, y) -> loss``: forward pass, sparse categorical
cross-entropy (plus the model's own regularisation losses), gradients, optimizer update.  A strategy
(:mod:`tfc_harness.strategies`) decides where it runs and how steps are dispatched.
"""

from __future__ import annotations


def make_replica_step(model, optimizer, from_logits: bool):
    """One step on one replica's batch; returns the batch's mean loss."""
    import keras
    import tensorflow as tf

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, out, from_logits=from_logits))
            if model.losses:
                loss += tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return replica_step
