"""``packing.Packed``: a parameter-server step that reads the weights and sends the gradients in one tensor per
ps trains exactly as the step that reads each variable itself.

A ParameterServerStrategy on an in-process cluster (2 ps, 1 worker, so that the scheduled functions run in
order) trains the same model from the same seed both ways, with the harness's default optimizer under
``parameter_server``: a Dense layer with a weight and an activity regulariser (the model's own losses),
BatchNormalization (statistics the call assigns), Dropout (a seed the call advances), a layer with a metric of
its own (state the model does not list) and an Embedding (a sparse gradient, sent as it is).
"""

from __future__ import annotations

import json

from harness_support import TRAIN_DIR, run_probe

PROBE = """
import json, socket, sys
sys.path.insert(0, {train!r})
import numpy as np
import tensorflow as tf
import keras
from tfc_harness import packing, steps
from tfc_harness.optimizers import LockedAdam


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


spec = {{"ps": [f"localhost:{{free_port()}}" for _ in range(2)], "worker": [f"localhost:{{free_port()}}"]}}
cluster = tf.train.ClusterSpec(spec)
servers = [tf.distribute.Server(cluster, job_name=job, task_index=i, protocol="grpc", start=True)
           for job in spec for i in range(len(spec[job]))]
strategy = tf.distribute.experimental.ParameterServerStrategy(
    tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc"))
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

rng = np.random.default_rng(0)
x, y = rng.random((64, 6)).astype(np.float32), rng.integers(0, 3, 64)
tokens = rng.integers(0, 20, (64, 3)).astype(np.int32)


class Counting(keras.layers.Layer):     # state the model does not list: a metric of its own

    def __init__(self):
        super().__init__()
        self.seen = keras.metrics.Sum()

    def call(self, x, training=False):
        self.seen.update_state(keras.ops.sum(x))
        return x


def build():
    num, tok = keras.Input((6,)), keras.Input((3,), dtype="int32")
    h = keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01),
                           activity_regularizer=keras.regularizers.L1(0.01))(num)
    counting = Counting()
    h = counting(keras.layers.Dropout(0.3)(keras.layers.BatchNormalization()(h)))
    e = keras.layers.Flatten()(keras.layers.Embedding(20, 4)(tok))
    model = keras.Model([num, tok], keras.layers.Dense(3)(keras.layers.Concatenate()([h, e])))
    return model, counting


def loss(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


def packed_for(model, limit):
    saved, packing.PACK_MAX_VARIABLE_BYTES = packing.PACK_MAX_VARIABLE_BYTES, limit
    try:
        return packing.Packed.for_model(model)
    finally:
        packing.PACK_MAX_VARIABLE_BYTES = saved


# "mixed": a limit that leaves the first kernel (regularised) read whole, the embedding and the last kernel read
# as the model reads them, the rest packed
LIMITS = {{"packed": packing.PACK_MAX_VARIABLE_BYTES, "mixed": 300}}


def train(mode):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        (model, counting), optimizer = build(), LockedAdam(0.01)
        optimizer.build(model.trainable_variables)
    start = [v.numpy() for v in model.variables]
    weights = packed_for(model, LIMITS[mode]) if mode in LIMITS else None
    replica_step = steps.make_replica_step(model, optimizer, loss, weights)
    batches = iter(coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensor_slices(((x, tokens), y)).repeat().batch(16)))
    fn = tf.function(lambda iterator, n: steps.run_steps(strategy, replica_step, iterator, n))
    for _ in range(3):
        coordinator.schedule(fn, args=(batches, tf.constant(4, tf.int64)))
    coordinator.join()
    end = [v.numpy() for v in model.variables]
    return {{"paths": [v.path.split("/")[-1] for v in model.variables],
             "moved": [bool(np.any(a != b)) for a, b in zip(start, end)], "end": [e.tolist() for e in end],
             "groups": sorted(d for d, _ in weights.groups) if weights else None,
             "kinds": [len(weights.whole), len(weights.unmapped)] if weights else None,
             "too_large": packed_for(model, 0) is not None, "seen": float(counting.seen.result())}}


print(json.dumps({{mode: train(mode) for mode in ("own", "packed", "mixed")}}))
"""


def test_packed_weights_train_exactly_as_each_variable_read_by_itself(tmp_path):
    got = json.loads(run_probe(tmp_path, PROBE.format(train=str(TRAIN_DIR)), timeout=240).strip().splitlines()[-1])
    own, packed, mixed = got["own"], got["packed"], got["mixed"]
    ps = ["/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"]
    assert packed["groups"] == ps and packed["kinds"] == [0, 0]        # everything packed, from both ps
    assert mixed["groups"] and mixed["kinds"] == [1, 2]                # the first kernel; the embedding, last kernel
    assert own["paths"] == packed["paths"] == mixed["paths"]
    # every variable moved (the seed by the 12 steps' Dropout, the statistics by BatchNormalization's updates)
    assert all(own["moved"]) and all(packed["moved"]) and all(mixed["moved"]), own["paths"]
    assert own["end"] == packed["end"] == mixed["end"]     # the same arithmetic: bit for bit
    # and the same assignments to state the model does not list
    assert own["seen"] != 0 and own["seen"] == packed["seen"] == mixed["seen"], (own["seen"], packed["seen"])
    assert not packed["too_large"]                         # no variable small enough: no packing
