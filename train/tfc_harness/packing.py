"""A parameter-server step's weights read, and their gradients sent, as one tensor per ps and dtype.

Under ``parameter_server`` a worker's step reads every trainable variable from the ps that holds it and sends
each gradient back: one gRPC transfer per tensor each way, every step.  For a small model those transfers,
not the bytes, are the step's cost.  :class:`Packed` makes them two per ps: the ps concatenates its variables'
values into one flat tensor, the worker splits it and the model computes on those values (a Keras
``StatelessScope`` maps each variable to its value, as ``Model.stateless_call`` does), and the worker
concatenates the gradients into one tensor that the ps splits before the optimizer's update, which runs where
it ran before, beside each variable.  The arithmetic is the same: only where the tensors are joined changes.

Measured at the machine's slow phase, digits, interleaved: 7,171-8,700 examples/s packed against 5,495-6,355
reading each variable on loopback (ps, 2 workers and a chief as processes, 10 and 30 steps a scheduled
function); 4,504-5,205 against 3,895-4,120 on a local 4-node cluster (1200-step trains).

A variable over :data:`PACK_MAX_VARIABLE_BYTES` is not packed: there the bytes are the cost, and packing
copies them twice more (a lookup that reads only some rows of a table would also ship all of it; Keras 3's
own ``Embedding`` on TensorFlow reads its whole table either way, its ``take`` converting the variable to a
tensor first).  The model reads such a variable as it reads it without packing (one with a regulariser, whose
loss reads it whole anyway, as one tensor of its own).  A sparse gradient
(``tf.IndexedSlices``) or a gradient that is None goes as it is.
"""

from __future__ import annotations

import contextlib
import math

import keras

#: a variable above this many bytes is read as the model reads it, not packed (the module's text)
PACK_MAX_VARIABLE_BYTES = 1 << 20


class Packed:
    """The trainable variables of ``model``, grouped by the device that holds them and their dtype."""

    def __init__(self, model):
        self.model = model
        self.variables = list(model.trainable_variables)
        groups: dict[tuple[str, str], list[int]] = {}
        self.whole: list[int] = []      # read as one tensor each: over the limit, with a regulariser
        self.unmapped: list[int] = []   # read as the model reads them: over the limit
        for i, v in enumerate(self.variables):
            if variable_bytes(v) <= PACK_MAX_VARIABLE_BYTES:
                groups.setdefault((v.value.device, v.value.dtype.name), []).append(i)
            else:
                (self.whole if v.regularizer is not None else self.unmapped).append(i)
        #: ``(device, variable indices)`` per group, in the model's order
        self.groups = [(device, idx) for (device, _dtype), idx in groups.items()]

    @classmethod
    def for_model(cls, model) -> Packed | None:
        """A :class:`Packed` for ``model``, or None when none of its trainable variables is small enough, or one
        is not a Keras variable (which a Keras ``StatelessScope`` cannot map)."""
        if not all(isinstance(v, keras.Variable) for v in model.trainable_variables):
            return None
        packed = cls(model)
        return packed if packed.groups else None

    def describe(self) -> str:
        packed = sum(len(idx) for _, idx in self.groups)
        line = (f"{packed} of {len(self.variables)} trainable weights read and their gradients sent as "
                f"{len(self.groups)} tensor(s) each way a step")
        if packed < len(self.variables):
            line += f" ({len(self.variables) - packed} over {PACK_MAX_VARIABLE_BYTES >> 20} MiB each, one at a time)"
        return line

    @contextlib.contextmanager
    def reading(self, tape):
        """Inside a replica step: yields what the gradients are taken against, one per trainable variable: the
        value the model computes on (on this task, watched by ``tape``) or, where not mapped, the variable; on
        leaving, every assignment the call made is applied (BatchNormalization's statistics, a Dropout's seed, a
        layer's own metric)."""
        values = self._read()
        mapping = [(self.variables[i], values[i]) for i in range(len(values)) if i not in self.unmapped]
        tape.watch([value for _, value in mapping])
        with RecordingScope(mapping) as scope:
            yield values
        for v, new in scope.updates():
            v.assign(new)

    def send(self, grads: list) -> list:
        """The gradients (in the variables' order) on the devices of their variables: the dense ones of each
        group as one tensor."""
        import tensorflow as tf

        out = list(grads)
        for device, idx in self.groups:
            dense = [i for i in idx if grads[i] is not None and not isinstance(grads[i], tf.IndexedSlices)]
            if not dense:
                continue
            flat = tf.concat([tf.reshape(grads[i], [-1]) for i in dense], 0)
            with tf.device(device):
                parts = tf.split(tf.identity(flat), [self._size(i) for i in dense])
                for i, part in zip(dense, parts, strict=True):
                    out[i] = tf.reshape(part, self.variables[i].shape)
        return out

    def _read(self) -> list:
        import tensorflow as tf

        values: list = list(self.variables)
        for i in self.whole:
            values[i] = tf.identity(self.variables[i].value)
        for device, idx in self.groups:
            with tf.device(device):
                flat = tf.concat([tf.reshape(self.variables[i].value, [-1]) for i in idx], 0)
            parts = tf.split(tf.identity(flat), [self._size(i) for i in idx])
            for i, part in zip(idx, parts, strict=True):
                values[i] = tf.reshape(part, self.variables[i].shape)
        return values

    def _size(self, i: int) -> int:
        return math.prod(self.variables[i].shape)


class RecordingScope(keras.StatelessScope):
    """A Keras ``StatelessScope`` (it maps variables to values and holds back every assignment made inside it)
    that also keeps which variables were assigned: Keras keeps only their ids, and a variable the model does not
    list (a layer's own metric) is assigned too.  Collects the model's own losses."""

    def __init__(self, mapping):
        super().__init__(mapping, collect_losses=True)
        self.assigned: dict[int, object] = {}

    def add_update(self, update):
        super().add_update(update)
        self.assigned[id(update[0])] = update[0]

    def updates(self) -> list:
        """``(variable, value)`` of each variable assigned inside the scope, its last value."""
        return [(v, self.get_current_value(v)) for v in self.assigned.values()]


def variable_bytes(v) -> int:
    """The bytes of variable ``v``'s value."""
    import tensorflow as tf

    return math.prod(v.shape) * tf.as_dtype(v.dtype).size
