"""The ``parameter_server`` strategy: ParameterServerStrategy with a ClusterCoordinator on the chief.

ps tasks hold the variables and only serve; each worker first prepares its own part of the training data
(:meth:`tfc_harness.inputs.ArrayInput.prepare_worker`: a local shard, or a stream of its files) and then
serves; the chief runs the loop, and its ``ClusterCoordinator`` spreads the scheduled steps over the
workers, each reading its own data (:mod:`tfc_harness.inputs`).  ``model.fit`` does not work with this
strategy under Keras 3, hence the harness's own loop.  Checkpoints are written by the chief only, with
their I/O pinned to the chief (without that each ps would write its part to its own disk).
"""

from __future__ import annotations

from pathlib import Path

from . import inputs, s3io, server
from .strategies import Strategy

LOSS_SAMPLES = 8   # remote losses fetched per train(n) call


class ParameterServer(Strategy):
    name = "parameter_server"

    def runs_loop(self) -> bool:
        return self.settings.role == "chief"

    def serve(self) -> int:
        feed = None
        if self.settings.role == "worker":
            feed = inputs.for_settings(self.settings, s3io.client_from_settings(self.settings)).prepare_worker()
        return server.serve(self.settings, feed)

    def connect(self) -> None:
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        self.tf_strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.tf_strategy)

    def scope(self):
        return self.tf_strategy.scope()

    def make_dataset(self, dataset_fn):
        return iter(self.coordinator.create_per_worker_dataset(dataset_fn))

    def make_train_fn(self, replica_step, dataset):
        import tensorflow as tf

        strategy, coordinator = self.tf_strategy, self.coordinator

        @tf.function
        def train_step(iterator):
            x, y = next(iterator)
            losses = strategy.run(replica_step, args=(x, y))
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

        def train(n: int) -> list[float]:
            """Schedule ``n`` steps on whichever workers are free, wait for all, fetch the last losses."""
            results = [coordinator.schedule(train_step, args=(dataset,)) for _ in range(n)]
            coordinator.join()
            return [float(r.fetch()) for r in results[-LOSS_SAMPLES:]]

        return train

    def checkpoint_dir(self) -> Path:
        # Per run, and kept across restarts of this chief: a checkpoint S3 could not take is not lost.
        return Path(self.settings.state_dir) / "checkpoints" / self.settings.run_id

    def checkpoint_options(self):
        import tensorflow as tf

        return tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
