"""The chief's checkpoints with real TensorFlow and S3 (moto): newest of local and S3 wins, a failed upload
leaves the unpublished marker, a checkpoint beyond ``steps`` is refused."""

from __future__ import annotations

import importlib.util
import json

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
    assert checkpoints.saved_steps(s3_client, "ckpt", settings.s3.checkpoint_prefix) == [10]

    fresh, model = make(settings, s3_client, 0.0)
    assert fresh.restore() == 10 and model.get_weights()[0][0, 0] == 1.0
    assert "resumed from checkpoint at step 10\n" in capsys.readouterr().out

    # S3 refuses the next checkpoint: the node keeps it and says so.
    broken = s3io.make_client(moto_endpoint, "us-east-1")
    failing, model = make(settings.model_copy(update={"s3": settings.s3.model_copy(update={"bucket": "gone"})}),
                          broken, 2.0)
    with pytest.raises(s3io.TransferError):
        failing.save(20)
    marker = json.loads((tmp_path / "unpublished.json").read_text())
    assert marker["step"] == 20 and "checkpoint upload failed" in marker["reason"]

    again, model = make(settings, s3_client, 0.0)
    assert again.restore() == 20 and model.get_weights()[0][0, 0] == 2.0
    assert "resumed from checkpoint at step 20 (local, newer than S3)" in capsys.readouterr().out

    beyond, _ = make(settings.model_copy(update={"steps": 15}), s3_client, 0.0)
    with pytest.raises(HarnessError, match="checkpoint step 20 is beyond steps=15"):
        beyond.restore()
