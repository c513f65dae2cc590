"""The S3 mirror of CheckpointManager files (no TensorFlow needed: fake checkpoint files)."""

from __future__ import annotations

import pytest
from tfc_harness import checkpoints, s3io


def _fake_checkpoint(directory, step):
    directory.mkdir(parents=True, exist_ok=True)
    for name in (f"ckpt-{step}.data-00000-of-00002", f"ckpt-{step}.data-00001-of-00002", f"ckpt-{step}.index"):
        (directory / name).write_bytes(f"{name}".encode())


def test_index_file_goes_last(tmp_path):
    _fake_checkpoint(tmp_path, 7)
    assert [p.name for p in checkpoints.checkpoint_files(tmp_path, 7)][-1] == "ckpt-7.index"
    with pytest.raises(FileNotFoundError):
        checkpoints.checkpoint_files(tmp_path, 8)


def test_upload_prune_and_download_latest(s3_client, tmp_path):
    s3_client.create_bucket(Bucket="ckpts")
    local = tmp_path / "local"
    assert checkpoints.download_latest(s3_client, "ckpts", "runs/c/checkpoints", tmp_path / "r0") is None
    for step in (100, 200, 300, 400):
        _fake_checkpoint(local, step)
        checkpoints.upload(s3_client, "ckpts", "runs/c/checkpoints", local, step, keep=3)
    assert checkpoints.saved_steps(s3_client, "ckpts", "runs/c/checkpoints") == [200, 300, 400]
    assert not any("ckpt-100." in k for k in s3io.list_keys(s3_client, "ckpts", "runs/c/checkpoints"))

    # An incomplete checkpoint (data without .index) is ignored.
    s3io.upload_bytes(s3_client, b"partial", "ckpts", "runs/c/checkpoints/ckpt-500.data-00000-of-00002")
    step, prefix = checkpoints.download_latest(s3_client, "ckpts", "runs/c/checkpoints", tmp_path / "restore")
    assert step == 400 and prefix == tmp_path / "restore" / "ckpt-400"
    assert sorted(p.name for p in (tmp_path / "restore").iterdir()) == [
        "ckpt-400.data-00000-of-00002", "ckpt-400.data-00001-of-00002", "ckpt-400.index"]


def test_local_steps_count_complete_checkpoints_and_pruning_keeps_the_newest(tmp_path):
    for step in (100, 200, 300, 400):
        _fake_checkpoint(tmp_path, step)
    (tmp_path / "ckpt-500.data-00000-of-00001").write_bytes(b"being written")    # no .index yet
    (tmp_path / "ckpt-5x.index").write_bytes(b"not a step")
    assert checkpoints.local_steps(tmp_path) == [100, 200, 300, 400]
    checkpoints.prune_local(tmp_path, keep=3)
    assert checkpoints.local_steps(tmp_path) == [200, 300, 400]
    assert not list(tmp_path.glob("ckpt-100.*"))
    assert (tmp_path / "ckpt-500.data-00000-of-00001").exists()     # the checkpoint still being written stays
    assert checkpoints.local_steps(tmp_path / "none") == []
