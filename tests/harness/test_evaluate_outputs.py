"""The chief scores the test split on the outputs the published SavedModel returns, so the verifier, which
scores the SavedModel, recomputes the same figures: also for a model ending in a sigmoid or softmax under a
cross-entropy on probabilities, whose live Keras outputs carry the logits behind them."""

from __future__ import annotations

import numpy as np
import pytest
from tfc_harness import evaluate, publish


def _confident_model(units: int, activation: str):
    """A model sure of itself: one of the examples below comes out badly wrong (probability ~1e-17)."""
    import keras

    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(units, activation=activation)])
    kernel = np.zeros((2, units), np.float32)
    kernel[0, 0], kernel[1, -1] = 40.0, 40.0
    model.layers[0].set_weights([kernel, np.zeros(units, np.float32)])
    return model


def _losses_and_metrics(kind: str):
    import keras

    if kind == "binary":
        return keras.losses.BinaryCrossentropy(), [keras.metrics.AUC(name="auc"),
                                                   keras.metrics.BinaryCrossentropy(name="bce")]
    if kind == "categorical":
        return keras.losses.CategoricalCrossentropy(), [keras.metrics.CategoricalCrossentropy(name="cce")]
    return keras.losses.SparseCategoricalCrossentropy(), [keras.metrics.SparseCategoricalCrossentropy(name="scce")]


@pytest.mark.parametrize("kind,units,activation", [("binary", 1, "sigmoid"), ("categorical", 3, "softmax"),
                                                   ("sparse", 3, "softmax")])
def test_the_chiefs_figures_are_those_of_the_published_model(tmp_path, kind, units, activation):
    model = _confident_model(units, activation)
    x = np.array([[1, 0], [-1, 0], [0, 1], [0.5, 0.5]], np.float32)
    y = {"binary": np.array([[0], [1], [0], [1]], np.float32),
         "categorical": np.eye(3, dtype=np.float32)[[2, 0, 1, 2]],
         "sparse": np.array([2, 0, 1, 2], np.int64)}[kind]
    publish.export_saved_model(model, (2,), None, tmp_path / "model")
    loss, metrics = _losses_and_metrics(kind)
    chief = evaluate.evaluate(evaluate.keras_predictor(model), evaluate.array_batches(x, y), loss, metrics)
    loss, metrics = _losses_and_metrics(kind)
    published = evaluate.evaluate(evaluate.saved_model_predictor(str(tmp_path / "model")),
                                  evaluate.array_batches(x, y), loss, metrics)
    assert chief["test_loss"] > 4      # a confidently wrong example: far from the loss of a good model
    assert chief == pytest.approx(published, rel=1e-5, abs=1e-6)


def test_a_test_label_outside_0_to_1_under_binary_cross_entropy_is_named_not_scored():
    """A label of 2 under binary cross-entropy raises nothing in Keras (the loss goes negative): the evaluation,
    the chief's and the verifier's, refuses it; labels of 0 and 1 score as before."""
    import keras
    from tfc_harness.errors import ModelModuleError

    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    logits = np.zeros((3, 1), np.float32)
    assert evaluate.evaluate(lambda x: x, [(logits, np.array([0, 1, 1]))], loss, [])["n"] == 3
    with pytest.raises(ModelModuleError, match=r"the test data hold the label 2, outside 0 to 1: "
                                               r"BinaryCrossentropy takes 0 or 1"):
        evaluate.evaluate(lambda x: x, [(logits, np.array([0, 1, 1])), (logits, np.array([1, 2, 0]))], loss, [])
