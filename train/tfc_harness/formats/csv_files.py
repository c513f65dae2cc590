"""CSV files (``data.format: csv``): a header line, then rows of numbers.

Every file starts with the same header line (checked per file against ``columns``); the label column is a
float32 scalar and every other column, in header order, one float32 in the features vector. Cells are read
as text and converted in chunks of :data:`CHUNK` rows, so that a cell that is not a number fails with the
file, line, column and value instead of TensorFlow's bare "Field 1 in record is not a valid float".
The controller's check reads each file's header and first row from one ranged GET (:class:`CsvStart`).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from . import Format, shown_name

CHUNK = 512
#: the ends of the reader's errors about a file (Csv.content_errors)
HEADER_DIFFERS = " differs from the first file's: "
NOT_NUMBERS = " (every CSV column must hold numbers)"
HEADER_BYTES = 64 * 1024  # a CSV header line longer than this is refused
# What TensorFlow's string-to-float conversion accepts (decimal, exponent, inf/nan, hex), blanks around.
NUMBER = (r"\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|0[xX][0-9a-fA-F]+"
          r"|(?i:inf|infinity|nan))\s*")


class CsvStart(NamedTuple):
    """What a CSV file's first :data:`HEADER_BYTES` tell: its header's column names and ``head``, the bytes of
    its header line and first row (a CSV file of that row alone), or None where the file has no row or its
    first row does not end within those bytes."""
    columns: list[str]
    head: bytes | None


class Csv(Format):
    name = "csv"
    summary = "a header line naming the columns, data.label among them; every other column a number"
    named_columns = True
    parsing = "CSV parsing"
    record = "row"
    content_errors = (HEADER_DIFFERS, NOT_NUMBERS)

    def start(self, s3_client, bucket: str, key: str) -> CsvStart:
        return read_start(s3_client, bucket, key)

    def columns(self, bucket: str, keys: list[str], starts: list[CsvStart], label: str | None) -> list[str]:
        first = starts[0].columns
        for key, other in zip(keys, starts, strict=True):
            found = problems(other.columns, label)     # a file without the label: said so, not "differs"
            if found:
                raise ValueError(f"s3://{bucket}/{key}: " + "; ".join(found))
            if other.columns != first:
                raise ValueError(f"s3://{bucket}/{key}: its header {other.columns} differs from {keys[0]}'s {first}")
        return first

    def first_record_file(self, s3_client, bucket: str, key: str, start: CsvStart) -> bytes | None:
        """The header line and the first row, from :meth:`start`'s GET (no other)."""
        return start.head

    def reader(self, *, decode: Callable | None, columns: list[str] | None, label: str | None) -> Callable:
        if decode is not None:
            raise ValueError("csv data: decode is for tfrecord data (csv columns are read as numbers)")
        found = problems(columns, label)
        if found:
            raise ValueError("csv data: " + "; ".join(found))
        return _reader(list(columns), label)


FORMAT = Csv()


def read_start(s3_client, bucket: str, key: str) -> CsvStart:
    """The header of ``s3://bucket/key`` and its first row (one ranged GET of :data:`HEADER_BYTES`);
    ValueError naming the file when its first line is no CSV header."""
    from ..sources import first_bytes

    what = f"s3://{bucket}/{key}"
    head = first_bytes(s3_client, bucket, key, HEADER_BYTES)
    line, newline, rest = head.partition(b"\n")
    if not newline and len(head) >= HEADER_BYTES:
        raise ValueError(f"{what}: no end of the header line in its first {HEADER_BYTES} bytes")
    text = line.decode("utf-8-sig", errors="replace").rstrip("\r")
    if any(c < " " and c != "\t" for c in text):
        raise ValueError(f"{what}: its first line is not text (binary bytes: not a CSV file; a TFRecord file? "
                         f"data.format is csv)")
    if "\ufffd" in text:
        raise ValueError(f"{what}: its header is not UTF-8 text (re-save the file as UTF-8)")
    if not text.strip():
        raise ValueError(f"{what}: the first line (the CSV header) is empty")
    return CsvStart([name.strip() for name in next(csv.reader([text]))],
                    _first_row(line, rest, whole=len(head) < HEADER_BYTES))


def _first_row(line: bytes, rest: bytes, whole: bool) -> bytes | None:
    """The header ``line`` and the first row of ``rest`` (what follows the header's newline) as a CSV file of
    that row, or None: no row, a row that may go on past the bytes read (``whole``: the GET read the file to
    its end), or one whose quotes are not closed on its line (a quoted cell holding a newline)."""
    row, newline, _ = rest.partition(b"\n")
    if not row.strip() or not (newline or whole) or row.count(b'"') % 2:
        return None
    return line + b"\n" + row + b"\n"


def problems(columns: list[str] | None, label: str | None) -> list[str]:
    """What is wrong with a CSV header and label: no columns, empty or duplicate names, missing label."""
    if not columns:
        return ["no columns (the CSV header is empty)"]
    problems = [f"column {i} has an empty name" for i, name in enumerate(columns, 1) if not name]
    problems += [f"column name {name!r} appears {n} times" for name, n in Counter(columns).items()
                 if n > 1 and name]
    if not label:
        problems.append("no label column named (data.label)")
    elif label not in columns:
        problems.append(f"label column {label!r} (data.label) is not in the header ({', '.join(columns)})")
    elif len(columns) < 2:
        problems.append(f"no feature columns besides the label {label!r}")
    return problems


def _reader(columns: list[str], label: str) -> Callable:
    def read(filenames):
        return filenames.flat_map(lambda path: _file(path, columns, label))

    return read


def _file(path, columns: list[str], label: str):
    """One CSV file's examples, after checking its header."""
    import tensorflow as tf

    with tf.control_dependencies([_check_header(path, columns)]):
        path = tf.identity(path)
    rows = tf.data.experimental.CsvDataset(path, [""] * len(columns), header=True)
    return (rows.enumerate(start=2).batch(CHUNK)
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

    def differs():
        message = tf.strings.join([shown_name(path), ": header ", line, HEADER_DIFFERS, expected])
        with tf.control_dependencies([tf.debugging.Assert(same, [message])]):
            return tf.identity(same)

    return tf.cond(same, lambda: tf.constant(True), differs)


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
    message = tf.strings.join([shown_name(path), ": line ", tf.strings.as_string(lines[row]), ", column ",
                               tf.gather(tf.constant(columns), col), what,
                               NOT_NUMBERS])
    with tf.control_dependencies([tf.debugging.Assert(all_ok, [message])]):
        return tf.identity(all_ok)
