"""``steps.run_steps``: exactly ``n`` steps per call, and the last step's loss averaged over the replicas.

Run under a MirroredStrategy of two replicas (two logical CPUs in a fresh process), the shape a node with two
GPUs gives each task: a step's per-replica losses are then no plain tensor; each step averages its own, and
one reduction after the loop gives the mean over every replica.
The learning rate is 0, so each step's loss is the batch's own: example i is ``x = 1, y = i`` against a
weight of 0, a squared error of ``i**2``; step s gives replica 0 example 2s and replica 1 example 2s+1.
"""

from __future__ import annotations

from harness_support import TRAIN_DIR, run_probe

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
    lines = run_probe(tmp_path, PROBE.format(train=str(TRAIN_DIR))).splitlines()
    # calls of 1, 3 and 2 steps end at steps 0, 3 and 5: mean of (2s)**2 and (2s+1)**2
    assert lines[-4:-1] == ["1 0.5 1", "3 42.5 4", "2 110.5 6"]
    assert lines[-1] == "replica step traced 2 times for 2 replicas"   # once per replica


KERAS_LOSS_PROBE = """
import sys
sys.path.insert(0, {train!r})
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tfc_harness import steps, usermodel


class Module:                 # the module's loss as the harness resolves it: a Keras loss object
    loss = {loss!r}
loss = usermodel.loss_fn(Module)
x = np.array([[1.0], [2.0], [3.0], [4.0]], np.float32)
y = np.array([1.0, -2.0, 5.0, 0.5], np.float32)


def build():                  # a regularised weight: the model's own loss counts once, not once per replica
    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(
        1, use_bias=False, kernel_initializer="ones", kernel_regularizer=keras.regularizers.L2(0.05))])


def one_step(strategy):
    with strategy.scope():
        model, optimizer = build(), keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(4)))
    replica_step = steps.make_replica_step(model, optimizer, loss)
    run = tf.function(lambda n: steps.run_steps(strategy, replica_step, batches, n))
    return float(run(tf.constant(1, tf.int64))), float(model.trainable_variables[0].numpy()[0, 0])


# one process's step on the 4 examples, and two replicas' steps on 2 each: the same loss, the same update
for name, strategy in (("one", tf.distribute.get_strategy()),
                       ("two", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))):
    print(name, "%.6f %.6f" % one_step(strategy))
"""


def test_two_replicas_report_and_apply_the_same_loss_as_one_process(tmp_path):
    """Keras 3's own mean reductions divide by the strategy's replicas; the harness divides the whole loss by
    them itself: with both, two replicas reported half the loss and took half the step (a quarter of it with
    four). A Keras loss (``mse``, wrapped as the harness wraps a module's) and a regularised weight: one step
    on two replicas reports the loss of one process's step on the same examples and moves the weight as far."""
    for module_loss in ("mse", "mean_absolute_error"):
        out = run_probe(tmp_path, KERAS_LOSS_PROBE.format(train=str(TRAIN_DIR), loss=module_loss))
        got = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(("one ", "two ")))
        (loss_one, weight_one), (loss_two, weight_two) = ([float(v) for v in got[k].split()] for k in ("one", "two"))
        assert weight_one != 1.0, got                       # the step moved the weight
        assert abs(loss_two - loss_one) < 1e-5 and abs(weight_two - weight_one) < 1e-6, (module_loss, got)


SCALED_PROBE = """
import sys
sys.path.insert(0, {train!r})
import numpy as np
import tensorflow as tf
import keras
from tfc_harness import steps

x = np.array([[1.0], [2.0], [3.0], [4.0]], np.float32)
y = np.array([1.0, -2.0, 5.0, 0.5], np.float32)


def one_step(optimizer):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    optimizer.build(model.trainable_variables)
    batches = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    replica_step = steps.make_replica_step(model, optimizer, lambda yt, yp: tf.square(yt - tf.squeeze(yp, -1)))
    run = tf.function(lambda n: steps.run_steps(tf.distribute.get_strategy(), replica_step, batches, n))
    return float(run(tf.constant(1, tf.int64))), float(model.trainable_variables[0].numpy()[0, 0])


for name, optimizer in (("plain", keras.optimizers.SGD(0.01)),
                        ("loss_scale", keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))),
                        ("factor", keras.optimizers.SGD(0.01, loss_scale_factor=128.0))):
    print(name, "%.6f %.6f" % one_step(optimizer))
"""


def test_the_loss_is_scaled_as_the_optimizer_asks(tmp_path):
    """A LossScaleOptimizer (a mixed-precision module's) divides its loss scale (2**15 at first) out of the
    gradients, and so does any optimizer given a ``loss_scale_factor``: the step scales the loss for it, so the
    update is the unscaled optimizer's (it was 2**15 times smaller), and the loss reported is the loss."""
    rows = [line.split() for line in run_probe(tmp_path, SCALED_PROBE.format(train=str(TRAIN_DIR))).splitlines()]
    got = {row[0]: [float(v) for v in row[1:]] for row in rows if row and row[0] in ("plain", "loss_scale", "factor")}
    loss, weight = got["plain"]
    assert weight != 1.0                                  # the step moved the weight
    for name in ("loss_scale", "factor"):
        assert abs(got[name][0] - loss) < 1e-6 and abs(got[name][1] - weight) < 1e-6, (name, got)

