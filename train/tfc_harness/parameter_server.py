"""The ``parameter_server`` strategy: ParameterServerStrategy with a ClusterCoordinator on the chief.

ps tasks hold the variables and only serve; each worker first prepares its own part of the training data
(:meth:`tfc_harness.inputs.ArrayInput.prepare_worker`: a local shard, or a stream of its files) and then
serves; the chief runs the loop, and its ``ClusterCoordinator`` spreads the scheduled steps over the
workers, each reading its own data (:mod:`tfc_harness.inputs`).  Each scheduled function runs several steps
on its worker (:class:`Dispatch` tunes how many toward :data:`DISPATCH_TARGET_S`): a dispatch costs the chief
an RPC round trip, which bounds small steps when each function runs one.  ``model.fit`` does not work with this
strategy under Keras 3, hence the harness's own loop.  Checkpoints are written by the chief only, with
their I/O pinned to the chief (without that each ps would write its part to its own disk).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from . import inputs, s3io, server, steps
from .status import log_line
from .strategies import Strategy

LOSS_SAMPLES = 8              # remote losses fetched per train(n) call
#: aim for this much time on a worker per scheduled function. The time a function is measured to take includes
#: the dispatch's own cost (the coordinator's round trip, the function's start on the worker and its variable
#: reads from the ps), so the target must be well above that cost: at 0.05 s a one-step function of the digits
#: CNN took ~55 ms at this machine's slow phase, the size never left 1 and the loop ran 2,535-2,730 examples/s;
#: at 0.25 s, 3,868-4,404 (3-12 steps a function; 1200-step trains on a local 4-node cluster, interleaved)
DISPATCH_TARGET_S = 0.25
MAX_STEPS_PER_DISPATCH = 200
#: a step too long for the target still runs this many a function, as long as they take at most
#: LONG_FUNCTION_S: one step a function of the shapes32 bench model (~210 ms a worker step) paid the dispatch's
#: cost on every step (interleaved runs, `scripts/bench.py --models shapes32 --strategies parameter_server`:
#: 638 / 654 examples/s at 1 step a function, 712 / 720 with this rule; docs/benchmark-history.md). A step over
#: LONG_FUNCTION_S runs one a function, so that a call stays short for the progress, a stop and the stall watchdog
MIN_STEPS_PER_DISPATCH = 4
LONG_FUNCTION_S = 1.0


class Dispatch:
    """How many steps each scheduled function runs: tuned from how long the previous ``train(n)`` took.

    The first call runs one step per function (it also traces); after each call the time of one step on one
    worker is estimated (the call's seconds × the workers kept busy / its steps) and the next functions get
    about ``target_s`` of steps each, between 1 and ``limit``; where that is fewer than
    :data:`MIN_STEPS_PER_DISPATCH`, that many, or as many as take :data:`LONG_FUNCTION_S` if fewer.  A call
    never has fewer functions than workers while it has steps for them, so no worker idles for want of a
    function.  A call whose steps were too few for functions of the planned size (a chunk cut short at a
    checkpoint) does not retune: its smaller functions carry the dispatch's cost over fewer steps, and the size
    swung down and back up with every checkpoint.
    """

    def __init__(self, workers: int, target_s: float = DISPATCH_TARGET_S, limit: int = MAX_STEPS_PER_DISPATCH):
        self.workers, self.target_s, self.limit = max(1, workers), target_s, limit
        self.steps = self.reported = 1

    def plan(self, n: int) -> list[int]:
        """The steps of each function scheduled for a call of ``n`` steps (they sum to ``n``): at most the
        current size each, in whole rounds (as many functions for every worker) of sizes that differ by one at
        most.  A call cut short at a checkpoint of 44 steps at 14 a function on 2 workers ran 14+14 on one
        worker and 14+2 on the other, which then idled for 12 steps; now 11 each."""
        k = max(1, min(self.steps, -(-n // self.workers)))
        functions = min(n, self.workers * -(-n // (self.workers * k)))
        size, longer = divmod(n, functions)
        return [size + 1] * longer + [size] * (functions - longer)

    def observe(self, sizes: list[int], seconds: float) -> bool:
        """Retune after a call that ran functions of ``sizes`` steps in ``seconds``; True when the size moved
        by half or more since it was last reported (worth a log line)."""
        if max(sizes, default=0) < self.steps:
            return False
        per_step = max(seconds * min(self.workers, len(sizes)) / max(1, sum(sizes)), 1e-6)
        steps = int(self.target_s / per_step)
        if steps < MIN_STEPS_PER_DISPATCH:      # a long step: a few a function, up to LONG_FUNCTION_S of them
            steps = min(MIN_STEPS_PER_DISPATCH, int(LONG_FUNCTION_S / per_step))
        self.steps = max(1, min(self.limit, steps))
        if not self.reported / 1.5 < self.steps < self.reported * 1.5:
            self.reported = self.steps
            return True
        return False


def do_first_call_work(work: Callable[[], None]) -> None:
    """Run ``work`` (a head start, see :meth:`ParameterServer.while_first_call`): its failure is logged, not
    raised, with the call's functions scheduled and not yet waited for (what it prepares is done later
    anyway, and fails there if it must)."""
    try:
        work()
    except Exception as exc:  # noqa: BLE001 - only a head start
        log_line(f"warning: the work done during the first call failed: {type(exc).__name__}: {exc}")


class ParameterServer(Strategy):
    name = "parameter_server"
    # the chief's interpreter shutdown (the coordinator's threads, TensorFlow's teardown) took ~1 s after
    # everything was published and reported: time every run waited for
    ends_without_shutdown = True
    variables_on_other_tasks = True     # the model's and the optimizer's: on the parameter servers
    dispatch: Dispatch | None = None    # made with the train function
    first_call_work: Callable[[], None] | None = None     # see while_first_call

    def runs_loop(self) -> bool:
        return self.settings.role == "chief"

    def serve(self) -> int:
        feed = None
        if self.settings.role == "worker":
            feed = inputs.for_settings(self.settings, s3io.client_from_settings(self.settings)).prepare_worker()
        return server.serve(self.settings, feed)

    def connect(self) -> None:
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        self.tf_strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.tf_strategy)

    def scope(self):
        return self.tf_strategy.scope()

    def adapt_optimizer(self, optimizer):
        """The module's own Keras Adam made a LockedAdam, or a warning for an optimizer that may not update
        atomically (:func:`tfc_harness.optimizers.for_parameter_server`): the workers' steps update the
        variables on the ps at once."""
        from .optimizers import for_parameter_server

        return for_parameter_server(optimizer)

    def training_note(self, optimizer):
        """The variables whose updates stayed Keras's own (a sparse gradient, ``amsgrad``): not atomic here."""
        from .optimizers import not_atomic_updates

        return not_atomic_updates(optimizer)

    def weights_io(self, model):
        """The weights read and the gradients sent in one tensor per ps and dtype (:mod:`tfc_harness.packing`),
        but for variables too large for that to pay."""
        from .packing import PACK_MAX_VARIABLE_BYTES, Packed

        packed = Packed.for_model(model)
        log_line("parameter_server: " + (packed.describe() if packed else "the trainable weights read and sent one "
                                         f"at a time (none packable: each over {PACK_MAX_VARIABLE_BYTES >> 20} MiB, "
                                         "or not a Keras variable)"))
        return packed

    def make_dataset(self, dataset_fn):
        return iter(self.coordinator.create_per_worker_dataset(dataset_fn))

    def make_train_fn(self, replica_step, dataset):
        import tensorflow as tf

        strategy, coordinator = self.tf_strategy, self.coordinator

        dispatch = self.dispatch = Dispatch(self.settings.num_workers)

        @tf.function(autograph=False)   # steps.run_steps
        def train_steps(iterator, k):
            return steps.run_steps(strategy, replica_step, iterator, k)

        def train(n: int) -> list[float]:
            """Schedule ``n`` steps, several per function, on whichever workers are free; wait for all; fetch
            the last functions' losses (each its last step's)."""
            sizes = dispatch.plan(n)
            started = time.monotonic()
            results = [coordinator.schedule(train_steps, args=(dataset, tf.constant(k, tf.int64))) for k in sizes]
            work, self.first_call_work = self.first_call_work, None
            if work is not None:
                do_first_call_work(work)
            coordinator.join()
            if dispatch.observe(sizes, time.monotonic() - started):
                log_line(f"parameter_server: {dispatch.steps} steps per scheduled function")
            return [float(r.fetch()) for r in results[-LOSS_SAMPLES:]]

        return train

    def while_first_call(self, work: Callable[[], None]) -> None:
        """``work`` runs in the first ``train(n)`` call once its functions are scheduled: the chief then waits
        ~0.4 s for the workers' first steps (traced and started there) with nothing to do.  (In a thread of its
        own beside the calls after, it took as long: the chief's Python dispatching the workers' functions
        waited for it.)"""
        self.first_call_work = work

    def steps_per_round(self) -> int:
        """One function of the current size per worker: a call of fewer steps leaves a worker idle until the
        call's end (a model whose step takes longer than the loop's chunk target ran one step a call, so one
        worker at a time)."""
        return self.settings.num_workers * (self.dispatch.steps if self.dispatch else 1)

    def checkpoint_dir(self) -> Path:
        # Per run, and kept across restarts of this chief: a checkpoint S3 could not take is not lost.
        return Path(self.settings.state_dir) / "checkpoints" / self.settings.run_id

    def checkpoint_options(self):
        import tensorflow as tf

        return tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
