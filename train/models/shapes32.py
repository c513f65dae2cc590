"""Bench model module: a CNN on 32x32x3 images, heavy enough that one plain training step takes
over 50 ms on a quiet 2-core machine.

``make bench`` trains it beside ``digits`` to show how the cluster compares with one plain process when a
step is expensive (the coordination per step is then small beside the computation).  Same contract as
``digits`` (``train/README.md``, "The model module"): ``build_model``, ``make_dataset``, logits for 10
classes, the default loss and metric.

The data are synthetic and deterministic (a fixed seed; no download): each class is a pattern of coloured
blobs at class-specific places, drawn with random shifts, colour jitter and noise, so the task is learnable
but not trivial.  ``make_dataset()`` runs on the controller, and its arrays reach the cluster as every
module's do: stored in object storage under their content hash, read back by each worker.
"""

from __future__ import annotations

import numpy as np

FROM_LOGITS = True
INPUT_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
TRAIN_EXAMPLES, TEST_EXAMPLES = 2048, 512
SEED = 1234


def build_model():
    """Three conv blocks (128, 160, 192 filters) and a dense head returning logits."""
    import keras
    from keras import layers

    return keras.Sequential([
        keras.Input(shape=INPUT_SHAPE),
        layers.Conv2D(128, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(160, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(192, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(128, activation="relu"),
        layers.Dense(NUM_CLASSES),
    ], name="shapes32_cnn")


def _images(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """One 32x32x3 image in [0, 1] per label: the class's blobs, shifted and recoloured at random, plus noise."""
    centers = np.random.default_rng(SEED).uniform(6, 26, size=(NUM_CLASSES, 3, 2))   # 3 blobs per class
    colors = np.random.default_rng(SEED + 1).uniform(0.3, 1.0, size=(NUM_CLASSES, 3, 3))
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    out = np.empty((len(labels), *INPUT_SHAPE), dtype=np.float32)
    for i, label in enumerate(labels):
        img = np.zeros(INPUT_SHAPE, dtype=np.float32)
        shift = rng.uniform(-3, 3, size=2)
        for (cy, cx), color in zip(centers[label] + shift, colors[label], strict=True):
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * rng.uniform(2.0, 4.0) ** 2))
            img += blob[..., None] * (color * rng.uniform(0.7, 1.3, size=3))[None, None, :]
        img += rng.normal(0.0, 0.3, size=INPUT_SHAPE)
        out[i] = np.clip(img, 0.0, 1.0)
    return out


def make_dataset() -> dict:
    """Synthetic, deterministic (seeded): 2048 training and 512 test images, classes balanced."""
    rng = np.random.default_rng(SEED)
    splits = {}
    for name, n in (("train", TRAIN_EXAMPLES), ("test", TEST_EXAMPLES)):
        y = rng.permutation(np.arange(n) % NUM_CLASSES).astype(np.int64)
        splits[name] = (_images(rng, y), y)
    return splits
