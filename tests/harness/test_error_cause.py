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
