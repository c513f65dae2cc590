"""Streaming files from S3 (moto): the prefetcher's window, the graph-only file name dataset, test batches."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfc_harness import formats, s3io, stream  # noqa: E402


def _upload_records(client, bucket, tmp_path, counts):
    """One TFRecord file per count, records ``b"<file>:<record>"``; returns the files as listed."""
    files = []
    for i, count in enumerate(counts):
        local = tmp_path / f"src-{i}.tfrecord"
        with tf.io.TFRecordWriter(str(local)) as writer:
            for j in range(count):
                writer.write(f"{i}:{j}".encode())
        key = f"d/part-{i}.tfrecord"
        s3io.upload_file(client, local, bucket, key)
        files.append({"key": key, "size": local.stat().st_size, "etag": ""})
    return files


def _file_of(record: bytes) -> str:
    return f"d/part-{record.decode().split(':')[0]}.tfrecord"


class DirectorySampler:
    """Counts ``*.data`` files in a directory every millisecond in a thread; remembers the most seen."""

    def __init__(self, directory):
        self.directory, self.most, self._stop = directory, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.most = max(self.most, len(list(self.directory.glob("*.data"))))
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _graph_ops(concrete) -> set[str]:
    graph = concrete.graph.as_graph_def()
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
    return ops


def test_file_names_and_reader_are_graph_ops_only(tmp_path):
    read = formats.reader("csv", columns=["a", "y"], label="y")
    concrete = tf.function(lambda: tf.data.experimental.to_variant(
        read(stream.file_names(str(tmp_path))))).get_concrete_function()
    ops = _graph_ops(concrete)
    assert {"SleepDataset", "MatchingFiles", "WriteFile", "Assert", "Timestamp"} <= ops
    assert not ops & {"PyFunc", "EagerPyFunc", "PyFuncStateless"}


def test_file_names_built_and_run_inside_a_tf_function(tmp_path):
    for seq in range(3):
        stream.data_path(tmp_path, seq).write_bytes(b"x")

    @tf.function
    def first_three():
        names = stream.file_names(str(tmp_path), poll_ms=5, wait_s=5).take(3)
        return names.reduce(tf.constant(""), lambda joined, name: tf.strings.join([joined, name, ";"]))

    assert first_three().numpy().decode() == "".join(f"{tmp_path}/{seq}.data;" for seq in range(3))
    assert stream.read_position(tmp_path) == 2
    assert stream.file_names(str(tmp_path)).options().experimental_distribute.auto_shard_policy == \
        tf.data.experimental.AutoShardPolicy.OFF


def test_the_default_directory_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stream.clear(stream.STREAM_DIR)
    stream.data_path(stream.STREAM_DIR, 0).write_bytes(b"x")
    assert next(iter(stream.file_names(wait_s=5))).numpy() == b"data/stream/0.data"
    assert (tmp_path / "data/stream/position").read_text() == "0"


def test_file_names_waits_for_a_file(tmp_path):
    names = iter(stream.file_names(str(tmp_path), poll_ms=10, wait_s=30))
    threading.Timer(0.3, lambda: stream.data_path(tmp_path, 0).write_bytes(b"x")).start()
    started = time.monotonic()
    assert next(names).numpy().decode() == f"{tmp_path}/0.data"
    assert 0.25 < time.monotonic() - started < 5
    assert stream.read_position(tmp_path) == 0


def test_a_missing_file_ends_with_an_error_naming_it_within_wait_s(tmp_path):
    stream.data_path(tmp_path, 0).write_bytes(b"x")
    names = iter(stream.file_names(str(tmp_path), poll_ms=10, wait_s=0.3))
    assert next(names).numpy().decode().endswith("/0.data")
    started = time.monotonic()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"stream file {tmp_path}/1.data did not appear within 0.3 s"):
        next(names)
    assert 0.25 < time.monotonic() - started < 3
    assert stream.read_position(tmp_path) == 0


def test_a_new_reader_resumes_at_the_recorded_position(tmp_path):
    for seq in (3, 4):
        stream.data_path(tmp_path, seq).write_bytes(b"x")
    (tmp_path / stream.POSITION).write_text("3")
    names = [n.decode() for n in stream.file_names(str(tmp_path), wait_s=0.2).take(2).as_numpy_iterator()]
    assert names == [f"{tmp_path}/3.data", f"{tmp_path}/4.data"]


def test_file_names_arguments():
    with pytest.raises(ValueError, match=r"stream directory 'data/\*': no "):
        stream.file_names("data/*")
    with pytest.raises(ValueError, match="poll_ms must be at least 1"):
        stream.file_names(poll_ms=0)
    with pytest.raises(ValueError, match="wait_s positive"):
        stream.file_names(wait_s=0)


def test_prefetcher_arguments(s3_client):
    with pytest.raises(ValueError, match="no files"):
        stream.Prefetcher(s3_client, "b", [])
    with pytest.raises(ValueError, match="ahead must be at least 1"):
        stream.Prefetcher(s3_client, "b", [{"key": "k", "size": 1}], ahead=0)


@pytest.mark.parametrize("keep", [False, True], ids=["streamed", "kept"])
def test_every_record_once_per_epoch_through_a_window_of_ahead_plus_one_files(s3_client, bucket, tmp_path, keep):
    """Kept: the same records, order and window, but each file is downloaded once (its later epochs' names are
    links to ``kept/``)."""
    counts = [3, 4, 5, 6, 7]
    files = _upload_records(s3_client, bucket, tmp_path, counts)
    directory = tmp_path / "stream"
    total = sum(f["size"] for f in files)
    prefetcher = stream.Prefetcher(s3_client, bucket, files, directory, ahead=2, seed=7, poll_s=0.01,
                                   keep_bytes=total if keep else total - 1)
    assert prefetcher.keeps is keep
    read = formats.reader("tfrecord", decode=lambda record: (record, tf.constant(0)))
    epochs, samples = 3, []
    records = []
    with DirectorySampler(directory) as sampler:
        prefetcher.start()
        try:
            examples = read(stream.file_names(str(directory), poll_ms=5, wait_s=30))
            for record, _ in examples.take(epochs * sum(counts)).as_numpy_iterator():
                records.append(record)
                samples.append(prefetcher.stats())
                time.sleep(0.004)   # a slow reader: the prefetcher would run ahead if it could
            time.sleep(0.3)
            final = prefetcher.stats()
            kept = sorted(p.read_bytes() for p in (directory / stream.KEPT).iterdir()) if keep else None
        finally:
            prefetcher.stop()
    assert not (directory / stream.KEPT).exists()                # stop removes the kept files
    assert not prefetcher.running()
    everything = sorted(f"{i}:{j}".encode() for i, count in enumerate(counts) for j in range(count))
    for epoch in range(epochs):
        seen = records[epoch * len(everything):(epoch + 1) * len(everything)]
        assert sorted(seen) == everything                       # each record exactly once per epoch
        order = [k for k, _ in itertools.groupby(_file_of(r) for r in seen)]
        assert order == [f["key"] for f in prefetcher.epoch_order(epoch)]
    assert len({tuple(f["key"] for f in prefetcher.epoch_order(e)) for e in range(epochs)}) > 1  # reshuffled
    assert sampler.most == 3                                    # ahead + 1, reached and never passed
    # The reader is on the epochs' last file, or on the next one when its parallel map read ahead.
    position = stream.read_position(directory)
    assert position in (epochs * len(files) - 1, epochs * len(files))
    served = position + 2 + 1
    in_order = [f for e in range(epochs + 1) for f in prefetcher.epoch_order(e)][:served]
    if keep:
        assert final == {"bytes": total, "mb_per_s": final["mb_per_s"], "epoch": epochs, "files": len(files),
                         "error": None, "reused": served - len(files), "all_kept": True}
        assert kept == sorted(s3_client.get_object(Bucket=bucket, Key=f["key"])["Body"].read() for f in files)
    else:
        assert final == {"bytes": sum(f["size"] for f in in_order), "mb_per_s": final["mb_per_s"],
                         "epoch": epochs, "files": served, "error": None}
    assert final["mb_per_s"] > 0
    assert [s["bytes"] for s in samples] == sorted(s["bytes"] for s in samples)
    assert samples[0]["bytes"] < samples[-1]["bytes"] and samples[0]["epoch"] < samples[-1]["epoch"]


def test_files_are_deleted_once_the_reader_has_passed_them(s3_client, bucket, tmp_path):
    files = _upload_records(s3_client, bucket, tmp_path, [1, 2, 3, 4])
    directory = tmp_path / "stream"
    prefetcher = stream.Prefetcher(s3_client, bucket, files, directory, ahead=2, seed=1, poll_s=0.01).start()
    try:
        names = iter(stream.file_names(str(directory), poll_ms=5, wait_s=30))
        order = prefetcher.epoch_order(0) + prefetcher.epoch_order(1)
        previous = None
        for f in order:
            path = next(names).numpy().decode()
            content = open(path, "rb").read()
            assert content == s3_client.get_object(Bucket=bucket, Key=f["key"])["Body"].read()
            assert open(path + formats.SOURCE_SUFFIX).read() == f"s3://{bucket}/{f['key']}\n"
            if previous:
                deadline = time.monotonic() + 5
                while (directory / previous).exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert not (directory / previous).exists()
                assert not (directory / (previous + formats.SOURCE_SUFFIX)).exists()
            previous = path.rsplit("/", 1)[1]
    finally:
        prefetcher.stop()


def test_start_clears_what_an_earlier_run_left(s3_client, bucket, tmp_path):
    """Its data files, partial downloads and position; its kept files too (another run's data)."""
    files = _upload_records(s3_client, bucket, tmp_path, [1])
    directory = tmp_path / "stream"
    directory.mkdir()
    for stale in ("7.data", "7.data" + formats.SOURCE_SUFFIX, ".3.data.part", stream.POSITION):
        (directory / stale).write_bytes(b"old")
    (directory / stream.KEPT).mkdir()
    (directory / stream.KEPT / "0").write_bytes(b"another run's file 0")
    prefetcher = stream.Prefetcher(s3_client, bucket, files, directory, ahead=1, keep_bytes=1 << 20).start()
    try:
        assert not (directory / "7.data").exists() and not (directory / ".3.data.part").exists()
        assert not (directory / ("7.data" + formats.SOURCE_SUFFIX)).exists()
        deadline = time.monotonic() + 10
        while not (directory / stream.KEPT / "0").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (directory / stream.KEPT / "0").read_bytes() == \
            s3_client.get_object(Bucket=bucket, Key=files[0]["key"])["Body"].read()
        assert stream.read_position(directory) is None
    finally:
        prefetcher.stop()


def test_a_failed_download_is_reported_and_the_reader_times_out_naming_its_file(s3_client, bucket, tmp_path):
    files = _upload_records(s3_client, bucket, tmp_path, [1, 1, 1])
    files[1] = {"key": "d/missing.tfrecord", "size": 1, "etag": ""}
    directory = tmp_path / "stream"
    prefetcher = stream.Prefetcher(s3_client, bucket, files, directory, ahead=3).start()
    missing_seq = [f["key"] for f in prefetcher.epoch_order(0)].index("d/missing.tfrecord")
    deadline = time.monotonic() + 10
    while prefetcher.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not prefetcher.running()
    assert "s3://" + bucket + "/d/missing.tfrecord" in prefetcher.stats()["error"]
    names = stream.file_names(str(directory), poll_ms=10, wait_s=0.2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{directory}/{missing_seq}.data did not appear"):
        list(names.as_numpy_iterator())


def test_stop_ends_a_waiting_prefetcher_promptly(s3_client, bucket, tmp_path):
    files = _upload_records(s3_client, bucket, tmp_path, [1, 1])
    prefetcher = stream.Prefetcher(s3_client, bucket, files, tmp_path / "stream", ahead=1).start()
    deadline = time.monotonic() + 10
    while prefetcher.stats()["files"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    prefetcher.stop()
    assert not prefetcher.running() and time.monotonic() - started < 1
    assert prefetcher.stats()["files"] == 2     # 0.data and 1.data: never more than ahead past position 0


def _upload_csv(client, bucket, key, rows):
    body = "a,target,b\n" + "".join(f"{a},{t},{b}\n" for a, t, b in rows)
    client.put_object(Bucket=bucket, Key=key, Body=body.encode())
    return {"key": key, "size": len(body), "etag": ""}


def test_test_batches_cross_files_one_file_on_disk_at_a_time(s3_client, bucket, tmp_path):
    rows = [(i, i % 2, -i) for i in range(15)]
    files = [_upload_csv(s3_client, bucket, "t/1.csv", rows[:5]), _upload_csv(s3_client, bucket, "t/2.csv", rows[5:12]),
             _upload_csv(s3_client, bucket, "t/3.csv", rows[12:])]
    read = formats.reader("csv", columns=["a", "target", "b"], label="target")
    directory = tmp_path / "test"
    batches, on_disk = [], []
    for x, y in stream.test_batches(s3_client, bucket, files, read, directory, 4):
        batches.append((x, y))
        on_disk.append(len([p for p in directory.iterdir() if not p.name.endswith(formats.SOURCE_SUFFIX)]))
    assert [len(x) for x, _ in batches] == [4, 4, 4, 3]
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    assert x.tolist() == [[a, b] for a, _, b in rows] and y.tolist() == [t for _, t, _ in rows]
    assert max(on_disk) <= 1 and list(directory.iterdir()) == []


def test_a_bad_cell_in_a_streamed_or_test_file_names_its_object(s3_client, bucket, tmp_path):
    """The reader reads local copies; its error names the object in S3 (a worker's stream and the chief's test
    batches), not the copy's path."""
    files = [_upload_csv(s3_client, bucket, "t/ok.csv", [(1, 0, 2)]),
             _upload_csv(s3_client, bucket, "t/bad.csv", [(1, 0, 2), (3, 1, "N/A")])]
    read = formats.reader("csv", columns=["a", "target", "b"], label="target")
    directory = tmp_path / "stream"
    prefetcher = stream.Prefetcher(s3_client, bucket, files, directory, ahead=2, poll_s=0.01).start()
    try:
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            list(read(stream.file_names(str(directory), poll_ms=5, wait_s=10)).take(4).as_numpy_iterator())
    finally:
        prefetcher.stop()
    assert f"s3://{bucket}/t/bad.csv: line 3, column b holds N/A, not a number" in str(err.value)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        list(stream.test_batches(s3_client, bucket, files, read, tmp_path / "test", 4))
    assert f"s3://{bucket}/t/bad.csv: line 3, column b holds N/A" in str(err.value)
    assert list((tmp_path / "test").iterdir()) == []


def test_test_batches_raise_the_transfer_error(s3_client, bucket, tmp_path):
    files = [{"key": "t/none.csv", "size": 1, "etag": ""}]
    read = formats.reader("csv", columns=["a", "target"], label="target")
    with pytest.raises(s3io.TransferError, match="t/none.csv"):
        list(stream.test_batches(s3_client, bucket, files, read, tmp_path, 4))


def test_the_keep_budget_is_at_most_a_quarter_of_the_free_disk(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100 << 30, 0, 40 << 30))
    assert stream.keep_budget(tmp_path / "stream") == stream.KEEP_BYTES == 1 << 30
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100 << 30, 0, 2 << 30))
    assert stream.keep_budget(tmp_path / "stream") == 512 << 20
    assert stream.keep_budget(tmp_path / "stream", sharers=4) == 128 << 20      # 4 training tasks, one disk


def test_a_file_system_without_hard_links_streams_every_epoch(s3_client, bucket, tmp_path, monkeypatch):
    """The first link fails: nothing is kept, and every epoch's files are downloaded as without a budget."""
    import errno

    def no_links(source, name):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(stream.os, "link", no_links)
    files = _upload_records(s3_client, bucket, tmp_path, [2, 3])
    directory = tmp_path / "stream"
    prefetcher = stream.Prefetcher(s3_client, bucket, files, directory, ahead=1, keep_bytes=1 << 20)
    assert prefetcher.keeps
    prefetcher.start()
    try:
        read = formats.reader("tfrecord", decode=lambda record: (record, tf.constant(0)))
        records = [r for r, _ in read(stream.file_names(str(directory), poll_ms=5, wait_s=30)).take(3 * 5)
                   .as_numpy_iterator()]
    finally:
        prefetcher.stop()
    assert sorted(records) == sorted(3 * [f"{i}:{j}".encode() for i, n in enumerate([2, 3]) for j in range(n)])
    stats = prefetcher.stats()
    assert not prefetcher.keeps and "reused" not in stats and stats["files"] >= 6 and stats["error"] is None
    assert not (directory / stream.KEPT).exists()
