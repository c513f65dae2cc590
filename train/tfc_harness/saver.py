"""The chief's checkpoints: restore the newest of the local and the S3 copies, save and mirror to S3.

Local checkpoints live in the strategy's :meth:`~tfc_harness.strategies.Strategy.checkpoint_dir` (the
newest :data:`~tfc_harness.checkpoints.KEEP`); S3's in ``<checkpoint_prefix>/`` (:mod:`tfc_harness.checkpoints`).
A local checkpoint newer than any in S3 (its upload failed) wins over S3's.  A failed upload leaves
``unpublished.json`` (:mod:`tfc_harness.unpublished`) so that the node is not destroyed with the only copy.

Where the model's variables sit on other tasks (the parameter servers:
:attr:`~tfc_harness.strategies.Strategy.variables_on_other_tasks`), a checkpoint spans several tasks and
TensorFlow traces a new function for every eager save of it (its ``MultiDeviceSaver``: ~0.2 s a checkpoint of
the digits model here, and a retracing warning in the log from the fifth on); ``Checkpoint.write`` in one
function of its own (:func:`tfc_harness.traced.checkpoint_write`) writes the same files (~0.02 s), traced again
only when the variables it saves are others; so does the check that they are finite, a round trip to the ps
a variable when eager (:func:`tfc_harness.traced.all_finite`).
"""

from __future__ import annotations

import shutil

from . import checkpoints, traced, unpublished
from .errors import FinalError
from .steps import all_finite


def log(msg: str) -> None:
    print(msg, flush=True)


class Saver:
    """``restore()`` once, then ``save(step)`` at each checkpoint boundary (``finite()`` before it: whether the
    weights and the optimizer's state it would save are all finite)."""

    def __init__(self, strategy, s3_client, model, optimizer):
        import tensorflow as tf

        self.strategy, self.settings, self.client = strategy, strategy.settings, s3_client
        self.directory = strategy.checkpoint_dir()
        self.options = strategy.checkpoint_options()
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # The names model/optimizer/step are the checkpoint's format: runs resume each other's checkpoints.
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=self.step_var)
        # made now: a restore makes it and expects it in the files it reads (CheckpointManager.save made it)
        _ = self.checkpoint.save_counter
        def variables():
            return [*model.variables, *optimizer.variables]

        if strategy.variables_on_other_tasks:
            self.write = traced.checkpoint_write(self.checkpoint, self.options, variables)
            self.finite = traced.all_finite(variables)
        else:
            self.write = self._write_eagerly
            self.finite = lambda: all_finite(variables())

    def _write_eagerly(self, prefix: str) -> None:
        self.checkpoint.write(prefix, options=self.options)

    def _restore_from(self, path: str, where: str) -> int:
        self.checkpoint.restore(path, options=self.options).assert_existing_objects_matched()
        step = int(self.step_var.numpy())
        log(f"resumed from checkpoint at step {step}{where}")
        return step

    def restore(self) -> int:
        """Restore the newest checkpoint (local or S3) and return its step; 0 when there is none."""
        s3 = self.settings.s3
        local_step = (checkpoints.local_steps(self.directory) or [0])[-1]
        s3_steps = checkpoints.saved_steps(self.client, s3.bucket, s3.checkpoint_prefix)
        if local_step and self.strategy.prefers_local_checkpoints() and local_step > (s3_steps[-1] if s3_steps else 0):
            step = self._restore_from(str(checkpoints.local_prefix(self.directory, local_step)),
                                      " (local, newer than S3)")
        else:
            latest = checkpoints.download_latest(self.client, s3.bucket, s3.checkpoint_prefix, self.directory)
            step = self._restore_from(str(latest[1]), "") if latest else 0
        if step > self.settings.steps:
            raise FinalError(f"checkpoint step {step} is beyond steps={self.settings.steps}")
        return step

    def save(self, step: int) -> None:
        """Write checkpoint ``step`` locally, then upload it (the run's owner); another task's copy is a
        scratch one (TensorFlow needs every task of a synchronous strategy to save), deleted at once."""
        self.step_var.assign(step)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write(str(checkpoints.local_prefix(self.directory, step)))
        if self.strategy.writes_published_checkpoints():
            checkpoints.prune_local(self.directory)
            self._upload(step)
        else:
            shutil.rmtree(self.directory, ignore_errors=True)
        log(f"checkpoint saved at step {step}")

    def _upload(self, step: int) -> None:
        s3 = self.settings.s3
        try:
            checkpoints.upload(self.client, s3.bucket, s3.checkpoint_prefix, self.directory, step)
        except Exception as exc:
            unpublished.mark(self.settings.state_dir, self.settings.run_id, step,
                             f"checkpoint upload failed: {exc}", self.directory)
            raise

