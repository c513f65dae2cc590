"""The default optimizer (tfc_harness.optimizers.LockedAdam): Keras's Adam arithmetic, each update atomic."""

from __future__ import annotations

import importlib.util
import threading
import types

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")


def _trained(optimizer_cls, steps: int = 40, prepare=None, **options):
    """Two variables (a kernel and a bias) trained by ``optimizer_cls`` on fixed random dense gradients
    (``prepare(optimizer, bias)`` first, when given)."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(7)
    kernel = keras.Variable(rng.normal(size=(3, 4)).astype(np.float32))
    bias = keras.Variable(rng.normal(size=(4,)).astype(np.float32))
    optimizer = optimizer_cls(**{"learning_rate": 0.01, **options})
    if prepare is not None:
        prepare(optimizer, bias)
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


def _halving():
    import keras

    class Halving(keras.optimizers.schedules.LearningRateSchedule):    # the module's own, not registered
        def __call__(self, step):
            return 0.05 / (1.0 + keras.ops.cast(step, "float32"))

        def get_config(self):
            return {}

    return Halving()


def _exclude_bias(optimizer, bias):
    optimizer.exclude_from_weight_decay(var_list=[bias])


@pytest.mark.parametrize("make, options, prepare", [
    ("Adam", {"beta_1": 0.8, "epsilon": 1e-4, "clipnorm": 1.0}, None),
    ("AdamW", {"weight_decay": 0.1}, _exclude_bias),     # kept out of get_config(): a rebuilt copy loses it
    ("Adam", {"global_clipnorm": 0.5, "use_ema": True, "loss_scale_factor": 8.0}, None),
    ("Adam", {"clipvalue": 0.1, "gradient_accumulation_steps": 2}, None),
    ("Adam", {"learning_rate": "decay"}, None),
    ("Adam", {"learning_rate": "halving"}, None),
])
def test_under_parameter_server_a_modules_keras_adam_becomes_locked_keeping_all_it_was_given(make, options, prepare):
    """make_optimizer returning Keras's Adam or AdamW: the parameter-server chief trains with that very object
    made a LockedAdam, says so, and its updates are those of the user's optimizer."""
    import keras
    from tfc_harness.optimizers import LockedAdam

    rate = options.get("learning_rate")
    if rate == "decay":
        options = {"learning_rate": keras.optimizers.schedules.ExponentialDecay(0.05, 10, 0.5)}
    elif rate == "halving":
        options = {"learning_rate": _halving()}
    cls = getattr(keras.optimizers, make)
    optimizer = cls(**options)
    config = optimizer.get_config()
    adapted, note = _adapted(optimizer)
    assert adapted is optimizer and type(adapted) is LockedAdam and adapted.get_config() == config
    assert note.startswith(f"make_optimizer's keras.optimizers.{make} runs as tfc_harness.optimizers.LockedAdam")

    def locked(**o):
        opt = cls(**o)
        assert _adapted(opt)[0] is opt and type(opt) is LockedAdam
        return opt

    ours = _trained(locked, prepare=prepare, **options)
    theirs = _trained(cls, prepare=prepare, **options)
    if prepare is not None:      # the comparison can tell the exclusion's loss
        lost = _trained(cls, **options)
        assert not np.allclose(theirs[1], lost[1], atol=1e-4)
    for mine, keras_s in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(mine, keras_s, rtol=1e-5, atol=1e-6)


def test_under_parameter_server_an_adam_inside_a_loss_scale_optimizer_becomes_locked():
    import keras
    from tfc_harness.optimizers import LockedAdam

    wrapped = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))
    adapted, note = _adapted(wrapped)
    assert adapted is wrapped and type(wrapped.inner_optimizer) is LockedAdam and "runs as" in note, note


def test_under_parameter_server_other_optimizers_are_kept_with_a_warning_unless_they_never_divide():
    import keras
    from tfc_harness.optimizers import LockedAdam

    class MyAdam(keras.optimizers.Adam):      # a subclass: its update may be its own
        pass

    risky = [(keras.optimizers.RMSprop(0.01), "keras.optimizers.RMSprop"),
             (keras.optimizers.Adagrad(0.01), "keras.optimizers.Adagrad"),
             (keras.optimizers.Adam(0.01, amsgrad=True), "keras.optimizers.Adam"),
             (keras.optimizers.LossScaleOptimizer(keras.optimizers.Nadam(0.01)), "keras.optimizers.Nadam"),
             (MyAdam(0.01), f"{__name__}.test_under_parameter_server_other_optimizers_are_kept_with_a_warning_"
                            "unless_they_never_divide.<locals>.MyAdam")]
    for name in ("Muon", "ScheduleFreeAdamW"):
        if hasattr(keras.optimizers, name):
            risky.append((getattr(keras.optimizers, name)(learning_rate=0.01), f"keras.optimizers.{name}"))
    for optimizer, name in risky:
        kind = type(optimizer)
        adapted, note = _adapted(optimizer)
        assert adapted is optimizer and type(optimizer) is kind, optimizer
        assert note.startswith(f"warning: make_optimizer returns {name}: under parameter_server "), note
        assert "LockedAdam" in note, note
    for optimizer in (keras.optimizers.SGD(0.01, momentum=0.9), keras.optimizers.Lion(0.001), LockedAdam(0.01),
                      keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))):
        assert _adapted(optimizer) == (optimizer, None)


def test_other_strategies_keep_the_modules_optimizer():
    import keras
    from harness_support import example_settings
    from tfc_harness import strategies
    from tfc_harness.settings import validate

    optimizer = keras.optimizers.Adam(0.01)
    node = strategies.get("multi_worker_mirrored")(validate(example_settings(strategy="multi_worker_mirrored")))
    assert node.adapt_optimizer(optimizer) == (optimizer, None) and type(optimizer) is keras.optimizers.Adam


def test_the_chief_builds_the_optimizer_the_strategy_adapts_and_passes_its_note_on():
    """chief.build_distributed: the module's optimizer goes through the strategy's adapt_optimizer in its
    scope, and the note comes back with the model."""
    import contextlib

    import keras
    from harness_support import example_settings
    from tfc_harness import chief, strategies
    from tfc_harness.optimizers import LockedAdam
    from tfc_harness.settings import validate

    class Local(strategies.get("parameter_server")):
        def scope(self):
            return contextlib.nullcontext()

    module = types.ModuleType("mine")
    module.build_model = lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    module.make_optimizer = lambda rate: keras.optimizers.Adam(rate)
    job = chief.Job(module, "mse", None, {}, example_shape=(3,))
    model, optimizer, note = chief.build_distributed(Local(validate(example_settings())), job, 0.004)
    assert type(optimizer) is LockedAdam and float(optimizer.learning_rate) == pytest.approx(0.004)
    assert optimizer.built and note.startswith("make_optimizer's keras.optimizers.Adam runs as")


def test_under_parameter_server_the_chief_names_the_variables_whose_updates_stay_kerass_own(tmp_path):
    """An Embedding's sparse gradient keeps Keras's Adam update (not atomic): once the step is traced, the
    parameter-server strategy's note names that variable; a dense model's has none; other strategies say
    nothing."""
    import keras
    import tensorflow as tf
    from harness_support import example_settings
    from tfc_harness import chief, strategies
    from tfc_harness.optimizers import LockedAdam
    from tfc_harness.settings import validate
    from tfc_harness.status import ChiefState

    def traced(model, x):
        optimizer = LockedAdam(0.01)

        @tf.function
        def step(n):
            for _ in tf.range(n):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x)))
                optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                              model.trainable_variables, strict=True))
            return [loss]
        return optimizer, step

    ps = strategies.get("parameter_server")(validate(example_settings()))
    mwms = strategies.get("multi_worker_mirrored")(validate(example_settings(strategy="multi_worker_mirrored")))
    sparse = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(50, 4, name="words"),
                               keras.layers.Flatten(), keras.layers.Dense(1)])
    optimizer, step = traced(sparse, tf.constant([[1, 2, 3], [4, 5, 6]]))
    assert ps.training_note(optimizer) is None                   # nothing traced yet
    state = ChiefState(tmp_path, 10)
    train = chief.noting(ps, optimizer, state, step)
    train(2)
    train(3)
    assert len(state.notes) == 1 and state.notes[0].startswith("warning: 1 variable(s) (")
    assert "words" in state.notes[0] and "a sparse gradient" in state.notes[0], state.notes
    assert mwms.training_note(optimizer) is None
    dense = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    optimizer, step = traced(dense, tf.ones((2, 3)))
    step(2)
    assert ps.training_note(optimizer) is None
