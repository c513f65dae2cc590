"""TFRecord files (``data.format: tfrecord``): the model module's ``decode(record) -> (features, label)``
mapped over each file's records. Files here are uncompressed."""

from __future__ import annotations

from collections.abc import Callable

from . import Format

HEADER_BYTES = 12     # a TFRecord file starts with its first record's length (8 bytes) and its checksum (4)


class TfRecord(Format):
    name = "tfrecord"
    summary = "read with the model module's decode(record)"
    needs_decode = True
    parsing = "decode()"

    def start(self, s3_client, bucket: str, key: str) -> None:
        """Raise ValueError naming ``s3://bucket/key`` unless it starts as a TFRecord file does: a record's
        length and that length's masked CRC-32C (one ranged GET of 12 bytes)."""
        from ..sources import first_bytes

        head = first_bytes(s3_client, bucket, key, HEADER_BYTES)
        if len(head) < HEADER_BYTES or masked_crc32c(head[:8]) != int.from_bytes(head[8:12], "little"):
            raise ValueError(f"s3://{bucket}/{key}: not a TFRecord file (its first {HEADER_BYTES} bytes are no "
                             f"record's length and checksum); data.format is tfrecord")

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


def _reader(decode: Callable) -> Callable:
    import tensorflow as tf

    def read(filenames):
        examples = filenames.flat_map(tf.data.TFRecordDataset).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        spec = examples.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise ValueError(f"decode(record) must return (features, label), not {spec}")
        return examples

    return read
