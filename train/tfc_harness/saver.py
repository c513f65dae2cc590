"""The chief's checkpoints: restore the newest of the local and the S3 copies, save and mirror to S3.

Local checkpoints live in the strategy's :meth:`~tfc_harness.strategies.Strategy.checkpoint_dir` (the
newest :data:`~tfc_harness.checkpoints.KEEP`); S3's in ``<checkpoint_prefix>/`` (:mod:`tfc_harness.checkpoints`).
A local checkpoint newer than any in S3 (its upload failed) wins over S3's.  A failed upload leaves
``unpublished.json`` (:mod:`tfc_harness.unpublished`) so that the node is not destroyed with the only copy.

The copy to S3 runs in a thread of its own while training goes on (it took ~0.1 s of every checkpoint of the
digits model on a local cluster, with every worker idle: 15-20 % of a 2000-step run's time at one
checkpoint every 100 steps); ``checkpoint saved at step N`` is logged once S3 has it.  One copy at a time:
the next save, and :meth:`Saver.wait_uploaded`, wait for the one under way, and raise its error.  The
chief's TensorBoard events are copied in that thread after each checkpoint (:meth:`Saver.after_each_upload`).

Where the model's variables sit on other tasks (the parameter servers:
:attr:`~tfc_harness.strategies.Strategy.variables_on_other_tasks`), a checkpoint spans several tasks and
TensorFlow traces a new function for every eager save of it (its ``MultiDeviceSaver``: ~0.2 s a checkpoint of
the digits model here, and a retracing warning in the log from the fifth on); ``Checkpoint.write`` in one
function of its own (:func:`tfc_harness.traced.checkpoint_write`) writes the same files (~0.02 s), traced again
only when the variables it saves are others; so does the check that they are finite, a round trip to the ps
a variable when eager (:func:`tfc_harness.traced.all_finite`).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from . import checkpoints, traced, unpublished
from .errors import FinalError
from .status import log_line
from .steps import all_finite

log = log_line    # one write a line: this logs from the upload's thread too


class Saver:
    """``restore()`` once, then ``save(step)`` at each checkpoint boundary that is due (``finite()`` before it:
    whether the weights and the optimizer's state it would save are all finite); ``wait_uploaded()`` before the
    run ends (and on the way out of a failed one: :meth:`uploads`)."""

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
        self._uploader: ThreadPoolExecutor | None = None
        self._uploading: Future | None = None
        self._after_upload: Callable[[], None] | None = None
        def variables():
            return [*model.variables, *optimizer.variables]

        if strategy.variables_on_other_tasks:
            self.write = traced.checkpoint_write(self.checkpoint, self.options, variables)
            self.finite = traced.all_finite(variables)
        else:
            self.write = self._write_eagerly
            self.finite = lambda: all_finite(variables())

    def after_each_upload(self, also: Callable[[], None]) -> None:
        """Have ``also`` (the TensorBoard events' copy: it never raises) run in the uploading thread once each
        checkpoint is in S3: it took 16-22 ms of every checkpoint's stop of the loop, every worker idle."""
        self._after_upload = also

    def warm_up(self) -> None:
        """Trace the checkpoint's write and run the finite check once, where they are functions traced for the
        variables on the parameter servers: the first save paid for both (~0.5 s of a 600-step digits run on a
        local cluster, every worker idle); the strategy has this done while its first call waits on the
        workers (:meth:`tfc_harness.strategies.Strategy.while_first_call`)."""
        if self.strategy.variables_on_other_tasks:
            self.write.trace()
            self.finite()

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
        """Write checkpoint ``step`` locally, then hand its upload to the uploading thread (the run's owner); another
        task's copy is a scratch one (TensorFlow needs every task of a synchronous strategy to save), deleted at
        once.  The upload of the previous checkpoint is waited for after the write (its files are not pruned
        under it); its error is raised here, with this step kept on the node and named in ``unpublished.json``
        (a restart resumes from it, the newest local checkpoint)."""
        self.step_var.assign(step)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write(str(checkpoints.local_prefix(self.directory, step)))
        if not self.strategy.writes_published_checkpoints():
            shutil.rmtree(self.directory, ignore_errors=True)
            log(f"checkpoint saved at step {step}")
            return
        try:
            self.wait_uploaded()
        except Exception as exc:
            unpublished.mark(self.settings.state_dir, self.settings.run_id, step,
                             f"checkpoint upload failed: {exc}", self.directory)
            raise
        checkpoints.prune_local(self.directory)
        if self._uploader is None:
            self._uploader = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-upload")
        self._uploading = self._uploader.submit(self._upload, step)

    def wait_uploaded(self) -> None:
        """Return once the last checkpoint handed to S3 is there; raise its upload's error (``unpublished.json``
        is written by then)."""
        uploading, self._uploading = self._uploading, None
        if uploading is not None:
            uploading.result()

    @contextlib.contextmanager
    def uploads(self):
        """Around the training loop: waits for the last upload at its end; a loop that fails (a preemption, a
        lost peer, divergence, a Ctrl-C) still waits for the checkpoint being copied (its retries included),
        so that the process does not end with it half way, and only logs that upload's error (the loop's is
        the one raised)."""
        try:
            yield self
            self.wait_uploaded()
        except BaseException:
            try:
                self.wait_uploaded()
            except Exception as exc:  # noqa: BLE001 - the loop's error is the run's; this one is in unpublished.json
                log(f"checkpoint upload failed too: {type(exc).__name__}: {exc}")
            raise
        finally:
            if self._uploader is not None:
                self._uploader.shutdown()
                self._uploader = None

    def _upload(self, step: int) -> None:
        s3 = self.settings.s3
        try:
            checkpoints.upload(self.client, s3.bucket, s3.checkpoint_prefix, self.directory, step)
        except Exception as exc:
            unpublished.mark(self.settings.state_dir, self.settings.run_id, step,
                             f"checkpoint upload failed: {exc}", self.directory)
            raise
        log(f"checkpoint saved at step {step}")
        if self._after_upload is not None:
            self._after_upload()
