"""A streaming task's shuffle buffer: about SHUFFLE_BYTES of decoded examples, and no more than about one epoch
of the training task with the fewest bytes of files (a larger buffer is filled from many epochs of the same
files, downloaded again each epoch, before the first step)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from tfc_harness import inputs


def file_input(test_size: int, test_rows: int, train_sizes: list[list[int]], row_bytes: int = 44):
    """A FileInput with its files' sizes given and its test file's examples stubbed (no S3, no TensorFlow)."""
    source = inputs.FileInput.__new__(inputs.FileInput)
    source.files = SimpleNamespace(test=[SimpleNamespace(size=test_size)],
                                   train=[[SimpleNamespace(size=n) for n in task] for task in train_sizes])
    row = (np.zeros((8, row_bytes // 4), np.float32), np.zeros(8, np.float32))
    source._probe = row
    counted = []

    def test_batches(batch_size, files=None):
        counted.append(files)
        for start in range(0, test_rows, batch_size):
            n = min(batch_size, test_rows - start)
            yield np.zeros((n, 1), np.float32), np.zeros(n, np.float32)

    source.test_batches = test_batches
    return source, counted


def test_small_files_cap_the_buffer_at_the_smallest_tasks_epoch():
    # the diabetes example's shape: 89 test rows in 4,000 bytes; the tasks' files 10,000 and 20,000 bytes
    source, counted = file_input(4_000, 89, [[3_000, 3_000, 4_000], [20_000]])
    assert source.smallest_epoch() == 223          # ceil(10,000 * 89 / 4,000)
    assert source.shuffle_examples() == 223        # not 10,000: ~45 epochs of that task's files
    assert counted and counted[0] == source.files.test[:1]


def test_the_floor_holds_for_a_tiny_epoch():
    source, _ = file_input(4_000, 89, [[100]])
    assert source.smallest_epoch() == 3 and source.shuffle_examples() == inputs.SHUFFLE_EXAMPLES[0]


@pytest.mark.parametrize("test_size, test_rows", [(inputs.EPOCH_COUNT_BYTES + 1, 50_000), (4_000, 0)])
def test_a_test_file_too_large_to_count_or_empty_leaves_the_byte_sized_buffer(test_size, test_rows):
    source, counted = file_input(test_size, test_rows, [[1_000]])
    assert source.smallest_epoch() is None
    assert source.shuffle_examples() == inputs.SHUFFLE_EXAMPLES[1]    # 44-byte examples: the 10,000 cap
    assert bool(counted) is (test_size <= inputs.EPOCH_COUNT_BYTES)


def test_large_examples_keep_the_buffer_within_its_bytes_though_the_epoch_is_larger():
    source, _ = file_input(4_000_000, 10, [[400_000_000]], row_bytes=4 << 20)   # 4 MiB images
    assert source.smallest_epoch() == 1000
    assert source.shuffle_examples() == inputs.SHUFFLE_EXAMPLES[0]   # 64 MiB / 4 MiB = 16, floored at 64
