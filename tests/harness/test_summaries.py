"""The chief's TensorBoard summaries (:mod:`tfc_harness.summaries`) with real TensorFlow and S3 (moto): the
scalars written, their copy beside the run, a failed copy that never raises, no events from other tasks."""

from __future__ import annotations

import importlib.util

import pytest
from harness_support import example_settings, read_scalars
from tfc_harness import s3io, strategies
from tfc_harness.settings import validate
from tfc_harness.summaries import NoSummaries, Summaries

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")


def event_keys(client, bucket: str, prefix: str) -> list[str]:
    return sorted(s3io.list_keys(client, bucket, f"{prefix}/tensorboard"))


def test_scalars_are_written_and_copied_beside_the_run(s3_client, bucket, tmp_path):
    clients = []
    summaries = Summaries(tmp_path / "tb", lambda: clients.append(1) or s3_client, bucket, "runs/c/r1")
    summaries.watch_learning_rate(lambda: 0.25)
    summaries.training(10, 0.5, 100.0)
    summaries.training(20, 0.4, 120.0)
    summaries.upload()
    keys = event_keys(s3_client, bucket, "runs/c/r1")
    assert len(keys) == 1 and keys[0].startswith("runs/c/r1/tensorboard/events.out.tfevents.")

    summaries.evaluation(30, {"test_loss": 0.3, "test_accuracy": 0.9, "test_examples": 360,
                              "headline": "test_accuracy"})
    summaries.upload()       # the file grew: copied again, under the same key
    summaries.upload()       # unchanged: nothing to do
    assert event_keys(s3_client, bucket, "runs/c/r1") == keys and clients == [1]

    s3io.download_file(s3_client, bucket, keys[0], tmp_path / "copy" / "events.out.tfevents.copy")
    scalars = read_scalars(tmp_path / "copy")
    assert scalars["train/loss"] == [(10, 0.5), (20, pytest.approx(0.4))]
    assert scalars["train/examples_per_sec"] == [(10, 100.0), (20, 120.0)]
    assert scalars["train/learning_rate"] == [(10, 0.25), (20, 0.25)]
    assert scalars["test/loss"] == [(30, pytest.approx(0.3))]
    assert scalars["test/accuracy"] == [(30, pytest.approx(0.9))]
    assert set(scalars) == {"train/loss", "train/examples_per_sec", "train/learning_rate", "test/loss",
                            "test/accuracy"}


def test_a_client_given_is_the_one_that_copies(s3_client, bucket, tmp_path):
    """The chief hands its own client over: the first copy (at the first checkpoint) makes none of its own."""
    made = []
    summaries = Summaries(tmp_path / "tb", lambda: made.append(1) or s3_client, bucket, "runs/c/r3")
    summaries.use_client(s3_client)
    summaries.training(10, 0.5, 100.0)
    summaries.upload()
    assert made == [] and len(event_keys(s3_client, bucket, "runs/c/r3")) == 1
    NoSummaries().use_client(s3_client)     # a task that writes none takes it too


def test_a_failed_copy_or_write_is_logged_never_raised(s3_client, tmp_path, capsys):
    summaries = Summaries(tmp_path / "tb", lambda: s3_client, "no-such-bucket", "runs/c/r2")
    summaries.training(1, 0.5, 10.0)
    summaries.upload(tries=1)
    out = capsys.readouterr().out
    assert "warning: could not copy the TensorBoard events to s3://no-such-bucket/runs/c/r2/tensorboard/" in out

    summaries.watch_learning_rate(lambda: 1 / 0)
    summaries.training(2, 0.4, 10.0)
    summaries.training(3, 0.3, 10.0)
    out = capsys.readouterr().out
    assert out.count("warning: TensorBoard summaries stopped: ZeroDivisionError") == 1
    assert [step for step, _ in read_scalars(tmp_path / "tb")["train/loss"]] == [1]


@pytest.mark.parametrize("strategy, role, writes", [("parameter_server", "chief", True),
                                                    ("multi_worker_mirrored", "chief", True),
                                                    ("multi_worker_mirrored", "worker", False)])
def test_only_the_task_that_concludes_the_run_writes(strategy, role, writes, tmp_path):
    raw = example_settings(strategy=strategy, role=role, state_dir=str(tmp_path))
    raw["tf_config"]["task"]["type"] = role
    settings = validate(raw)
    summaries = Summaries.for_task(settings, strategies.get(strategy)(settings))
    assert isinstance(summaries, Summaries) is writes
    if writes:
        assert summaries.directory == tmp_path / "tensorboard" / settings.run_id
        assert summaries.prefix == f"{settings.s3.run_prefix}/tensorboard"
    else:
        assert type(summaries) is NoSummaries
        summaries.training(1, 0.5, 10.0)
        summaries.upload()
        assert not (tmp_path / "tensorboard").exists()
