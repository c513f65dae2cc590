"""Labels outside 0 to 1 under a loss that takes probabilities (Keras's binary and categorical cross-entropies)
raise nothing in Keras: the loss goes negative and the model trains on nonsense. The files' training batches
are checked in the reader (inputs.labels_between_0_and_1), in words the chief shows on one line and knows as the
data's (a final failure, not restarted)."""

from __future__ import annotations

import textwrap
import types

import numpy as np
import pytest
from tfc_harness import errors, inputs


def _module(loss: str) -> types.ModuleType:
    module = types.ModuleType("mine")
    exec(textwrap.dedent(f"""
        import keras
        loss = {loss}
        def build_model():
            return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    """), module.__dict__)
    return module


def _batches(checked, labels):
    import tensorflow as tf

    batches = tf.data.Dataset.from_tensor_slices((np.zeros((len(labels), 4), np.float32), labels)).batch(2)
    return [y.numpy().tolist() for _, y in batches.map(checked)]


def test_a_label_outside_0_to_1_stops_the_reader_naming_it():
    import tensorflow as tf

    checked = inputs.labels_between_0_and_1(_module("keras.losses.BinaryCrossentropy(from_logits=True)"))
    assert _batches(checked, np.array([0.0, 1.0, 0.25, 1.0], np.float32)) == [[0.0, 1.0], [0.25, 1.0]]
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        _batches(checked, np.array([0, 1, 1, 2, 0, 1]))
    assert errors.bad_labels(err.value)
    assert errors.described(err.value) == (
        "InvalidArgumentError: the training data hold a label outside 0 to 1: BinaryCrossentropy takes 0 or 1 for a "
        "class, or a probability between: number the two classes 0 and 1; the first: 2")


def test_categorical_labels_get_their_own_advice_and_other_losses_no_check():
    import tensorflow as tf

    checked = inputs.labels_between_0_and_1(_module("'categorical_crossentropy'"))
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        _batches(checked, np.eye(3, dtype=np.float32)[[0, 2]] * 2)
    assert "categorical_crossentropy takes one-hot labels, or a probability per class" in errors.described(err.value)
    assert inputs.labels_between_0_and_1(_module("'sparse_categorical_crossentropy'")) is None
    assert inputs.labels_between_0_and_1(_module("'mse'")) is None
    assert inputs.labels_between_0_and_1(None) is None
