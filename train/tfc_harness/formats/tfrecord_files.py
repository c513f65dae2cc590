"""TFRecord files (``data.format: tfrecord``): the model module's ``decode(record) -> (features, label)``
mapped over each file's records. Files here are uncompressed."""

from __future__ import annotations

from collections.abc import Callable

from . import Format

HEADER_BYTES = 12     # a TFRecord file starts with its first record's length (8 bytes) and its checksum (4)
START_BYTES = 4096    # the first GET: the header, and the whole first record when it is this small
MAX_FIRST_RECORD = 4 * 2**20    # a longer first record is not read by the controller's check


class TfRecord(Format):
    name = "tfrecord"
    summary = "read with the model module's decode(record)"
    needs_decode = True
    parsing = "decode()"

    def start(self, s3_client, bucket: str, key: str) -> bytes:
        """Raise ValueError naming ``s3://bucket/key`` unless it starts as a TFRecord file does: a record's
        length and that length's masked CRC-32C (one ranged GET of :data:`START_BYTES`).  Returns the bytes
        up to the end of the first record when they hold all of it, else the header alone
        (:meth:`first_record_file` reads the record then): at most :data:`START_BYTES` are kept a file."""
        from ..sources import first_bytes

        head = first_bytes(s3_client, bucket, key, START_BYTES)
        if len(head) < HEADER_BYTES or masked_crc32c(head[:8]) != int.from_bytes(head[8:12], "little"):
            raise ValueError(f"s3://{bucket}/{key}: not a TFRecord file (its first {HEADER_BYTES} bytes are no "
                             f"record's length and checksum); data.format is tfrecord")
        framed = _framed(head)
        return head[:framed] if framed <= len(head) else head[:HEADER_BYTES]

    def first_record_file(self, s3_client, bucket: str, key: str, start: bytes) -> bytes | None:
        """The first record as it is framed in the file (its length, checksums and data: a TFRecord file of
        that record alone; cut short where the file ends inside it), read with a second ranged GET when
        :meth:`start` did not hold all of it; None when it is longer than :data:`MAX_FIRST_RECORD`."""
        from ..sources import first_bytes

        if int.from_bytes(start[:8], "little") > MAX_FIRST_RECORD:
            return None
        framed = _framed(start)
        if len(start) < framed:     # the header alone: the record's bytes (what there is of them, in a cut file)
            return first_bytes(s3_client, bucket, key, framed)
        return start

    def first_record_summary(self, path) -> str | None:
        """``its first record is a tf.train.Example of cls (int64, 1 value), feat (float, 8 values)`` where it is
        one (a decode() whose feature spec names another feature, type or size fails on it); else None."""
        import tensorflow as tf

        try:
            record = next(iter(tf.data.TFRecordDataset(str(path)).take(1))).numpy()
            features = tf.train.Example.FromString(record).features.feature
        except Exception:  # noqa: BLE001 - no summary rather than another error in place of the one that matters
            return None
        parts = []
        for name, feature in sorted(features.items()):
            kind = feature.WhichOneof("kind")
            count = len(getattr(feature, kind).value) if kind else 0
            parts.append(f"{name} ({(kind or 'no').removesuffix('_list')}, {count} value{'' if count == 1 else 's'})")
        return f"its first record is a tf.train.Example of {', '.join(parts)}" if parts else None

    def reader(self, *, decode: Callable | None, columns: list[str] | None, label: str | None) -> Callable:
        if columns is not None or label is not None:
            raise ValueError("tfrecord data: columns and label are for csv data (decode gives the label)")
        if not callable(decode):
            raise ValueError("tfrecord data needs decode(record) -> (features, label) in the model module")
        return _reader(decode)


FORMAT = TfRecord()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated right by 15 bits plus a constant."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _framed(head: bytes) -> int:
    """The bytes of a TFRecord file's first record, framed (its length, that length's checksum, the data and
    the data's checksum), from the file's first bytes."""
    return HEADER_BYTES + int.from_bytes(head[:8], "little") + 4


def _reader(decode: Callable) -> Callable:
    import tensorflow as tf

    def read(filenames):
        examples = filenames.flat_map(tf.data.TFRecordDataset).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        spec = examples.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise ValueError(f"decode(record) must return (features, label), not {spec}")
        return examples

    return read
