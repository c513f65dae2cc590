"""A task's TensorFlow thread pools: sized before any op when the node was given sizes, else the defaults."""

from __future__ import annotations

import subprocess
import sys

from harness_support import TRAIN_DIR
from tfc_harness import threads

PROBE = """
import sys
sys.path.insert(0, {train!r})
from tfc_harness import threads
print(threads.apply({given!r}))
import tensorflow as tf
tf.constant(1.0) + 1.0                                       # the first op: the pools exist from here on
print(tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads())
config = threads.server_config({given!r})
print(None if config is None else (config.intra_op_parallelism_threads, config.inter_op_parallelism_threads))
"""


def _probe(given):
    res = subprocess.run([sys.executable, "-c", PROBE.format(train=str(TRAIN_DIR), given=given)],
                         capture_output=True, text=True, timeout=120, env={"TF_CPP_MIN_LOG_LEVEL": "2",
                                                                            "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.splitlines()[-3:]


def test_given_sizes_are_applied_and_logged():
    line, pools, server = _probe({"intra_op": 1, "inter_op": 2})
    assert line == "threads: intra-op 1, inter-op 2 (set for this node)"
    assert pools == "1 2" and server == "(1, 2)"


def test_none_keeps_tensorflows_defaults():
    line, pools, server = _probe(None)
    assert line.startswith("threads: TensorFlow's defaults (one per core it sees: ")
    assert pools == "0 0" and server == "None"                 # 0: TensorFlow sizes the pool to the cores


def test_describe_needs_no_tensorflow():
    assert threads.describe({"intra_op": 3, "inter_op": 3}) == "threads: intra-op 3, inter-op 3 (set for this node)"
