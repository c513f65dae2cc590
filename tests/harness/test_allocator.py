"""A task's tensors come from TensorFlow's BFC allocator (runner.TF_ENV), which keeps freed memory for the
next step, also where TensorFlow was imported before the task's settings (a fork of the warm interpreter)."""

from __future__ import annotations

import json

from harness_support import TRAIN_DIR, example_settings, run_probe

PROBE = """
import json, sys
sys.path.insert(0, {train!r})
import tensorflow as tf                   # imported first, as in the warm interpreter a task is forked from
from tfc_harness import runner, settings
if {prepare!r}:
    runner.prepare_process(settings.validate(json.loads({settings!r})))
x = tf.ones([512, 512]) * 2.0             # the first op makes the CPU allocator
try:
    print(json.dumps(tf.config.experimental.get_memory_info("CPU:0")))
except ValueError as exc:                 # the default allocator keeps no statistics
    print(json.dumps(str(exc)))
"""


def _probe(tmp_path, prepare: bool):
    source = PROBE.format(train=str(TRAIN_DIR), prepare=prepare,
                          settings=json.dumps(example_settings(state_dir=str(tmp_path / "state"))))
    return json.loads(run_probe(tmp_path, source).splitlines()[-1])


def test_a_prepared_task_allocates_its_tensors_from_tensorflows_bfc_allocator(tmp_path):
    stats = _probe(tmp_path, prepare=True)
    assert isinstance(stats, dict) and stats["peak"] >= 512 * 512 * 4, stats


def test_without_the_task_environment_tensorflow_uses_its_default_allocator(tmp_path):
    """The check above can fail: the default CPU allocator answers with an error, not statistics."""
    assert "not available" in _probe(tmp_path, prepare=False)
