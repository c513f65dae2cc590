"""Example model module: a small CNN for scikit-learn's 8x8 handwritten digits.

The model-module interface
--------------------------
A model module is a plain Python file in ``train/models/`` (select it with ``model_module: <name>``) or
anywhere on the nodes (``model_module: /abs/path/to/file.py``).  It knows nothing about the cluster:
the harness distributes, checkpoints, evaluates and publishes.

``build_model() -> keras.Model``  (required)
    Returns a new, uncompiled Keras 3 model mapping a float32 batch ``[N, *x.shape[1:]]`` to one row of
    class scores per example.  It is called inside the distribution strategy's scope, so it must create
    its variables there (no global state, no ``compile``).  Give it an ``Input`` or it is built from the
    data's shape.

``make_dataset() -> {"train": (x, y), "test": (x, y)}``  (required)
    ``x`` float32 ``[N, ...]`` (already scaled), ``y`` integer class ids ``[N]``.  Called once, on the
    controller, which uploads the result as ``train.npz``/``test.npz``; the nodes never call it, so it
    may use packages that only the controller has (here scikit-learn, imported inside the function).

``FROM_LOGITS: bool``  (optional, default True)
    True when ``build_model`` outputs logits (the loss applies softmax; the served model returns
    ``tf.nn.softmax`` of them); False when it already outputs probabilities.

``make_optimizer(learning_rate) -> keras.optimizers.Optimizer``  (optional, default ``Adam``)

The loss is sparse categorical cross-entropy; the published SavedModel's ``serving_default`` signature
takes ``x`` (float32 ``[None, *x.shape[1:]]``) and returns ``{"probabilities": [None, classes]}``.

This module: ``build_model`` outputs logits for 10 classes from ``[N, 8, 8, 1]`` inputs in ``[0, 1]``.
"""

from __future__ import annotations

import numpy as np

FROM_LOGITS = True
INPUT_SHAPE = (8, 8, 1)
NUM_CLASSES = 10
SPLIT_SEED = 42


def build_model():
    """A two-conv CNN (~13k parameters) returning logits."""
    import keras
    from keras import layers

    return keras.Sequential([
        keras.Input(shape=INPUT_SHAPE),
        layers.Conv2D(16, 3, padding="same", activation="relu"),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(NUM_CLASSES),
    ], name="digits_cnn")


def make_dataset() -> dict:
    """scikit-learn's bundled digits, scaled to [0, 1], stratified 80/20 split with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32).reshape(-1, *INPUT_SHAPE)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=SPLIT_SEED, stratify=y)
    return {"train": (x_train, y_train), "test": (x_test, y_test)}
