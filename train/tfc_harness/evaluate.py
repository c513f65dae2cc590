"""Metrics on the test split: the chief's, and a published SavedModel's in a fresh process.

Both sides compute the same thing the same way (:class:`Evaluation`): the mean of the module's loss and
each of its metrics (``metrics()``, see :mod:`tfc_harness.usermodel`) over the model's raw outputs, batch
by batch.  The chief feeds it its trained Keras model's outputs; the verifier the ``outputs`` of the
SavedModel's ``serving_default`` signature, which returns the model's outputs unchanged (and, for a
classifier trained on logits, ``probabilities`` too).

``python -m tfc_harness.evaluate MODEL_DIR MODULE TEST_SPEC_JSON`` loads the SavedModel and the user's module,
reads the test split the spec names (local files only: ``{"source": "arrays", "npz": path}`` or
``{"source": "files", "format": ..., "paths": [...], "columns": ..., "label": ...}``) and prints one JSON
line of metrics. With ``--wait`` instead, it imports TensorFlow, then reads those three arguments as one
JSON list from stdin (a process started while the run trains: :class:`tfc_harness.verify.WarmEvaluator`).
:mod:`tfc_harness.verify` runs it in a fresh interpreter so that nothing from the caller's process can
stand in for what was actually published.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable

import numpy as np

from . import ending, tfimport

SIGNATURE = "serving_default"
OUTPUTS = "outputs"
PROBABILITIES = "probabilities"
EVAL_BATCH = 512


class Evaluation:
    """The loss (mean over examples) and each metric over batches of ``(y, outputs)``."""

    def __init__(self, loss, metrics: list):
        from .usermodel import probability_labels

        self.loss, self.metrics = loss, metrics
        self.loss_sum, self.n = 0.0, 0
        self.probability_labels = probability_labels(loss)

    def update(self, y, outputs) -> None:
        import tensorflow as tf

        if self.probability_labels:      # another label raises nothing there: the loss goes negative
            from .usermodel import outside_0_to_1, probability_label_advice, shown_label

            value = outside_0_to_1(y)
            if value is not None:
                from .errors import ModelModuleError

                raise ModelModuleError(f"the test data hold the label {shown_label(value)}, outside 0 to 1: "
                                       f"{probability_label_advice(self.loss)}")
        count = len(y)
        # the batch's mean loss, whether the loss returns one value per example or reduces the batch itself
        self.loss_sum += float(tf.reduce_mean(tf.cast(self.loss(y, outputs), tf.float64))) * count
        self.n += count
        for metric in self.metrics:
            metric.update_state(y, outputs)

    def result(self) -> dict:
        """``{"test_loss": ..., "test_<metric>": ..., "n": ...}``."""
        if not self.n:
            raise ValueError("the test split has no examples")
        out = {"test_loss": self.loss_sum / self.n}
        out.update({f"test_{m.name}": float(m.result()) for m in self.metrics})
        out["n"] = self.n
        return out


def headline(metrics: list) -> str:
    """The metric ``make train`` and the run record lead with: the first metric, else the loss."""
    return f"test_{metrics[0].name}" if metrics else "test_loss"


def evaluate(predict: Callable, batches: Iterable, loss, metrics: list) -> dict:
    """Run ``predict(x) -> outputs`` over ``(x, y)`` batches and return :meth:`Evaluation.result`."""
    evaluation = Evaluation(loss, metrics)
    for x, y in batches:
        evaluation.update(y, predict(x))
    return evaluation.result()


def keras_predictor(model) -> Callable:
    """Outputs of a Keras model in this process (inference mode), as plain tensors: what the SavedModel's
    signature returns. Keras marks a sigmoid's or softmax's output with the logits behind it (``_keras_logits``),
    and its cross-entropies on probabilities then take those logits unclipped: once a test example is confidently
    wrong the chief's test_loss differed from the published model's (the verifier's, any user's) by far more than
    the verification's tolerance (2.86 against 1.51, a sigmoid model under binary cross-entropy)."""
    import tensorflow as tf

    def predict(x):
        return tf.nest.map_structure(tf.identity, model(x, training=False))
    return predict


def saved_model_predictor(model_dir: str) -> Callable:
    """The ``outputs`` of the SavedModel's ``serving_default`` signature (one input)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(model_dir)
    if SIGNATURE not in loaded.signatures:
        raise ValueError(f"{model_dir} has no {SIGNATURE!r} signature (has {list(loaded.signatures)})")
    fn = loaded.signatures[SIGNATURE]
    _, kwargs = fn.structured_input_signature
    if len(kwargs) != 1:
        raise ValueError(f"{SIGNATURE} must take exactly one input (takes {sorted(kwargs)})")
    (name, spec), = kwargs.items()

    def predict(x):
        result = fn(**{name: tf.cast(x, spec.dtype)})
        if OUTPUTS not in result:
            raise ValueError(f"{SIGNATURE} returns {sorted(result)}, not {OUTPUTS!r}")
        return result[OUTPUTS]

    predict.keepalive = loaded   # the signature needs its object alive
    return predict


def array_batches(x: np.ndarray, y: np.ndarray, batch_size: int = EVAL_BATCH):
    for start in range(0, len(x), batch_size):
        yield x[start:start + batch_size], y[start:start + batch_size]


def spec_batches(spec: dict, module, batch_size: int = EVAL_BATCH):
    """Batches of the test split a spec names (local files; see the module docstring)."""
    if spec["source"] == "arrays":
        from . import data

        with np.load(spec["npz"], allow_pickle=False) as npz:
            x, y = data.check_arrays(npz["x"], npz["y"], spec["npz"])
        return array_batches(x, y, batch_size)
    import tensorflow as tf

    from . import formats

    read = formats.reader(spec["format"], decode=getattr(module, "decode", None), columns=spec.get("columns"),
                          label=spec.get("label"))
    dataset = read(tf.data.Dataset.from_tensor_slices(list(spec["paths"]))).batch(batch_size)
    return ((x.numpy() if hasattr(x, "numpy") else x, y.numpy()) for x, y in dataset)


def evaluate_saved_model(model_dir: str, module_path: str, spec: dict) -> dict:
    from . import usermodel

    module = usermodel.load(module_path)
    loss = usermodel.loss_fn(module)
    metrics = usermodel.metric_objects(module, loss)
    result = evaluate(saved_model_predictor(model_dir), spec_batches(spec, module), loss, metrics)
    result["headline"] = headline(metrics)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tfimport.import_tensorflow()
    if args == ["--wait"]:   # started before the model exists: TensorFlow first, then the three arguments
        line = sys.stdin.readline()
        if not line.strip():     # nothing to evaluate (the run did not publish): the caller closed the pipe
            return 0
        args = json.loads(line)
    if len(args) != 3:
        print("usage: python -m tfc_harness.evaluate (MODEL_DIR MODULE TEST_SPEC_JSON | --wait)", file=sys.stderr)
        return 2
    print(json.dumps(evaluate_saved_model(args[0], args[1], json.loads(args[2]))), flush=True)
    return 0


if __name__ == "__main__":
    ending.exit_now(main())   # the caller waits for the exit: not for the teardown of TensorFlow
