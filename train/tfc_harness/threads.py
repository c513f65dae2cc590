"""The task's TensorFlow thread pools: TensorFlow's defaults, or sizes the node was given.

TensorFlow sizes its intra-op pool (the threads one op's kernel is split over) and its inter-op pool (the
ops that run at once) to every core it sees.  A cloud VM's cores are its own, so there the defaults stay.
Local nodes share this machine's cores: each node's task gets its share (``settings['threads']``, set by
the local provider, ``provider_options.task_threads``), so that the tasks of one cluster do not
oversubscribe the cores between them.

:func:`apply` must run before TensorFlow runs any op (the pools are made with the first context); a serving
task also passes :func:`server_config` to its ``tf.distribute.Server``, whose devices (and their intra-op
pool) are made when the server starts.
"""

from __future__ import annotations

import os


def describe(threads: dict | None) -> str:
    """``threads: intra-op 1, inter-op 1 (this node's share of the machine's cores)`` or the defaults line."""
    if not threads:
        return f"threads: TensorFlow's defaults (one per core it sees: {os.cpu_count()})"
    return f"threads: intra-op {threads['intra_op']}, inter-op {threads['inter_op']} (set for this node)"


def apply(threads: dict | None) -> str:
    """Size TensorFlow's pools (before any op); returns the line the task logs."""
    if threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads["intra_op"])
        tf.config.threading.set_inter_op_parallelism_threads(threads["inter_op"])
    return describe(threads)


def server_config(threads: dict | None):
    """A ``ConfigProto`` for ``tf.distribute.Server`` with the same pool sizes, or None (the defaults)."""
    if not threads:
        return None
    import tensorflow as tf

    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads["intra_op"],
                                    inter_op_parallelism_threads=threads["inter_op"])
