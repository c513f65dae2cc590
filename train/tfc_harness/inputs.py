"""Where a run's examples come from: one small class per kind of data, the same interface for each.

* :class:`ArrayInput`: the arrays the model module's ``make_dataset()`` built, stored by the controller
  as ``train.npz``/``test.npz`` (:mod:`tfc_harness.data`).  A training task writes its rows to a local
  TFRecord shard before it connects (:mod:`tfc_harness.records`); the test split is small and read into
  memory.
* :class:`FileInput`: TFRecord or CSV files in object storage, listed and assigned to the training tasks by
  the controller when the run starts (settings ``data``).  A training task streams its files through a
  bounded local buffer (:class:`tfc_harness.stream.Prefetcher`), epoch after epoch; the chief evaluates the
  test files one at a time.

The training tasks are the tasks that read training data, numbered in the order
:func:`tfc_harness.strategies.training_tasks` gives (``parameter_server``: the workers;
``multi_worker_mirrored``: the chief, then the workers); task ``i`` reads share ``i``.  Every input gives
the chief: :meth:`probe` (a few test examples, to check the model against the labels before any peer is
asked), :meth:`dataset_fn` (the per-task training pipeline: graph ops only, as it may be traced on the
chief and run on each worker), :meth:`test_batches` and :meth:`describe` (what exactly the run trained and
was evaluated on).  A training task calls :meth:`prepare_worker`.  :func:`verify_spec` fetches a run's test
split for the verifier.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import ModuleType

import numpy as np

from . import data, s3io
from .settings import Settings

PROBE_EXAMPLES = 8
SHUFFLE_BYTES = 64 << 20          # a streaming worker's shuffle buffer holds about this much, at most
SHUFFLE_EXAMPLES = (64, 10_000)   # and between these many examples
#: the first test file is counted whole when it is at most this large: its bytes per example estimate how many
#: examples a training task's files hold (an epoch), which the shuffle buffer need not exceed
EPOCH_COUNT_BYTES = 4 << 20
PREFETCH_FILES = 3


def for_settings(settings: Settings, client, module: ModuleType | None = None):
    """The input the settings name (``module`` is needed by the chief for ``decode``)."""
    if settings.data is None:
        return ArrayInput(settings, client)
    return FileInput(settings, client, module)


class ArrayInput:
    """The module's own arrays (``make_dataset()``), stored under a content-named prefix."""

    def __init__(self, settings: Settings, client):
        self.settings, self.client = settings, client
        self._test: tuple[np.ndarray, np.ndarray] | None = None

    def _test_split(self) -> tuple[np.ndarray, np.ndarray]:
        if self._test is None:
            s3 = self.settings.s3
            self._test = data.load_split(self.client, s3.bucket, s3.dataset_prefix, "test")
        return self._test

    def probe(self):
        x, y = self._test_split()
        return x[:PROBE_EXAMPLES], y[:PROBE_EXAMPLES]

    def dataset_fn(self, batch_size: int):
        from . import records

        x, y = self.probe()
        return records.make_dataset_fn(tuple(x.shape[1:]), batch_size, label_shape=tuple(y.shape[1:]),
                                       label_dtype=str(y.dtype))

    def test_batches(self, batch_size: int):
        from .evaluate import array_batches

        return array_batches(*self._test_split(), batch_size)

    def prepare_worker(self):
        """Download the training split and write this training task's rows to its local TFRecord shard."""
        from . import records

        s = self.settings
        x, y = data.load_split(self.client, s.s3.bucket, s.s3.dataset_prefix, "train")
        x, y = data.shard_rows(x, y, s.training_index, s.num_training_tasks)
        path = records.write_tfrecord(Path(s.state_dir) / records.SHARD_PATH, x, y)
        print(f"{s.role} {s.index}: wrote {len(x)} of the training rows to {path}", flush=True)
        return None

    def describe(self) -> dict:
        """The arrays' prefix, which ends in the first 12 hex digits of their sha256 (the run record has all)."""
        s3 = self.settings.s3
        return {"source": "arrays", "bucket": s3.bucket, "prefix": s3.dataset_prefix}


class FileInput:
    """TFRecord or CSV files in object storage, streamed by each training task."""

    def __init__(self, settings: Settings, client, module: ModuleType | None):
        self.settings, self.client, self.module = settings, client, module
        self.files = settings.data
        self._probe = None

    def reader(self):
        from . import formats

        return formats.reader(self.files.format, decode=getattr(self.module, "decode", None),
                              columns=self.files.columns, label=self.files.label)

    def probe(self):
        """The first examples of the first test file (downloaded to a scratch directory, then removed)."""
        if self._probe is None:
            self._probe = next(iter(self.test_batches(PROBE_EXAMPLES, files=self.files.test[:1])), None)
        if self._probe is None:
            raise ValueError(f"s3://{self.files.bucket}/{self.files.test[0].key} holds no examples")
        return self._probe

    def shuffle_examples(self) -> int:
        """How many examples the shuffle buffer holds: about :data:`SHUFFLE_BYTES` of them (decoded), so that
        large examples (images) do not fill a worker's memory, and no more than about one epoch of the training
        task with the fewest (:meth:`smallest_epoch`): the stream repeats a task's files epoch after epoch, and
        a buffer of many epochs is filled from all of them before the first step (the diabetes example: 10,000
        examples, ~55 epochs of ~180 rows, ~6 s of downloads in the first call)."""
        x, y = self.probe()
        per_example = max(1, (x.nbytes + y.nbytes) // len(x))
        low, high = SHUFFLE_EXAMPLES
        size = max(low, min(high, SHUFFLE_BYTES // per_example))
        epoch = self.smallest_epoch()
        return size if epoch is None else max(low, min(size, epoch))

    def smallest_epoch(self) -> int | None:
        """About how many examples the training task with the fewest bytes of files reads in an epoch: its bytes
        over the first test file's bytes per example (that file counted whole); None when that file is larger
        than :data:`EPOCH_COUNT_BYTES` or holds no example."""
        first = self.files.test[0]
        if first.size > EPOCH_COUNT_BYTES:
            return None
        count = sum(len(y) for _, y in self.test_batches(1024, files=[first]))
        if count == 0:
            return None
        fewest = min(sum(f.size for f in mine) for mine in self.files.train)
        return math.ceil(fewest * count / max(first.size, 1))

    def dataset_fn(self, batch_size: int):
        read, shuffle = self.reader(), self.shuffle_examples()
        checked = labels_between_0_and_1(self.module)

        def dataset_fn():
            from . import stream

            batches = read(stream.file_names()).shuffle(shuffle).batch(batch_size, drop_remainder=True)
            return (batches.map(checked) if checked else batches).prefetch(2)

        return dataset_fn

    def test_batches(self, batch_size: int, files=None):
        from . import stream

        directory = Path(self.settings.state_dir) / "data" / "test"
        files = [f.model_dump() for f in (files if files is not None else self.files.test)]
        try:
            yield from stream.test_batches(self.client, self.files.bucket, files, self.reader(), directory,
                                           batch_size)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def prepare_worker(self):
        """Start streaming this training task's files; returns the prefetcher (its ``stats()`` go to status)."""
        from . import stream

        s = self.settings
        mine = [f.model_dump() for f in self.files.train[s.training_index]]
        directory = Path(s.state_dir) / stream.STREAM_DIR
        stream.clear(directory)      # an earlier run's kept files count against the free disk otherwise
        prefetcher = stream.Prefetcher(self.client, self.files.bucket, mine, directory, ahead=PREFETCH_FILES,
                                       seed=s.training_index,
                                       keep_bytes=stream.keep_budget(directory, len(self.files.train)))
        prefetcher.start()
        size = sum(f["size"] for f in mine)
        kept = "; each downloaded once and kept for the later epochs" if prefetcher.keeps else ""
        print(f"{s.role} {s.index}: streaming {len(mine)} files ({size / 1e6:.1f} MB) from "
              f"s3://{self.files.bucket}/{kept}", flush=True)
        return prefetcher

    def describe(self) -> dict:
        def listed(files):
            return [{"key": f.key, "etag": f.etag, "size": f.size} for f in files]

        return {"source": "files", "format": self.files.format, "bucket": self.files.bucket,
                "label": self.files.label, "columns": self.files.columns,
                "train": sorted(listed(f for worker in self.files.train for f in worker), key=lambda f: f["key"]),
                "test": listed(self.files.test)}


def verify_spec(client, bucket: str, dataset_prefix: str, files: dict | None, directory: Path) -> dict:
    """Download the test split a run used into ``directory``; returns the spec :mod:`tfc_harness.evaluate`
    reads (its ``dir``: ``directory``, which holds every file it names).  ``files`` is the settings' ``data``
    (None: the arrays under ``dataset_prefix`` in ``bucket``)."""
    from . import stream

    directory.mkdir(parents=True, exist_ok=True)
    if files is None:
        path = directory / "test.npz"
        s3io.download_file(client, bucket, data.split_key(dataset_prefix, "test"), path)
        return {"source": "arrays", "npz": str(path), "dir": str(directory)}
    paths = []
    for i, f in enumerate(files["test"]):
        now = s3io.etag(client, files["bucket"], f["key"])
        if now != f["etag"]:
            raise s3io.TransferError(f"s3://{files['bucket']}/{f['key']} changed since the run started (ETag "
                                     f"{f['etag']}, now {now}): the test data the model was evaluated on is gone")
        path = directory / f"test-{i:05d}"
        stream.write_source(path, files["bucket"], f["key"])
        s3io.download_file(client, files["bucket"], f["key"], path)
        paths.append(str(path))
    return {"source": "files", "format": files["format"], "paths": paths, "columns": files.get("columns"),
            "label": files.get("label"), "dir": str(directory)}


def labels_between_0_and_1(module: ModuleType | None):
    """A map over ``(features, labels)`` batches that fails on a label outside 0 to 1 where the module's loss
    takes probabilities (:func:`tfc_harness.usermodel.probability_labels`), else None: such a loss raises nothing
    on a 2, its loss goes negative and the model trains on nonsense. The controller checks the files' first
    records only; this checks the rest, in the reader on the task's CPU (in the step it cost every step a
    condition, on a GPU a copy of it to the host). A failure is final (:func:`tfc_harness.errors.bad_labels`)."""
    if module is None:
        return None
    from . import usermodel
    from .errors import LABEL_OUTSIDE_0_TO_1

    loss = usermodel.loss_fn(module)
    if not usermodel.probability_labels(loss):
        return None
    import tensorflow as tf

    message = f"{LABEL_OUTSIDE_0_TO_1}: {usermodel.probability_label_advice(loss)}; the first:"

    def checked(x, y):
        labels = tf.reshape(tf.cast(y, tf.float32), [-1])
        outside = tf.logical_or(labels < 0.0, labels > 1.0)
        fits = tf.debugging.Assert(tf.logical_not(tf.reduce_any(outside)),
                                   [message, tf.boolean_mask(labels, outside)[:1]])
        with tf.control_dependencies([fits]):
            return x, tf.identity(y)

    return checked
