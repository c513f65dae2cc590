"""The ``multi_worker_mirrored`` strategy: synchronous all-reduce training on a chief and its workers.

Every task (chief and workers, no parameter servers) runs the same training loop over its own share of
the data (:func:`tfc_harness.strategies.training_tasks`) through ``tf.distribute.MultiWorkerMirroredStrategy``:
each step runs the replica step on every task and the optimizer all-reduces the gradients (RING over gRPC
on CPU nodes, NCCL where the node has GPUs).  Keras 3's ``model.fit`` does not work under this strategy
(keras-team/keras#20585), hence the harness's own loop, as with parameter servers.

The tasks must issue the same collectives in the same order: each ``train(n)`` call runs the number of steps
the tasks agreed after the last call (:meth:`MultiWorkerMirrored.agree`: about
:data:`tfc_harness.loop.CHUNK_TARGET_S` of work, clipped at the checkpoint boundaries that are due the same way
on every task;
with 20 fixed steps a call, until 2026-11-26, digits on 3 local nodes made 1 % (a checkpoint every 100 steps) to
6 % (every 600) fewer examples/s after the first call, 3 interleaved pairs each), every task
saves at every boundary the tasks agreed is due (TensorFlow requires all of them to), and every task
restores the same checkpoint, the chief's copy in S3.  Only the chief's checkpoints are kept (its directory
is mirrored to S3); the others write to a scratch directory that is emptied after each save.  Only the chief
evaluates, exports and publishes.
"""

from __future__ import annotations

from pathlib import Path

from . import peers, steps
from .errors import HarnessError
from .strategies import Strategy

#: the most steps one call may run (a proposal above it is taken as this, and the sum stays far from overflow)
MAX_CHUNK = 1 << 20


class MultiWorkerMirrored(Strategy):
    name = "multi_worker_mirrored"
    connects_before_tensorflow = True
    has_serving_tasks = False
    ends_without_shutdown = True     # the coordination service's shutdown barrier outlives the first to end

    def runs_loop(self) -> bool:
        return True

    def serve(self) -> int:
        raise HarnessError(f"{self.name}: every task runs the training loop; none only serves")

    def prepare_input(self, source):
        return source.prepare_worker()

    def wait_for_peers(self, timeout_s: float) -> None:
        # The TensorFlow server only starts when the strategy connects, and connecting blocks until every
        # task has: hold the port meanwhile, so that the barrier can name a task that never started.
        with peers.holding_port(self.settings.cluster_spec[self.settings.role][self.settings.index]):
            super().wait_for_peers(timeout_s)

    def connect(self) -> None:
        import tensorflow as tf

        self.tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver(),
            communication_options=communication_options())

    def scope(self):
        return self.tf_strategy.scope()

    def make_dataset(self, dataset_fn):
        return iter(self.tf_strategy.distribute_datasets_from_function(lambda _context: dataset_fn()))

    def make_train_fn(self, replica_step, dataset):
        import tensorflow as tf

        strategy = self.tf_strategy

        @tf.function(autograph=False)   # steps.run_steps
        def train_steps(n):
            return steps.run_steps(strategy, replica_step, dataset, n)

        def train(n: int) -> list[float]:
            """Run ``n`` synchronous steps on every task; the last step's loss, averaged over the tasks."""
            return [float(train_steps(tf.constant(n, tf.int64)))]

        return train

    def agree(self, stop: bool, chunk: int, due: bool) -> tuple[bool, int, bool]:
        """One all-reduce of every task's (stop, chunk, due) per call: any task's notice stops every task at the
        same step, all run the mean of their proposed chunks next (a sum, the same on every task), and a
        checkpoint any task finds due is due on every task (each must save it)."""
        import tensorflow as tf

        if not hasattr(self, "_sum"):
            strategy = self.tf_strategy

            @tf.function(autograph=False)
            def sum_over_replicas(value):
                per_replica = strategy.run(lambda v: tf.identity(v), args=(value,))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            self._sum = sum_over_replicas
        mine = tf.constant([1 if stop else 0, min(max(chunk, 1), MAX_CHUNK), 1 if due else 0], tf.int64)
        flags, chunks, dues = (int(v) for v in self._sum(mine))
        return flags > 0, max(1, chunks // self.tf_strategy.num_replicas_in_sync), dues > 0

    def examples_per_step(self) -> int:
        return self.settings.batch_size * self.settings.num_training_tasks

    def checkpoint_dir(self) -> Path:
        base = Path(self.settings.state_dir) / "checkpoints"
        if self.writes_published_checkpoints():
            return base / self.settings.run_id
        return base / f"scratch-{self.settings.run_id}"

    def checkpoint_options(self):
        import tensorflow as tf

        return tf.train.CheckpointOptions()

    def prefers_local_checkpoints(self) -> bool:
        return False


def communication_options():
    """NCCL all-reduce where this node has GPUs, the ring otherwise."""
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    gpus = tf.config.list_physical_devices("GPU")
    return tf.distribute.experimental.CommunicationOptions(implementation=impl.NCCL if gpus else impl.RING)
