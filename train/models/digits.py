"""Example model module: a small CNN for scikit-learn's 8x8 handwritten digits.

The model-module contract is documented in ``train/README.md`` ("The model module").  This module uses
version 1 of it: ``build_model``, ``make_dataset``, ``FROM_LOGITS``; the loss is the default (sparse
categorical cross-entropy from logits), the metric the default (accuracy).

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
