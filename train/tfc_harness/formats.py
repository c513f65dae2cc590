"""Readers that turn a dataset of local file names into unbatched ``(features, label)`` examples.

:func:`reader` returns a function of a ``tf.data.Dataset`` of file names, built from TensorFlow graph ops
only, so it can run on a remote worker (:mod:`tfc_harness.stream`).  Files are read one after another,
each to its end before the next name is taken: the stream's reader position relies on that.

* ``tfrecord``: the model's ``decode(record) -> (features, label)`` mapped over each file's records.
* ``csv``: every file starts with the same header line (checked per file against ``columns``); the label
  column is a float32 scalar and every other column, in header order, one float32 in the features vector.
  Cells are read as text and converted in chunks of :data:`CSV_CHUNK` rows, so that a cell that is not a
  number fails with the file, line, column and value instead of TensorFlow's bare "Field 1 in record is
  not a valid float".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

FORMATS = ("tfrecord", "csv")
CSV_CHUNK = 512
# What TensorFlow's string-to-float conversion accepts (decimal, exponent, inf/nan, hex), blanks around.
NUMBER = (r"\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|0[xX][0-9a-fA-F]+"
          r"|(?i:inf|infinity|nan))\s*")


def reader(fmt: str, *, decode: Callable | None = None, columns: list[str] | None = None,
           label: str | None = None) -> Callable:
    """A function ``filenames -> dataset of (features, label)`` for ``fmt`` (see the module docstring)."""
    if fmt == "tfrecord":
        if columns is not None or label is not None:
            raise ValueError("tfrecord data: columns and label are for csv data (decode gives the label)")
        if not callable(decode):
            raise ValueError("tfrecord data needs decode(record) -> (features, label) in the model module")
        return _tfrecord_reader(decode)
    if fmt == "csv":
        if decode is not None:
            raise ValueError("csv data: decode is for tfrecord data (csv columns are read as numbers)")
        problems = csv_problems(columns, label)
        if problems:
            raise ValueError("csv data: " + "; ".join(problems))
        return _csv_reader(list(columns), label)
    raise ValueError(f"unknown data format {fmt!r}; expected one of {', '.join(FORMATS)}")


def csv_problems(columns: list[str] | None, label: str | None) -> list[str]:
    """What is wrong with a CSV header and label: no columns, empty or duplicate names, missing label."""
    if not columns:
        return ["no columns (the CSV header is empty)"]
    problems = [f"column {i} has an empty name" for i, name in enumerate(columns, 1) if not name]
    problems += [f"column name {name!r} appears {n} times" for name, n in Counter(columns).items()
                 if n > 1 and name]
    if not label:
        problems.append("no label column named (data.label)")
    elif label not in columns:
        problems.append(f"label column {label!r} is not in the header ({', '.join(columns)})")
    elif len(columns) < 2:
        problems.append(f"no feature columns besides the label {label!r}")
    return problems


def _tfrecord_reader(decode: Callable) -> Callable:
    import tensorflow as tf

    def read(filenames):
        examples = filenames.flat_map(tf.data.TFRecordDataset).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        spec = examples.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise ValueError(f"decode(record) must return (features, label), not {spec}")
        return examples

    return read


def _csv_reader(columns: list[str], label: str) -> Callable:
    def read(filenames):
        return filenames.flat_map(lambda path: _csv_file(path, columns, label))

    return read


def _csv_file(path, columns: list[str], label: str):
    """One CSV file's examples, after checking its header."""
    import tensorflow as tf

    with tf.control_dependencies([_check_header(path, columns)]):
        path = tf.identity(path)
    rows = tf.data.experimental.CsvDataset(path, [""] * len(columns), header=True)
    return (rows.enumerate(start=2).batch(CSV_CHUNK)
            .map(lambda lines, cells: _to_numbers(path, columns, label, lines, cells))
            .unbatch())


def _check_header(path, columns: list[str]):
    """An op failing when the first line of ``path`` does not name ``columns`` (BOM, blanks, quotes aside)."""
    import tensorflow as tf

    line = tf.data.TextLineDataset(path).take(1).reduce(tf.constant(""), lambda _, line: line)
    line = tf.strings.regex_replace(line, "^\ufeff", "")
    names = tf.strings.regex_replace(tf.strings.strip(tf.strings.split(line, ",")), '^"|"$', "")
    expected = ",".join(columns)
    same = tf.equal(tf.strings.reduce_join(names, separator=","), expected)
    message = tf.strings.join([path, ": header ", line, " differs from the first file's: ", expected])
    return tf.debugging.Assert(same, [message])


def _to_numbers(path, columns: list[str], label: str, lines, cells):
    """A chunk of text rows -> (features [rows, n-1], labels [rows]), float32; fails on a non-number."""
    import tensorflow as tf

    cells = tf.stack(cells, axis=1)
    ok = tf.strings.regex_full_match(cells, NUMBER)
    all_ok = tf.reduce_all(ok)
    checked = tf.cond(all_ok, lambda: tf.constant(True),
                      lambda: _not_a_number(path, columns, lines, cells, ok, all_ok))
    with tf.control_dependencies([checked]):
        values = tf.strings.to_number(cells, tf.float32)
    index = columns.index(label)
    features = tf.gather(values, [i for i in range(len(columns)) if i != index], axis=1)
    return features, values[:, index]


def _not_a_number(path, columns: list[str], lines, cells, ok, all_ok):
    import tensorflow as tf

    row, col = tf.unstack(tf.where(tf.logical_not(ok))[0])
    cell = cells[row, col]
    what = tf.where(tf.equal(tf.strings.strip(cell), ""), " is empty",
                    tf.strings.join([" holds ", cell, ", not a number"]))
    message = tf.strings.join([path, ": line ", tf.strings.as_string(lines[row]), ", column ",
                               tf.gather(tf.constant(columns), col), what,
                               " (every CSV column must hold numbers)"])
    with tf.control_dependencies([tf.debugging.Assert(all_ok, [message])]):
        return tf.identity(all_ok)
