"""Evaluating class probabilities, and a published SavedModel in this process.

The chief evaluates its trained model with :func:`predict_keras` and :func:`classification_metrics`.
``python -m tfc_harness.evaluate MODEL_DIR TEST_NPZ`` loads the SavedModel, runs its ``serving_default``
signature over the test split and prints one JSON line ``{"test_accuracy": ..., "test_loss": ..., "n": ...}``.
:mod:`tfc_harness.verify` runs it in a fresh interpreter so that nothing from the caller's process (a
model class, cached variables) can stand in for what was actually published.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

SIGNATURE = "serving_default"
EVAL_BATCH = 512


def classification_metrics(probabilities: np.ndarray, y: np.ndarray) -> dict:
    """Accuracy and mean cross-entropy of ``[N, classes]`` probabilities against class ids ``y``."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(y).astype(np.int64)
    if probabilities.ndim != 2 or len(probabilities) != len(y):
        raise ValueError(f"need probabilities [N, classes] for {len(y)} labels (got {probabilities.shape})")
    picked = probabilities[np.arange(len(y)), y]
    return {"test_accuracy": float(np.mean(np.argmax(probabilities, axis=1) == y)),
            "test_loss": float(np.mean(-np.log(np.clip(picked, 1e-12, 1.0)))),
            "n": int(len(y))}


def predict_keras(model, x: np.ndarray, from_logits: bool) -> np.ndarray:
    """Class probabilities from a Keras model in this process (softmax of its outputs if they are logits)."""
    import tensorflow as tf

    out = []
    for start in range(0, len(x), EVAL_BATCH):
        scores = model(tf.constant(x[start:start + EVAL_BATCH]), training=False)
        out.append((tf.nn.softmax(scores) if from_logits else scores).numpy())
    return np.concatenate(out)


def predict_saved_model(model_dir: str, x: np.ndarray) -> np.ndarray:
    """Probabilities from the SavedModel's ``serving_default`` signature (single input, first output)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    loaded = tf.saved_model.load(model_dir)
    if SIGNATURE not in loaded.signatures:
        raise ValueError(f"{model_dir} has no {SIGNATURE!r} signature (has {list(loaded.signatures)})")
    fn = loaded.signatures[SIGNATURE]
    _, kwargs = fn.structured_input_signature
    if len(kwargs) != 1:
        raise ValueError(f"{SIGNATURE} must take exactly one input (takes {sorted(kwargs)})")
    (name, spec), = kwargs.items()
    outputs = []
    for start in range(0, len(x), EVAL_BATCH):
        batch = tf.constant(x[start:start + EVAL_BATCH], dtype=spec.dtype)
        result = fn(**{name: batch})
        outputs.append(result["probabilities"] if "probabilities" in result
                       else next(iter(result.values())))
    return np.concatenate([o.numpy() for o in outputs])


def evaluate_saved_model(model_dir: str, test_npz: str) -> dict:
    with np.load(test_npz, allow_pickle=False) as npz:
        x, y = npz["x"].astype(np.float32), npz["y"]
    return classification_metrics(predict_saved_model(model_dir, x), y)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tfc_harness.evaluate MODEL_DIR TEST_NPZ", file=sys.stderr)
        return 2
    print(json.dumps(evaluate_saved_model(*args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
