"""The chief's checkpoints with real TensorFlow and S3 (moto): newest of local and S3 wins, a failed upload
leaves the unpublished marker, a checkpoint beyond ``steps`` is refused, the upload runs beside training."""

from __future__ import annotations

import importlib.util
import json
import threading

import numpy as np
import pytest
from harness_support import example_settings
from tfc_harness import checkpoints, s3io
from tfc_harness.errors import HarnessError
from tfc_harness.parameter_server import ParameterServer
from tfc_harness.saver import Saver
from tfc_harness.settings import validate

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")


class InProcess(ParameterServer):
    """The parameter-server chief's checkpoint place, without a cluster: default device, no io pinning."""

    def checkpoint_options(self):
        import tensorflow as tf
        return tf.train.CheckpointOptions()


def make(settings, client, fill: float):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.set_weights([np.full((3, 2), fill, np.float32), np.zeros(2, np.float32)])
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(model.trainable_variables)
    return Saver(InProcess(settings), client, model, optimizer), model


def test_restore_takes_the_newest_of_local_and_s3(s3_client, moto_endpoint, tmp_path, capsys):
    s3_client.create_bucket(Bucket="ckpt")
    raw = example_settings(state_dir=str(tmp_path), steps=30)
    raw["s3"].update(endpoint=moto_endpoint, bucket="ckpt")
    settings = validate(raw)

    first, _ = make(settings, s3_client, 1.0)
    assert first.restore() == 0
    first.save(10)
    first.wait_uploaded()
    assert checkpoints.saved_steps(s3_client, "ckpt", settings.s3.checkpoint_prefix) == [10]

    fresh, model = make(settings, s3_client, 0.0)
    assert fresh.restore() == 10 and model.get_weights()[0][0, 0] == 1.0
    assert "resumed from checkpoint at step 10\n" in capsys.readouterr().out

    # S3 refuses the next checkpoint: the node keeps it and says so.
    broken = s3io.make_client(moto_endpoint, "us-east-1")
    failing, model = make(settings.model_copy(update={"s3": settings.s3.model_copy(update={"bucket": "gone"})}),
                          broken, 2.0)
    failing.save(20)        # written; its copy to S3 goes on beside training, and fails there
    with pytest.raises(s3io.TransferError):
        failing.wait_uploaded()
    assert "checkpoint saved at step 20" not in capsys.readouterr().out
    marker = json.loads((tmp_path / "unpublished.json").read_text())
    assert marker["step"] == 20 and "checkpoint upload failed" in marker["reason"]

    again, model = make(settings, s3_client, 0.0)
    assert again.restore() == 20 and model.get_weights()[0][0, 0] == 2.0
    assert "resumed from checkpoint at step 20 (local, newer than S3)" in capsys.readouterr().out

    beyond, _ = make(settings.model_copy(update={"steps": 15}), s3_client, 0.0)
    with pytest.raises(HarnessError, match="checkpoint step 20 is beyond steps=15"):
        beyond.restore()


def test_a_function_traced_for_variables_is_built_again_only_for_others():
    from tfc_harness.traced import TracedFor

    built = []
    variables = [object(), object()]
    fn = TracedFor(lambda: variables, lambda now: built.append(list(now)) or (lambda x: x * 2))
    assert fn(2) == 4 and fn(3) == 6 and len(built) == 1
    variables.append(object())      # other variables now: built again, for them
    assert fn(1) == 2 and len(built) == 2 and built[-1] == variables


def test_a_traced_checkpoint_write_is_traced_once_and_restores_what_it_saved(tmp_path):
    """Where a checkpoint spans tasks the write runs in one traced function (TensorFlow traces a new one for
    every eager save there): the saves after the first do not trace; its files restore the values saved."""
    import keras
    import tensorflow as tf
    from tfc_harness import traced

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, step=step)
    _ = checkpoint.save_counter     # as the Saver makes it
    write = traced.checkpoint_write(checkpoint, tf.train.CheckpointOptions(), lambda: model.variables)
    for n in (1, 2, 3):
        step.assign(n)
        model.set_weights([np.full((3, 2), n, np.float32), np.zeros(2, np.float32)])
        write(str(tmp_path / f"ckpt-{n}"))
    assert write.fn.experimental_get_tracing_count() == 1
    assert checkpoints.local_steps(tmp_path) == [1, 2, 3]

    step.assign(0)
    model.set_weights([np.zeros((3, 2), np.float32), np.zeros(2, np.float32)])
    checkpoint.restore(str(tmp_path / "ckpt-2")).assert_existing_objects_matched()
    assert int(step.numpy()) == 2 and model.get_weights()[0][0, 0] == 2.0


def test_the_traced_finite_check_sees_a_nan_in_any_float_variable():
    import tensorflow as tf
    from tfc_harness import traced

    weights = [tf.Variable([1.0, 2.0]), tf.Variable(3, dtype=tf.int64), tf.Variable([[0.5]])]
    finite = traced.all_finite(lambda: weights)
    assert finite() is True
    weights[2].assign([[float("nan")]])
    assert finite() is False
    weights[2].assign([[float("inf")]])
    assert finite() is False
    assert traced.all_finite(lambda: [])() is True


def test_local_checkpoints_beyond_the_newest_three_are_removed(s3_client, moto_endpoint, tmp_path):
    s3_client.create_bucket(Bucket="ckpt-keep")
    raw = example_settings(state_dir=str(tmp_path), steps=50)
    raw["s3"].update(endpoint=moto_endpoint, bucket="ckpt-keep")
    saver, _ = make(validate(raw), s3_client, 1.0)
    assert saver.restore() == 0
    for step in (10, 20, 30, 40):
        saver.save(step)
    saver.wait_uploaded()
    assert checkpoints.local_steps(saver.directory) == [20, 30, 40]
    assert checkpoints.saved_steps(s3_client, "ckpt-keep", saver.settings.s3.checkpoint_prefix) == [20, 30, 40]


class HeldUploads:
    """An S3 client whose uploads wait until ``release`` is set."""

    def __init__(self, client):
        self.client, self.started, self.release = client, threading.Event(), threading.Event()

    def upload_file(self, *args, **kwargs):
        self.started.set()
        assert self.release.wait(60), "the test never released the upload"
        return self.client.upload_file(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def held_saver(s3_client, moto_endpoint, tmp_path, bucket: str):
    """A saver into a new ``bucket`` whose uploads wait for the test (:class:`HeldUploads`)."""
    s3_client.create_bucket(Bucket=bucket)
    raw = example_settings(state_dir=str(tmp_path), steps=30)
    raw["s3"].update(endpoint=moto_endpoint, bucket=bucket)
    held = HeldUploads(s3_client)
    return make(validate(raw), held, 1.0)[0], held


def test_a_checkpoint_is_copied_to_s3_while_training_goes_on(s3_client, moto_endpoint, tmp_path, capsys):
    """save() returns once the checkpoint is written locally; ``checkpoint saved`` is logged once S3 has it; a
    loop that fails waits for the copy under way and raises its own error."""
    saver, held = held_saver(s3_client, moto_endpoint, tmp_path, "ckpt-bg")
    settings = saver.settings
    assert saver.restore() == 0
    with pytest.raises(RuntimeError, match="the loop failed"), saver.uploads():
        saver.save(10)
        assert held.started.wait(30)
        assert checkpoints.local_steps(saver.directory) == [10]
        assert checkpoints.saved_steps(s3_client, "ckpt-bg", settings.s3.checkpoint_prefix) == []
        assert "checkpoint saved at step 10" not in capsys.readouterr().out
        threading.Timer(0.5, held.release.set).start()
        raise RuntimeError("the loop failed")
    assert checkpoints.saved_steps(s3_client, "ckpt-bg", settings.s3.checkpoint_prefix) == [10]
    assert "checkpoint saved at step 10\n" in capsys.readouterr().out


def test_the_copy_after_each_upload_runs_in_the_uploading_thread_once_s3_has_the_checkpoint(
        s3_client, moto_endpoint, tmp_path):
    """The TensorBoard events' copy follows each checkpoint's upload in its thread, not in the loop's: held
    uploads leave save() free to return, and the copy comes once S3 has the step, one per checkpoint."""
    saver, held = held_saver(s3_client, moto_endpoint, tmp_path, "ckpt-after")
    prefix = saver.settings.s3.checkpoint_prefix
    copies = []

    def copy():
        in_main = threading.current_thread() is threading.main_thread()
        copies.append((in_main, checkpoints.saved_steps(s3_client, "ckpt-after", prefix)))

    saver.after_each_upload(copy)
    with saver.uploads():
        saver.save(10)
        assert held.started.wait(30) and copies == []     # save() returned with the upload still held
        held.release.set()
        saver.save(20)
    assert copies == [(False, [10]), (False, [10, 20])]


def test_the_warm_up_traces_the_write_and_runs_the_finite_check_without_saving(s3_client, moto_endpoint, tmp_path):
    """Where the variables sit on the parameter servers the first save traced its write and first ran the finite
    check (~0.5 s, the workers idle): the warm-up does both beforehand (the strategy runs it while its first
    call waits on the workers), writing nothing; the saves after it trace nothing again."""
    s3_client.create_bucket(Bucket="ckpt-warm")
    raw = example_settings(state_dir=str(tmp_path), steps=30)
    raw["s3"].update(endpoint=moto_endpoint, bucket="ckpt-warm")
    saver, _ = make(validate(raw), s3_client, 1.0)
    assert saver.restore() == 0
    ran = []
    saver.strategy.while_first_call(lambda: ran.append("work"))
    assert ran == [] and saver.strategy.first_call_work is not None    # kept for the first call, not run now
    saver.warm_up()
    assert saver.write.fn.experimental_get_tracing_count() == 1
    assert saver.finite.fn.experimental_get_tracing_count() == 1     # traced by its run
    assert checkpoints.local_steps(saver.directory) == []
    with saver.uploads():
        saver.save(10)
        assert saver.finite() is True
        saver.save(20)
    assert saver.write.fn.experimental_get_tracing_count() == 1
    assert saver.finite.fn.experimental_get_tracing_count() == 1
    assert checkpoints.saved_steps(s3_client, "ckpt-warm", saver.settings.s3.checkpoint_prefix) == [10, 20]


def test_an_upload_that_failed_is_raised_by_the_next_save_which_keeps_its_own_step(s3_client, moto_endpoint,
                                                                                 tmp_path, capsys):
    """The next save writes its checkpoint first: the steps trained since the failed upload are kept on the
    node and named in unpublished.json, and a restart resumes from them."""
    raw = example_settings(state_dir=str(tmp_path), steps=30)
    raw["s3"].update(endpoint=moto_endpoint, bucket="ckpt-never-made")
    settings = validate(raw)
    saver, _ = make(settings, s3io.make_client(moto_endpoint, "us-east-1"), 3.0)
    with pytest.raises(s3io.TransferError), saver.uploads():
        saver.save(10)
        saver.save(20)      # raises the step-10 upload's error, step 20 written first
    assert checkpoints.local_steps(saver.directory) == [10, 20]
    marker = json.loads((tmp_path / "unpublished.json").read_text())
    assert marker["step"] == 20 and "checkpoint upload failed" in marker["reason"]
    assert "checkpoint saved at step" not in capsys.readouterr().out
    s3_client.create_bucket(Bucket="ckpt-never-made")
    again, model = make(settings, s3_client, 0.0)
    assert again.restore() == 20 and model.get_weights()[0][0, 0] == 3.0
