"""The formats of data files in object storage (``data.format``): one module here per format.

Each module defines ``FORMAT``, a :class:`Format`; this package finds them (every module in it), so a new
format is one new module here and nothing else: the cluster file's ``data.format`` (its allowed values and
description), the controller's check of the files and the workers' reader all go through :func:`get`.

A format has these parts, used in this order (the third is optional):

* :meth:`Format.start`, on the controller before anything runs: how one file must start, read with one
  ranged GET (:func:`tfc_harness.sources.first_bytes`), no TensorFlow. Returns what the file's start tells
  (CSV: its header's column names and its first row; TFRecord: its first bytes up to the end of its first
  record, or its header alone when that record is longer than one GET reads) or None.
* :meth:`Format.columns`, over every file's start: whether they agree (one header for all) and what the
  reader needs to know of them (the column names, or None).
* :meth:`Format.first_record_file`, from one file's start (and a ranged GET where the start does not hold
  it): a file of this format holding only that file's first record, which the controller's check reads with
  the reader (so an error there names the file), or None (the format's default: the file's records are
  first read on the nodes).
* :meth:`Format.reader`: a function of a ``tf.data.Dataset`` of local file names returning unbatched
  ``(features, label)`` examples, built from TensorFlow graph ops only, so it can run on a remote worker
  (:mod:`tfc_harness.stream`). Files are read one after another, each to its end before the next name is
  taken: the stream's reader position relies on that. An error naming a file names it by
  :func:`shown_name`: the object it was downloaded from, not the local copy's path.

Nothing here imports TensorFlow, boto3 or numpy at import time: the controller's configuration reads
:func:`names` and :func:`describe`.
"""

from __future__ import annotations

import abc
import importlib
import pkgutil
from collections.abc import Callable

from ..errors import is_tensorflow_error


class Format(abc.ABC):
    """One data format. Subclasses set the attributes and implement :meth:`start` and :meth:`reader` (and
    :meth:`columns` where the files' starts must agree)."""

    #: ``data.format``'s value
    name: str = ""
    #: what it is, for ``data.format``'s description: "csv (a header line, ...)"
    summary: str = ""
    #: whether the model module needs ``decode(record) -> (features, label)`` for it
    needs_decode: bool = False
    #: whether ``data.label`` names one of its columns
    named_columns: bool = False
    #: what turns a file's records into examples, for errors: "decode()", "CSV parsing"
    parsing: str = ""
    #: what one of its records is called, for errors: "record", "row"
    record: str = "record"
    #: texts that only its reader's errors about a file's content hold (a cell that is not a number): a task
    #: failing with one would read the same file again when restarted, and fail the same way
    content_errors: tuple[str, ...] = ()

    @abc.abstractmethod
    def start(self, s3_client, bucket: str, key: str) -> object:
        """Check how ``s3://bucket/key`` starts (one ranged GET); ValueError naming the file if it does not
        start as this format's files do. Returns what :meth:`columns` and :meth:`first_record_file` need of it
        (or None)."""

    def columns(self, bucket: str, keys: list[str], starts: list, label: str | None) -> list[str] | None:
        """Every file's :meth:`start` (``keys`` and ``starts`` in the same order) agree, and the label is among
        them where the format names columns (ValueError naming the file). Returns the column names the reader
        takes (None for a format without named columns)."""
        return None

    def first_record_file(self, s3_client, bucket: str, key: str, start: object) -> bytes | None:
        """The bytes of a file of this format holding only the first record of ``s3://bucket/key``, whose
        :meth:`start` returned ``start`` (None: not read by the controller's check, so the file's records are
        first read on the nodes)."""
        return None

    def first_record_summary(self, path) -> str | None:
        """What the first record of the local file ``path`` holds, for an error in reading it that the user's
        code made (``decode``'s schema), e.g. its features' names, types and sizes; None: nothing to say."""
        return None

    @abc.abstractmethod
    def reader(self, *, decode: Callable | None, columns: list[str] | None, label: str | None) -> Callable:
        """A function ``filenames -> dataset of (features, label)`` (see the package's docstring); ValueError
        when the arguments do not suit the format."""


#: beside a local copy of a file in object storage (``<path>.source``): the object's ``s3://bucket/key``,
#: written by :mod:`tfc_harness.stream` before the copy appears, so a reader's error can name the object
SOURCE_SUFFIX = ".source"


def shown_name(path):
    """What an error names for the local file ``path`` (a string tensor): the object in ``<path>.source`` when
    that is there, else ``path``. Graph ops only; build it where the error is raised, not on every file."""
    import tensorflow as tf

    source = tf.strings.join([path, SOURCE_SUFFIX])
    return tf.cond(tf.size(tf.io.matching_files(source)) > 0,
                   lambda: tf.strings.strip(tf.io.read_file(source)), lambda: tf.identity(path))


def bad_content(exc: BaseException) -> bool:
    """Whether ``exc`` is a TensorFlow op error raised by a reader's check of a file's content (one of the
    formats' :attr:`Format.content_errors`): the file is the same when the task starts again."""
    if not is_tensorflow_error(exc):
        return False
    text = str(exc)
    return any(mark in text for fmt in _FORMATS.values() for mark in fmt.content_errors)


def _discover() -> dict[str, Format]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        fmt = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FORMAT", None)
        if isinstance(fmt, Format):
            if fmt.name in found:
                raise RuntimeError(f"data format {fmt.name!r} is defined twice ({info.name})")
            found[fmt.name] = fmt
    return found


_FORMATS = _discover()
#: every format's name, sorted
NAMES = tuple(sorted(_FORMATS))


def names() -> tuple[str, ...]:
    return NAMES


def get(name: str) -> Format:
    """The format called ``name``; ValueError naming the ones there are."""
    try:
        return _FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown data format {name!r}; expected one of {', '.join(NAMES)}") from None


def describe() -> str:
    """``data.format``'s description: each format and what it is."""
    return " or ".join(f"{fmt.name} ({fmt.summary})" for fmt in _FORMATS.values())


def reader(fmt: str, *, decode: Callable | None = None, columns: list[str] | None = None,
           label: str | None = None) -> Callable:
    """:meth:`Format.reader` of the format called ``fmt``."""
    return get(fmt).reader(decode=decode, columns=columns, label=label)
