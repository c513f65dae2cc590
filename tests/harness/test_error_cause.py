"""The one line of an error that says what went wrong: what a failed run's error line and the data check show."""

from __future__ import annotations

import pytest
from tfc_harness.errors import cause

GRAPH = ("Graph execution error:\n\nDetected at node Reshape defined at (most recent call last):\n"
         "  File \"/opt/tfcluster/run/tfc_harness/loop.py\", line 88, in step\n\n"
         "Input to reshape is a tensor with 225 values, but the requested shape has 256\n"
         "\t [[{{node Reshape}}]]\n\t [[IteratorGetNext]] [Op:__inference_step_22]")
USER_CODE = ("in user code:\n\n    File \"/x/job.py\", line 3, in decode  *\n        raise ValueError('bad')\n\n"
             "    ValueError: label 7 is not a class")


@pytest.mark.parametrize("message, line", [
    (GRAPH, "Input to reshape is a tensor with 225 values, but the requested shape has 256"),
    (USER_CODE, "ValueError: label 7 is not a class"),
    ("{{function_node __wrapped__Sparse}} Received a label value of 1 [Op:SparseSoftmax] name: ",
     "Received a label value of 1"),
    ("checkpoint step 7400 is beyond steps=3000\nmore", "checkpoint step 7400 is beyond steps=3000"),
    ("", ""),
    # a multi-line error in traced code: its first line, not its last
    ("in user code:\n\n    File \"/x/job.py\", line 3, in decode  *\n        raise ValueError()\n\n"
     "    ValueError: label 7 is not a class\n  expected ids in 0..6", "ValueError: label 7 is not a class"),
    # several tasks' errors: the first's cause, without its code
    ("Graph execution error:\n\nDetected at node x defined at (most recent call last):\n  File \"a.py\"\n"
     "2 root error(s) found.\n  (0) INVALID_ARGUMENT: Input to reshape is a tensor with 225 values\n"
     "\t [[{{node Reshape}}]]\n  (1) INVALID_ARGUMENT: the same\n0 successful operations.",
     "Input to reshape is a tensor with 225 values"),
])
def test_the_cause_of_an_error_is_one_line_without_tensorflows_frames(message, line):
    assert cause(message) == line


def test_a_real_input_pipeline_error_gives_its_cause():
    tf = pytest.importorskip("tensorflow")
    data = tf.data.Dataset.from_tensor_slices([b"x" * 256, b"x" * 225]).map(
        lambda s: tf.reshape(tf.io.decode_raw(s, tf.uint8), [16, 16])).batch(2)

    @tf.function
    def step(it):
        return tf.reduce_sum(tf.cast(next(it), tf.float32))

    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        step(iter(data))
    assert str(err.value).startswith("Graph execution error:")
    assert cause(str(err.value)) == "Input to reshape is a tensor with 225 values, but the requested shape has 256"


def test_a_keras_layer_error_gives_its_cause_eager_or_traced():
    """Keras wraps an error inside a layer's call between 'Exception encountered when calling' and the call's
    arguments: the cause is in between, whether the model runs eagerly or in a traced step."""
    pytest.importorskip("keras")
    import keras
    import numpy as np
    import tensorflow as tf
    from tfc_harness.errors import described

    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3, name="dense")])
    wrong = np.zeros((2, 5), np.float32)
    with pytest.raises(Exception) as eager:
        model(wrong)

    @tf.function
    def step(x):
        return model(x)

    with pytest.raises(Exception) as traced:
        step(wrong)
    for err in (eager.value, traced.value):
        line = cause(str(err))
        assert "of layer 'dense' is incompatible" in line and "received input with shape (2, 5)" in line, line
        assert described(err).count("Error:") == 1, described(err)


def test_a_label_outside_the_classes_is_described_by_the_label_and_the_classes_not_the_batch():
    """TensorFlow's error lists the batch's labels (64 numbers and more) after the one outside: the chief's
    one-line error gives the label, the classes and what to do."""
    import keras
    import numpy as np
    import tensorflow as tf
    from tfc_harness.errors import described

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        tf.function(lambda y, out: loss(y, out))(tf.constant(np.arange(64) % 4), tf.zeros([64, 3]))
    assert described(err.value) == (
        "InvalidArgumentError: the data hold the label 3, outside the model's 3 classes (class ids 0 to "
        "2), past the first examples the controller checked: number the classes from 0, or give the model's last "
        "layer one unit per class")
