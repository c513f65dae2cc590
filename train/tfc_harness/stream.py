"""Streaming a worker's training files from S3 through a small local window of downloaded files.

Two sides meet in a directory (:data:`STREAM_DIR`, relative: each harness process runs in its state_dir):

* :class:`Prefetcher`, a thread in the worker's harness process, downloads the worker's files in an
  endless sequence of epochs (each epoch's file order shuffled with ``seed + epoch``) as ``<seq>.data``
  (written to a temp name, then renamed; ``<seq>.data.source`` beside it names the object, so a reader's
  error names it too: :func:`tfc_harness.formats.shown_name`), at most ``ahead`` files past the reader's
  position, and deletes the files the reader has passed.  So at most ``ahead + 1`` data files are on disk,
  whatever the data set's size, and nothing holds a file in memory.  When the worker's files hold at most
  ``keep_bytes`` (see :func:`keep_budget`), each is downloaded once: its first download gets a second name in
  ``kept/``, and each later epoch's ``<seq>.data`` is a new link to it (no S3 request; deleting a passed name
  leaves the kept one).
* :func:`file_names`, the dataset the reader pulls file names from.  It is traced on the chief and runs on
  each worker under ``ParameterServerStrategy`` (``create_per_worker_dataset``), where no Python runs: it
  is made of TensorFlow graph ops only.  It polls (a ``SleepDataset`` between ``tf.io.matching_files``
  checks) until ``<seq>.data`` exists, writes ``seq`` to ``<directory>/position`` and yields the path; a
  file that does not appear within ``wait_s`` (the prefetcher stopped, failed or cannot keep up) ends the
  dataset with an error naming it.  A reader created again on a running worker starts at the recorded
  position (the files before it are gone).

The position protocol assumes one reader that opens its files one at a time, in order, and asks for the
next name only after reading the current file to its end (the readers of :mod:`tfc_harness.formats` do).

:func:`test_batches` is the chief's (and the verifier's) way through the test files: one at a time,
eagerly, numpy batches out.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from . import s3io
from .formats import SOURCE_SUFFIX
from .status import log_line

STREAM_DIR = "data/stream"
POSITION = "position"
SUFFIX = ".data"
KEPT = "kept"
#: the most bytes of files a worker keeps for its later epochs (and at most a quarter of the free disk)
KEEP_BYTES = 1 << 30
RECENT = 8        # downloads that stats()["mb_per_s"] averages over
_NO_END = 2 ** 62
_GLOB_CHARS = "*?[\\"


log = log_line    # one write a line: threads log beside each other (status.log_line)


def data_path(directory: str | Path, seq: int) -> Path:
    return Path(directory) / f"{seq}{SUFFIX}"


def write_source(path: Path, bucket: str, key: str) -> None:
    """Name the object ``path`` is (or is about to be) a copy of, for a reader's errors."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{path}{SOURCE_SUFFIX}").write_text(f"s3://{bucket}/{key}\n")


def remove(path: Path) -> None:
    """A copy and the name of its object."""
    path.unlink(missing_ok=True)
    Path(f"{path}{SOURCE_SUFFIX}").unlink(missing_ok=True)


def read_position(directory: str | Path) -> int | None:
    """The reader's position recorded in ``directory``, or None (not yet written, or caught mid-write)."""
    try:
        text = (Path(directory) / POSITION).read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def clear(directory: str | Path) -> None:
    """Create ``directory``; remove data files, partial downloads, kept files and the position left by an
    earlier run."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in itertools.chain(folder.glob(f"*{SUFFIX}"), folder.glob(f"*{SUFFIX}{SOURCE_SUFFIX}"),
                                 folder.glob(f".*{SUFFIX}.part")):
        stale.unlink(missing_ok=True)
    (folder / POSITION).unlink(missing_ok=True)
    shutil.rmtree(folder / KEPT, ignore_errors=True)


def keep_budget(directory: str | Path, sharers: int = 1) -> int:
    """How many bytes of files a worker streaming into ``directory`` may keep: :data:`KEEP_BYTES`, and no more
    than a quarter of the disk space free there shared by ``sharers`` (the run's training tasks: local nodes
    share the host's disk).  Measure it after :func:`clear`, which removes an earlier run's kept files."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    return min(KEEP_BYTES, shutil.disk_usage(folder).free // (4 * max(1, sharers)))


class Prefetcher:
    """Downloads ``files`` (``[{"key", "size", ...}]``) ahead of the reader of :func:`file_names`."""

    def __init__(self, s3_client, bucket: str, files: list[dict], directory: str | Path = STREAM_DIR,
                 ahead: int = 3, seed: int = 0, *, poll_s: float = 0.05, keep_bytes: int = 0):
        if not files:
            raise ValueError("no files to stream")
        if ahead < 1:
            raise ValueError(f"ahead must be at least 1 (the file after the reader's), not {ahead}")
        self.client, self.bucket, self.directory = s3_client, bucket, Path(directory)
        self.files = sorted(files, key=lambda f: f["key"])
        self.ahead, self.seed, self.poll_s = ahead, seed, poll_s
        #: whether each file is downloaded once and kept (``kept/<its index in files>``): they fit ``keep_bytes``
        self.keeps = sum(f["size"] for f in self.files) <= keep_bytes
        self._slots = {f["key"]: i for i, f in enumerate(self.files)}
        self._reused = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._recent: deque[tuple[int, float]] = deque(maxlen=RECENT)
        self._bytes = self._files = self._epoch = 0
        self._error: str | None = None
        self._position = 0   # the reader's, as last read
        self._deleted_below = 0       # every data file below this is deleted

    def start(self) -> Prefetcher:
        """Clear the directory (synchronously) and start downloading in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("prefetcher already started")
        clear(self.directory)
        self._thread = threading.Thread(target=self._run, name="stream-prefetcher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop after the download in progress (if any); wait at most ``timeout_s`` for it.  The kept files go
        (a name the reader holds is a link of its own)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if not self.running():
            self.discard()

    def discard(self) -> None:
        """Remove the kept files (a serving worker does when it is stopped: it leaves without a teardown)."""
        shutil.rmtree(self.directory / KEPT, ignore_errors=True)

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stats(self) -> dict:
        """Bytes and files downloaded, the epoch being downloaded (from 0), recent MB/s (1e6 B), error; with
        kept files also ``reused`` (the files served from them) and ``all_kept`` (no more downloads)."""
        with self._lock:
            seconds = sum(s for _, s in self._recent)
            rate = sum(b for b, _ in self._recent) / seconds / 1e6 if seconds > 0 else 0.0
            stats = {"bytes": self._bytes, "mb_per_s": round(rate, 3), "epoch": self._epoch,
                     "files": self._files, "error": self._error}
            if not self.keeps:
                return stats
            return dict(stats, reused=self._reused, all_kept=self._files == len(self.files))

    def epoch_order(self, epoch: int) -> list[dict]:
        order = list(self.files)
        random.Random(self.seed + epoch).shuffle(order)
        return order

    def _run(self) -> None:
        try:
            self._download_epochs()
        except Exception as exc:  # noqa: BLE001 - recorded; the reader then times out naming its file
            with self._lock:
                self._error = str(exc)
            log(f"ERROR: stream prefetcher stopped: {exc}")

    def _download_epochs(self) -> None:
        seq = 0
        for epoch in itertools.count():
            with self._lock:
                self._epoch = epoch
            for f in self.epoch_order(epoch):
                if not self._wait_for_room(seq):
                    return
                self._download(f, seq)
                seq += 1

    def _wait_for_room(self, seq: int) -> bool:
        """Delete passed files until ``seq`` is at most ``ahead`` past the reader; False when stopped."""
        while not self._stop.is_set():
            self._collect()
            if seq <= self._position + self.ahead:
                return True
            self._stop.wait(self.poll_s)
        return False

    def _collect(self) -> None:
        self._position = max(self._position, read_position(self.directory) or 0)
        for passed in range(self._deleted_below, self._position):
            remove(data_path(self.directory, passed))
        self._deleted_below = max(self._deleted_below, self._position)

    def _download(self, f: dict, seq: int) -> None:
        kept = self.directory / KEPT / str(self._slots[f["key"]])
        write_source(data_path(self.directory, seq), self.bucket, f["key"])
        if self.keeps and kept.exists() and self._link(kept, data_path(self.directory, seq)):
            with self._lock:
                self._reused += 1
            return
        started = time.monotonic()
        path = s3io.download_file(self.client, self.bucket, f["key"], data_path(self.directory, seq))
        took, size = time.monotonic() - started, path.stat().st_size
        if self.keeps:
            kept.parent.mkdir(exist_ok=True)
            self._link(path, kept)
        with self._lock:
            self._bytes += size
            self._files += 1
            self._recent.append((size, took))

    def _link(self, source: Path, name: Path) -> bool:
        """A second name for ``source`` (the whole file appears at once, as a rename's does); where that fails
        (a file system without hard links), every later epoch downloads again, as without a budget."""
        try:
            os.link(source, name)
            return True
        except OSError as exc:
            log(f"the stream keeps no files on this disk ({exc}): each epoch downloads them again")
            with self._lock:
                self.keeps = False
            self.discard()
            return False


def file_names(directory: str = STREAM_DIR, poll_ms: int = 50, wait_s: float = 600):
    """A ``tf.data.Dataset`` of the paths ``<directory>/<seq>.data`` in sequence order, graph ops only.

    Auto-sharding is off: the files are already this worker's own.  So is tf.data's injected prefetch,
    which would pull names ahead of the reader.
    """
    import tensorflow as tf

    if poll_ms < 1 or wait_s <= 0:
        raise ValueError(f"poll_ms must be at least 1 and wait_s positive (not {poll_ms} and {wait_s})")
    folder = _graph_directory(directory)
    position = f"{folder}/{POSITION}"
    # The position's name enters as an element, not a constant that graph optimization could read early.
    seqs = tf.data.Dataset.from_tensors(position).flat_map(lambda at: tf.data.Dataset.range(_start(at), _NO_END))
    names = seqs.flat_map(lambda seq: _when_present(folder, position, seq, poll_ms, wait_s))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # No prefetch may pull names (and so record the position) before the reader asks for them: a name
    # pulled early would let the prefetcher delete a file that has not been opened yet.
    options.experimental_optimization.inject_prefetch = False
    return names.with_options(options)


def _graph_directory(directory: str) -> str:
    text = str(directory).rstrip("/") or "."
    if any(c in text for c in _GLOB_CHARS):
        raise ValueError(f"stream directory {text!r}: no {_GLOB_CHARS} allowed (it is used in a file pattern)")
    return text


def _start(position):
    """The recorded reader position (a reader created again resumes there), else 0; an int64 op."""
    import tensorflow as tf

    def recorded():
        text = tf.strings.strip(tf.io.read_file(position))
        return tf.strings.to_number(tf.where(tf.strings.regex_full_match(text, "[0-9]+"), text, "0"), tf.int64)

    return tf.cond(tf.size(tf.io.matching_files(position)) > 0, recorded, lambda: tf.constant(0, tf.int64))


def _when_present(folder: str, position: str, seq, poll_ms: int, wait_s: float):
    """A one-element dataset: the path of ``seq`` once it exists (position recorded), else an error."""
    import tensorflow as tf

    path = tf.strings.join([folder, "/", tf.strings.as_string(seq), SUFFIX])
    started = tf.timestamp()
    polls = tf.data.Dataset.range(1).concatenate(_sleeping(tf.data.Dataset.range(1, _NO_END), poll_ms * 1000))
    checks = polls.map(lambda _: (tf.size(tf.io.matching_files(path)) > 0, tf.timestamp() - started))
    found = checks.filter(lambda present, waited: tf.logical_or(present, waited >= wait_s)).take(1)
    return found.map(lambda present, _: _claim(path, present, position, seq, wait_s))


def _sleeping(dataset, micros: int):
    """``dataset`` with a sleep of ``micros`` before each element (``dataset`` of int64 scalars)."""
    import tensorflow as tf

    variant = tf.raw_ops.SleepDataset(input_dataset=tf.data.experimental.to_variant(dataset),
                                      sleep_microseconds=tf.constant(int(micros), tf.int64),
                                      output_types=[tf.int64], output_shapes=[[]])
    return tf.data.experimental.from_variant(variant, tf.TensorSpec([], tf.int64))


def _claim(path, present, position: str, seq, wait_s: float):
    """``path``, after failing unless ``present`` and then recording ``seq`` as the reader's position."""
    import tensorflow as tf

    message = tf.strings.join([
        "stream file ", path, f" did not appear within {wait_s:g} s: the data prefetcher on this worker "
        "stopped, failed or cannot keep up (see the log of this worker)"])
    with tf.control_dependencies([tf.debugging.Assert(present, [message])]):
        recorded = tf.io.write_file(position, tf.strings.as_string(seq))
    with tf.control_dependencies([recorded]):
        return tf.identity(path)


def test_batches(s3_client, bucket: str, files: list[dict], read: Callable, directory: str | Path,
                 batch_size: int) -> Iterator:
    """Numpy ``(x, y)`` batches of ``files`` in order, eager; one file on disk at a time, deleted after use.

    Batches run across file boundaries: all hold ``batch_size`` examples but the last.
    """
    return _rebatch(_file_batches(s3_client, bucket, files, read, Path(directory), batch_size), batch_size)


def _file_batches(s3_client, bucket: str, files: list[dict], read: Callable, folder: Path, batch_size: int):
    import tensorflow as tf

    path = folder / "test-file"   # not <seq>.data: a Prefetcher may share the directory
    batches = read(tf.data.Dataset.from_tensors(str(path))).batch(batch_size)   # traced once, re-run per file
    for f in files:
        write_source(path, bucket, f["key"])
        s3io.download_file(s3_client, bucket, f["key"], path)
        try:
            yield from batches.as_numpy_iterator()
        finally:
            remove(path)


def _rebatch(parts: Iterator, batch_size: int) -> Iterator:
    """Regroup nested numpy batches of any sizes into ``batch_size`` ones (the last may be smaller)."""
    import numpy as np
    import tensorflow as tf

    pending, count = [], 0
    for part in parts:
        pending.append(part)
        count += len(tf.nest.flatten(part)[0])
        while count >= batch_size:
            merged = pending[0] if len(pending) == 1 else tf.nest.map_structure(
                lambda *a: np.concatenate(a), *pending)
            yield tf.nest.map_structure(lambda a: a[:batch_size], merged)
            count -= batch_size
            pending = [tf.nest.map_structure(lambda a: a[batch_size:], merged)] if count else []
    if count:
        yield pending[0] if len(pending) == 1 else tf.nest.map_structure(lambda *a: np.concatenate(a), *pending)
