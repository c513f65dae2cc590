"""``steps.run_steps``: exactly ``n`` steps per call, and the last step's loss averaged over the replicas.

Run under a MirroredStrategy of two replicas (two logical CPUs in a fresh process), the shape a node with two
GPUs gives each task: a step's per-replica losses are then no plain tensor; each step averages its own, and
one reduction after the loop gives the mean over every replica.
The learning rate is 0, so each step's loss is the batch's own: example i is ``x = 1, y = i`` against a
weight of 0, a squared error of ``i**2``; step s gives replica 0 example 2s and replica 1 example 2s+1.
"""

from __future__ import annotations

import subprocess
import sys

from harness_support import TRAIN_DIR

PROBE = """
import sys
sys.path.insert(0, {train!r})
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tfc_harness import steps

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    optimizer = keras.optimizers.SGD(0.0)
rows = tf.data.Dataset.range(100).map(lambda i: (tf.ones([1]), tf.cast(i, tf.float32)))
iterator = iter(strategy.experimental_distribute_dataset(rows.batch(2)))
squared_error = lambda y, out: tf.square(y - tf.squeeze(out, -1))
traced = []
def counting_loss(y, out):
    traced.append(1)          # runs once per trace of the replica step
    return squared_error(y, out)
replica_step = steps.make_replica_step(model, optimizer, counting_loss)
@tf.function
def train(n):
    return steps.run_steps(strategy, replica_step, iterator, n)

for n in (1, 3, 2):
    print(n, float(train(tf.constant(n, tf.int64))), int(optimizer.iterations.numpy()))
print("replica step traced", len(traced), "times for", strategy.num_replicas_in_sync, "replicas")
"""


def test_n_steps_per_call_and_the_last_steps_mean_loss_over_two_replicas(tmp_path):
    probe = tmp_path / "probe.py"          # a file: AutoGraph converts the loop from its source
    probe.write_text(PROBE.format(train=str(TRAIN_DIR)))
    res = subprocess.run([sys.executable, str(probe)], capture_output=True,
                         text=True, timeout=120, env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin",
                                                      "TMPDIR": str(tmp_path)})   # AutoGraph's files, and
    # their bytecode in __pycache__ (which TensorFlow's exit leaves), stay out of /tmp
    assert res.returncode == 0, res.stderr[-3000:]
    # calls of 1, 3 and 2 steps end at steps 0, 3 and 5: mean of (2s)**2 and (2s+1)**2
    assert res.stdout.splitlines()[-4:-1] == ["1 0.5 1", "3 42.5 4", "2 110.5 6"]
    assert res.stdout.splitlines()[-1] == "replica step traced 2 times for 2 replicas"   # once per replica
