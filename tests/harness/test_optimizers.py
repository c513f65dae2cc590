"""The default optimizer (tfc_harness.optimizers.LockedAdam): Keras's Adam arithmetic, each update atomic."""

from __future__ import annotations

import importlib.util
import threading
import types

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")


def _trained(optimizer_cls, steps: int = 40, **options):
    """Two variables (a kernel and a bias) trained by ``optimizer_cls`` on fixed random dense gradients."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(7)
    kernel = keras.Variable(rng.normal(size=(3, 4)).astype(np.float32))
    bias = keras.Variable(rng.normal(size=(4,)).astype(np.float32))
    optimizer = optimizer_cls(**{"learning_rate": 0.01, **options})
    for _ in range(steps):
        optimizer.apply_gradients([(tf.constant(rng.normal(size=v.shape).astype(np.float32)), v)
                                   for v in (kernel, bias)])
    return kernel.numpy(), bias.numpy()


@pytest.mark.parametrize("options", [
    {}, {"weight_decay": 0.01, "clipnorm": 1.0}, {"beta_1": 0.8, "epsilon": 1e-4},
    {"learning_rate": "decay"},     # a schedule: each step's rate, as Keras's Adam gets it
])
def test_it_does_kerass_adam_arithmetic(options):
    import keras
    from tfc_harness.optimizers import LockedAdam

    if options.get("learning_rate") == "decay":
        options = {"learning_rate": keras.optimizers.schedules.ExponentialDecay(0.05, 10, 0.5)}
    ours, theirs = _trained(LockedAdam, **options), _trained(keras.optimizers.Adam, **options)
    sgd = _trained(keras.optimizers.SGD, learning_rate=options.get("learning_rate", 0.01))
    assert not np.allclose(ours[0], sgd[0], atol=1e-3)          # the comparison can tell optimizers apart
    for mine, keras_s in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(mine, keras_s, rtol=1e-5, atol=1e-6)


def test_two_concurrent_updates_never_divide_by_epsilon():
    """Two threads update one variable at once, as two workers' steps do on a parameter server: one with a
    gradient of 1 on a new coordinate each step (its first non-zero one), one with zeros. Keras's Adam here
    moved 1 to 20 of 20,000 coordinates by ~1,591 in one step (its step read ``m`` with the other update's
    gradient in it and ``v`` without); every LockedAdam update moves a coordinate by a few hundredths at
    most."""
    import keras
    import tensorflow as tf
    from tfc_harness.optimizers import LockedAdam

    size = 20_000
    weights = keras.Variable(np.zeros(size, np.float32))
    optimizer = LockedAdam(learning_rate=0.002)
    optimizer.build([weights])
    optimizer.iterations.assign(1000)

    @tf.function
    def step(gradient):
        optimizer.update_step(gradient, weights.value, tf.constant(0.002))

    step(tf.zeros(size))            # traced once, before the threads
    threads = [threading.Thread(target=lambda: [step(tf.one_hot(k, size)) for k in range(size)]),
               threading.Thread(target=lambda: [step(tf.zeros(size)) for _ in range(size)])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    moved = np.abs(weights.numpy())
    assert moved.max() < 0.1, (moved.max(), int((moved > 1).sum()))
    assert (moved > 0.01).sum() > size // 2      # every coordinate trained (the zeros only decay its moments)


def test_a_module_without_make_optimizer_gets_it():
    from tfc_harness import usermodel
    from tfc_harness.optimizers import LockedAdam

    optimizer = usermodel.make_optimizer(types.ModuleType("mine"), 0.003)
    assert isinstance(optimizer, LockedAdam) and float(optimizer.learning_rate) == pytest.approx(0.003)


def _adapted(optimizer):
    from harness_support import example_settings
    from tfc_harness import strategies
    from tfc_harness.settings import validate

    return strategies.get("parameter_server")(validate(example_settings())).adapt_optimizer(optimizer)


@pytest.mark.parametrize("make, options", [
    ("Adam", {"beta_1": 0.8, "epsilon": 1e-4, "clipnorm": 1.0}),
    ("AdamW", {"weight_decay": 0.05}),
    ("Adam", {"learning_rate": "decay"}),
])
def test_under_parameter_server_a_modules_keras_adam_runs_atomically_with_its_configuration(make, options):
    """make_optimizer returning Keras's Adam or AdamW: the parameter-server chief trains with a LockedAdam of
    the same configuration, says so, and its updates are those of the user's optimizer."""
    import keras
    from tfc_harness.optimizers import LockedAdam

    if options.get("learning_rate") == "decay":
        options = {"learning_rate": keras.optimizers.schedules.ExponentialDecay(0.05, 10, 0.5)}
    cls = getattr(keras.optimizers, make)
    adapted, note = _adapted(cls(**options))
    assert type(adapted) is LockedAdam and f"keras.optimizers.{make} runs as tfc_harness.optimizers.LockedAdam" in note
    config = cls(**options).get_config()
    assert {k: v for k, v in adapted.get_config().items() if k != "name"} == \
        {k: v for k, v in config.items() if k != "name"}
    ours = _trained(lambda **o: _adapted(cls(**o))[0], **options)
    for mine, keras_s in zip(ours, _trained(cls, **options), strict=True):
        np.testing.assert_allclose(mine, keras_s, rtol=1e-5, atol=1e-6)


def test_under_parameter_server_other_optimizers_are_kept_with_a_warning_when_not_atomic():
    import keras
    from tfc_harness.optimizers import LockedAdam

    class MyAdam(keras.optimizers.Adam):      # a subclass: its update may be its own
        pass

    for optimizer in (keras.optimizers.RMSprop(0.01), keras.optimizers.Adagrad(0.01),
                      keras.optimizers.Adam(0.01, amsgrad=True), MyAdam(0.01)):
        adapted, note = _adapted(optimizer)
        assert adapted is optimizer, optimizer
        assert note.startswith("warning: make_optimizer returns ") and type(optimizer).__name__ in note, note
        assert "parameter_server" in note and "LockedAdam" in note, note
    for optimizer in (keras.optimizers.SGD(0.01, momentum=0.9), keras.optimizers.Lion(0.001),
                      LockedAdam(0.01)):
        assert _adapted(optimizer) == (optimizer, None)


def test_an_adam_keras_cannot_rebuild_is_kept_with_a_warning():
    import keras

    class Halving(keras.optimizers.schedules.LearningRateSchedule):   # not registered: no from_config
        def __call__(self, step):
            return 0.01 / (1.0 + keras.ops.cast(step, "float32"))

        def get_config(self):
            return {}

    optimizer = keras.optimizers.Adam(Halving())
    adapted, note = _adapted(optimizer)
    assert adapted is optimizer and note.startswith("warning: make_optimizer's keras.optimizers.Adam could not "
                                                    "be made atomic"), note


def test_other_strategies_keep_the_modules_optimizer():
    import keras
    from harness_support import example_settings
    from tfc_harness import strategies
    from tfc_harness.settings import validate

    optimizer = keras.optimizers.Adam(0.01)
    node = strategies.get("multi_worker_mirrored")(validate(example_settings(strategy="multi_worker_mirrored")))
    assert node.adapt_optimizer(optimizer) == (optimizer, None)
