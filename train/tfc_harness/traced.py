"""Functions traced once for a set of variables, not one op at a time: where the variables sit on other
tasks (the parameter servers), an eager op on each costs a round trip, and TensorFlow traces a new
function at every eager multi-device save; a traced function reaches them all in one call."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TracedFor:
    """``build(variables)``'s function for what ``variables()`` returns now: built (and so traced) again only
    when those are other variables than last time (a traced function keeps the variables it saw)."""

    def __init__(self, variables: Callable[[], Sequence], build: Callable[[list], Callable]):
        self.variables, self.build = variables, build
        self.key: tuple[int, ...] | None = None
        self.fn: Callable | None = None

    def current(self) -> Callable:
        """The function for what ``variables()`` returns now (built if those are other variables)."""
        now = list(self.variables())
        key = tuple(id(v) for v in now)
        if key != self.key:
            self.fn, self.key = self.build(now), key
        return self.fn

    def __call__(self, *args):
        return self.current()(*args)

    def trace(self) -> None:
        """Trace the function for the current variables without running it (a function with arguments has
        an input signature)."""
        self.current().get_concrete_function()


def all_finite(variables: Callable[[], Sequence]) -> Finite:
    """``finite()``: whether every floating-point value of ``variables()`` (the model's weights, the optimizer's
    state) is finite, each variable reduced where it lives (a boolean crosses the network, not its values)."""
    import tensorflow as tf

    def build(now: list):
        floats = [v for v in now if tf.as_dtype(v.dtype).is_floating]

        @tf.function(autograph=False)
        def finite():
            return tf.reduce_all(tf.stack([tf.constant(True)] + [tf.reduce_all(tf.math.is_finite(v)) for v in floats]))

        return finite

    return Finite(variables, build)


class Finite(TracedFor):
    """The finite check of :func:`all_finite`: a Python bool."""

    def __call__(self) -> bool:
        return bool(super().__call__())


def checkpoint_write(checkpoint, options, variables: Callable[[], Sequence]) -> TracedFor:
    """``write(prefix)``: ``checkpoint.write(prefix, options=options)`` in one function, traced again only when
    ``variables()`` (what the checkpoint saves) are others (``prefix``, a string, is the function's argument:
    another one does not trace it again)."""
    import tensorflow as tf

    def build(_now: list):
        @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
        def write(file_prefix):
            return checkpoint.write(file_prefix, options=options)

        return write

    return TracedFor(variables, build)
