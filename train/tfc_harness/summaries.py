"""TensorBoard: the chief's scalar summaries of a run, and their copy in S3 beside the run.

The task that concludes the run (the chief, under every strategy: :meth:`tfc_harness.strategies.Strategy.publishes`)
writes them with ``tf.summary.create_file_writer`` into ``<state_dir>/tensorboard/<run_id>/`` (as TensorFlow's
own ``tf.summary.write`` with the scalars plugin's metadata: the nodes have no TensorBoard); the other tasks
write nothing (:class:`NoSummaries`)::

    train/loss, train/learning_rate, train/examples_per_sec   at each progress line (about once a second,
                                                             and at the last step)
    test/loss, test/<metric>                                   after evaluation, at the last step (the
                                                             figures metrics.json calls test_<metric>)

The directory's files are copied to ``<run_prefix>/tensorboard/`` (:data:`S3_FOLDER`) after each checkpoint
upload, before the model is published and when the run fails.  Each copy is best effort: a failure is
logged, never raised, so it neither stops training nor hides the error the run failed with; writing a
summary that fails likewise only turns summaries off.  The event files are no part of the model's
manifest: verification never reads them.  A chief restarted for the same run writes a new event file beside
the old ones (TensorBoard reads them together).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from . import s3io
from .status import log_line

LOCAL_DIR = "tensorboard"       # under the task's state_dir, then one folder per run
S3_FOLDER = "tensorboard"       # under the run's prefix
TRAIN_TAGS = ("train/loss", "train/learning_rate", "train/examples_per_sec")   # test/<metric> after evaluation


log = log_line    # one write a line: threads log beside each other (status.log_line)


def learning_rate_of(optimizer) -> Callable[[], float]:
    """A reader of the optimizer's current learning rate (a schedule is evaluated at its current step)."""
    import numpy as np

    return lambda: float(np.asarray(optimizer.learning_rate))


def _scalar_metadata():
    """What marks a summary as a scalar for TensorBoard's scalars dashboard: ``tf.summary.scalar`` itself is
    TensorBoard's (a stub that raises where only TensorFlow is installed, as on the nodes); this is the
    metadata it writes, through TensorFlow's own ``tf.summary.write``."""
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


class NoSummaries:
    """What a task that does not conclude the run writes: nothing."""

    def watch_learning_rate(self, read: Callable[[], float]) -> None:
        pass

    def use_client(self, client) -> None:
        pass

    def training(self, step: int, loss: float, examples_per_sec: float) -> None:
        pass

    def evaluation(self, step: int, metrics: dict) -> None:
        pass

    def upload(self, tries: int = s3io.DEFAULT_TRIES) -> None:
        pass


class Summaries(NoSummaries):
    """The chief's event files in ``directory`` and their copy in ``s3://<bucket>/<run_prefix>/tensorboard/``.

    TensorFlow is imported, and the writer made, only at the first summary: a strategy that must connect
    before TensorFlow runs anything has connected by then.
    """

    def __init__(self, directory: str | os.PathLike, client_fn: Callable[[], object], bucket: str,
                 run_prefix: str):
        self.directory = Path(directory)
        self.bucket, self.prefix = bucket, s3io.join_key(run_prefix, S3_FOLDER)
        self._client_fn, self._client = client_fn, None
        self._writer, self._failed = None, False
        self._learning_rate: Callable[[], float] | None = None
        self._uploaded: dict[str, int] = {}     # relative path -> size when last copied

    @classmethod
    def for_task(cls, settings, strategy) -> NoSummaries:
        """The chief's summaries; nothing on the tasks that do not conclude the run."""
        if not strategy.publishes():
            return NoSummaries()
        s3 = settings.s3
        return cls(Path(settings.state_dir) / LOCAL_DIR / settings.run_id,
                   lambda: s3io.client_from_settings(settings), s3.bucket, s3.run_prefix)

    def watch_learning_rate(self, read: Callable[[], float]) -> None:
        self._learning_rate = read

    def use_client(self, client) -> None:
        """Copy with ``client`` (the chief's own: a client of its own cost the first copy, at the first
        checkpoint, ~0.1 s with every worker idle) instead of making one at the first copy."""
        self._client = client

    def training(self, step: int, loss: float, examples_per_sec: float) -> None:
        values = {"train/loss": loss, "train/examples_per_sec": examples_per_sec}
        if self._learning_rate is not None:
            values["train/learning_rate"] = self._learning_rate
        self._write(step, values)

    def evaluation(self, step: int, metrics: dict) -> None:
        """``test_<name>`` figures of ``metrics`` as ``test/<name>`` at ``step``; then flushed."""
        self._write(step, {f"test/{key.removeprefix('test_')}": value for key, value in metrics.items()
                           if key.startswith("test_") and key != "test_examples"})
        self._flush()

    def _write(self, step: int, values: dict) -> None:
        if self._failed:
            return
        try:
            import tensorflow as tf

            numbers = {tag: float(value() if callable(value) else value) for tag, value in values.items()}
            if self._writer is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._writer = tf.summary.create_file_writer(str(self.directory))
            with self._writer.as_default(step=step):
                for tag, number in numbers.items():
                    tf.summary.write(tag, tf.constant(number, tf.float32), metadata=_scalar_metadata())
        except Exception as exc:  # noqa: BLE001 - a summary is never worth the run
            self._failed = True
            log(f"warning: TensorBoard summaries stopped: {type(exc).__name__}: {exc}")

    def _flush(self) -> None:
        if self._writer is not None:
            try:
                self._writer.flush()
            except Exception as exc:  # noqa: BLE001 - as in _write
                log(f"warning: could not flush the TensorBoard events: {type(exc).__name__}: {exc}")

    def upload(self, tries: int = s3io.DEFAULT_TRIES) -> None:
        """Flush, then copy every event file that is new or grew since the last copy; best effort."""
        self._flush()
        files = sorted(p for p in self.directory.rglob("*") if p.is_file()) if self.directory.is_dir() else []
        sizes = {p.relative_to(self.directory).as_posix(): p.stat().st_size for p in files}
        changed = {rel: size for rel, size in sizes.items() if self._uploaded.get(rel) != size}
        if not changed:
            return
        try:
            self._client = self._client or self._client_fn()
            for rel, size in changed.items():
                s3io.upload_file(self._client, self.directory / rel, self.bucket, s3io.join_key(self.prefix, rel),
                                 tries=tries)
                self._uploaded[rel] = size
        except Exception as exc:  # noqa: BLE001 - the events are not the model: never fail the run for them
            log(f"warning: could not copy the TensorBoard events to s3://{self.bucket}/{self.prefix}/: "
                f"{type(exc).__name__}: {exc}")
