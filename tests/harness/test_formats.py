"""CSV and TFRecord readers: values, header and cell checks, graph ops only."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfc_harness import formats  # noqa: E402
from tfc_harness.formats import csv_files  # noqa: E402

COLUMNS = ["a", "target", "b"]


def _write(path, text: str):
    path.write_text(text)
    return str(path)


def _read(read, paths):
    return list(read(tf.data.Dataset.from_tensor_slices(paths)).as_numpy_iterator())


def test_csv_features_in_header_order_without_the_label(tmp_path):
    one = _write(tmp_path / "1.csv", "a,target,b\n1,10,2\n3.5,11,-4e2\n")
    two = _write(tmp_path / "2.csv", "\ufeff a ,\"target\", b\r\n inf ,12,0x10\r\n")
    read = formats.reader("csv", columns=COLUMNS, label="target")
    rows = _read(read, [one, two])
    assert [(x.tolist(), float(y)) for x, y in rows] == [([1.0, 2.0], 10.0), ([3.5, -400.0], 11.0),
                                                         ([float("inf"), 16.0], 12.0)]
    spec = read(tf.data.Dataset.from_tensor_slices([one])).element_spec
    assert spec == (tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.float32))


def test_csv_reads_more_rows_than_a_chunk(tmp_path):
    n = csv_files.CHUNK * 2 + 7
    lines = "".join(f"{i},{i % 3},{-i}\n" for i in range(n))
    path = _write(tmp_path / "big.csv", "a,target,b\n" + lines)
    rows = _read(formats.reader("csv", columns=COLUMNS, label="target"), [path])
    x = np.stack([r[0] for r in rows])
    assert x.shape == (n, 2) and x[:, 0].tolist() == list(range(n)) and rows[-1][1] == (n - 1) % 3


@pytest.mark.parametrize("cell, shown", [("x", "holds x, not a number"), ("", "is empty"), (" ", "is empty"),
                                         ("1,5", None)])
def test_csv_non_numeric_cell_names_file_line_and_column(tmp_path, cell, shown):
    good = _write(tmp_path / "good.csv", "a,target,b\n1,2,3\n")
    bad = _write(tmp_path / "bad.csv", f"a,target,b\n1,2,3\n4,5,6\n7,8,{cell}\n")
    read = formats.reader("csv", columns=COLUMNS, label="target")
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        _read(read, [good, bad])
    if shown is None:   # an extra field: CsvDataset's own message
        assert "Expect 3 fields but have more in record" in str(err.value)
        return
    assert f"{bad}: line 4, column b {shown} (every CSV column must hold numbers)" in str(err.value)


def test_a_copy_of_an_object_is_named_by_the_object_in_errors(tmp_path):
    """A file with ``<path>.source`` beside it (the stream's copies) is named by what that holds: the object."""
    bad = _write(tmp_path / "7.data", "a,target,b\n1,2,3\n4,5,N/A\n")
    (tmp_path / f"7.data{formats.SOURCE_SUFFIX}").write_text("s3://data/set/part-2.csv\n")
    read = formats.reader("csv", columns=COLUMNS, label="target")
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        _read(read, [bad])
    assert "s3://data/set/part-2.csv: line 3, column b holds N/A, not a number" in str(err.value)
    assert "7.data" not in str(err.value)
    swapped = _write(tmp_path / "8.data", "b,target,a\n1,2,3\n")
    (tmp_path / f"8.data{formats.SOURCE_SUFFIX}").write_text("s3://data/set/part-3.csv\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match="s3://data/set/part-3.csv: header b,target,a differs"):
        _read(read, [swapped])


def test_a_file_the_reader_refused_fails_a_restarted_task_the_same_way():
    """A TensorFlow op error with a reader's own words about a file's content: a restart would read it again."""
    bad = tf.errors.InvalidArgumentError(None, None, "assertion failed: [s3://d/p.csv: line 3, column b holds x, "
                                         "not a number" + csv_files.NOT_NUMBERS + "]")
    assert formats.bad_content(bad)
    assert formats.bad_content(tf.errors.InvalidArgumentError(None, None, "s3://d/p.csv: header b,a"
                                                              + csv_files.HEADER_DIFFERS + "a,b"))
    assert not formats.bad_content(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [32] vs. [16]"))
    assert not formats.bad_content(ValueError("line 3" + csv_files.NOT_NUMBERS))    # not a reader's op error


def test_csv_file_with_another_header_is_refused(tmp_path):
    one = _write(tmp_path / "1.csv", "a,target,b\n1,2,3\n")
    swapped = _write(tmp_path / "2.csv", "b,target,a\n1,2,3\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{swapped}: header b,target,a differs"):
        _read(formats.reader("csv", columns=COLUMNS, label="target"), [one, swapped])
    empty = _write(tmp_path / "3.csv", "")
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{empty}: header  differs"):
        _read(formats.reader("csv", columns=COLUMNS, label="target"), [empty])


def test_csv_problems():
    assert csv_files.problems(["a", "b", "target"], "target") == []
    assert csv_files.problems([], "target") == ["no columns (the CSV header is empty)"]
    assert csv_files.problems(["a", "", "a", "a"], "y") == [
        "column 2 has an empty name", "column name 'a' appears 3 times",
        "label column 'y' (data.label) is not in the header (a, , a, a)"]
    assert csv_files.problems(["a", "b"], None) == ["no label column named (data.label)"]
    assert csv_files.problems(["y"], "y") == ["no feature columns besides the label 'y'"]


def test_reader_arguments():
    with pytest.raises(ValueError, match="unknown data format 'parquet'; expected one of csv, tfrecord"):
        formats.reader("parquet")
    with pytest.raises(ValueError, match="needs decode"):
        formats.reader("tfrecord")
    with pytest.raises(ValueError, match="columns and label are for csv"):
        formats.reader("tfrecord", decode=lambda r: (r, r), label="y")
    with pytest.raises(ValueError, match=r"csv data: label column 'y' \(data.label\) is not in the header"):
        formats.reader("csv", columns=["a", "b"], label="y")
    with pytest.raises(ValueError, match="decode is for tfrecord"):
        formats.reader("csv", decode=lambda r: (r, r), columns=["a", "y"], label="y")


def _write_tfrecord(path, rows):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for x, y in rows:
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))})).SerializeToString())
    return str(path)


def _decode(record):
    row = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([2], tf.float32),
                                              "y": tf.io.FixedLenFeature([], tf.int64)})
    return row["x"], row["y"]


def test_tfrecord_maps_decode_over_every_file(tmp_path):
    one = _write_tfrecord(tmp_path / "1.tfrecord", [([1, 2], 0), ([3, 4], 1)])
    two = _write_tfrecord(tmp_path / "2.tfrecord", [([5, 6], 2)])
    rows = _read(formats.reader("tfrecord", decode=_decode), [one, two])
    assert [(x.tolist(), int(y)) for x, y in rows] == [([1, 2], 0), ([3, 4], 1), ([5, 6], 2)]


def test_tfrecord_decode_must_return_a_pair(tmp_path):
    one = _write_tfrecord(tmp_path / "1.tfrecord", [([1, 2], 0)])
    with pytest.raises(ValueError, match=r"must return \(features, label\)"):
        formats.reader("tfrecord", decode=lambda r: r)(tf.data.Dataset.from_tensors(one))


def graph_ops(concrete) -> set[str]:
    """Every op type in a concrete function's graph and in all the functions it refers to."""
    graph = concrete.graph.as_graph_def()
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
    return ops


@pytest.mark.parametrize("fmt, kwargs", [("csv", {"columns": COLUMNS, "label": "target"}),
                                         ("tfrecord", {"decode": _decode})])
def test_readers_are_graph_ops_only(fmt, kwargs):
    read = formats.reader(fmt, **kwargs)
    concrete = tf.function(lambda: tf.data.experimental.to_variant(
        read(tf.data.Dataset.from_tensors("x")))).get_concrete_function()
    ops = graph_ops(concrete)
    assert "FlatMapDataset" in ops and not ops & {"PyFunc", "EagerPyFunc", "PyFuncStateless"}
