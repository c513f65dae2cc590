"""Distribution strategies: the cluster shape each needs, and the interface each implements.

This module imports neither TensorFlow nor pydantic, so the controller can read :data:`SHAPES` to check
a cluster file and to tell the boilerplate play what the inventory must hold.  Each strategy is a small
module of its own (``parameter_server``: :mod:`tfc_harness.parameter_server`) that subclasses
:class:`Strategy`, with a row in :data:`REGISTERED`; :func:`get` imports it by name.

A shape maps each job (TensorFlow task type) to ``(minimum, maximum)`` task counts, ``None`` for no
maximum.  Jobs absent from a strategy's shape must not appear in its cluster.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

DEFAULT_STRATEGY = "parameter_server"


class Registered(NamedTuple):
    """What the controller and every node know of a strategy before importing it (no TensorFlow)."""

    #: ``{job: (minimum, maximum)}`` task counts, None for no maximum: the one statement of the strategy's
    #: cluster shape (config validation, the boilerplate play, the harness)
    shape: dict[str, tuple[int, int | None]]
    #: the jobs whose tasks consume training data, in the order their tasks are numbered as training tasks
    #: (training task i reads the i-th share of the data: rows i::n of the arrays, or the i-th list of files)
    training_jobs: tuple[str, ...]
    #: ``"module:class"`` under tfc_harness, imported only when a node runs the strategy (:func:`get`)
    implementation: str


# Each strategy, in one row: adding one is its module and a row here.
REGISTERED: dict[str, Registered] = {
    "parameter_server": Registered(shape={"ps": (1, None), "worker": (1, None), "chief": (1, 1)},
                                   training_jobs=("worker",),
                                   implementation="parameter_server:ParameterServer"),
    "multi_worker_mirrored": Registered(shape={"worker": (1, None), "chief": (1, 1)},
                                        training_jobs=("chief", "worker"),
                                        implementation="multi_worker:MultiWorkerMirrored"),
}
SHAPES = {name: r.shape for name, r in REGISTERED.items()}
TRAINING_JOBS = {name: r.training_jobs for name, r in REGISTERED.items()}

# Every job any strategy knows, in the order TF_CONFIG lists them.
JOB_ORDER = ("ps", "worker", "chief")


# The jobs whose tasks use object storage: the training jobs (each reads its data) and the chief (it also reads
# and writes the run's checkpoints and publishes the model).  A ps task only holds variables: its node gets
# no storage credentials and no cloud identity (see tfcluster.access).
def storage_jobs(strategy: str) -> tuple[str, ...]:
    """The jobs of ``strategy`` whose tasks read or write object storage, in :data:`JOB_ORDER`."""
    shape_for(strategy)
    return tuple(job for job in JOB_ORDER if job in TRAINING_JOBS[strategy] or job == "chief")


def names() -> tuple[str, ...]:
    """The strategy names, for ``strategy:`` choices and error messages."""
    return tuple(SHAPES)


def shape_for(strategy: str) -> dict[str, tuple[int, int | None]]:
    """The ``{job: (min, max)}`` table of ``strategy``; ValueError naming the allowed names."""
    try:
        return SHAPES[strategy]
    except KeyError:
        raise ValueError(f"unknown strategy {strategy!r}; allowed: {list(SHAPES)}") from None


def training_tasks(strategy: str, counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """The ``(job, index)`` of every task that trains on its own share of the data, in share order.

    ``training_tasks("multi_worker_mirrored", {"worker": 2, "chief": 1})``
    -> ``[("chief", 0), ("worker", 0), ("worker", 1)]``
    """
    shape_for(strategy)
    return [(job, i) for job in TRAINING_JOBS[strategy] for i in range(counts.get(job, 0))]


def training_task_count(strategy: str, counts: Mapping[str, int]) -> int:
    """How many shares the training data is cut into for ``strategy`` with ``{job: task count}``."""
    return len(training_tasks(strategy, counts))


def describe_count(low: int, high: int | None) -> str:
    """``exactly 1`` / ``>= 1`` / ``1 to 4``: how many tasks of a job a shape allows."""
    if high is None:
        return f">= {low}"
    return f"exactly {low}" if low == high else f"{low} to {high}"


def shape_problems(strategy: str, counts: Mapping[str, int]) -> list[str]:
    """What is wrong with ``{job: task count}`` for ``strategy``; empty when the shape fits.

    Each problem names the job, the count given and what is allowed, e.g.
    ``chief: 2 task(s); parameter_server needs exactly 1``.
    """
    shape = shape_for(strategy)
    problems = [f"{job}: {counts[job]} task(s); {strategy} has no {job} job"
                for job in counts if job not in shape and counts[job]]
    for job, (low, high) in shape.items():
        n = counts.get(job, 0)
        if n < low or (high is not None and n > high):
            problems.append(f"{job}: {n} task(s); {strategy} needs {describe_count(low, high)}")
    return problems


class Strategy(abc.ABC):
    """One distribution strategy on one node: what its tasks run and how the loop drives training.

    A node that does not run the training loop (:meth:`runs_loop` is False, e.g. a parameter server or a
    worker) calls :meth:`serve` and nothing else.  A node that runs the loop calls, in order: :meth:`connect`;
    builds model and optimizer inside :meth:`scope`; :meth:`make_dataset`; :meth:`make_train_fn`; then
    the loop calls the train function with a step count, and checkpoints go to :meth:`checkpoint_dir`
    with :meth:`checkpoint_options`.
    """

    name: str = ""
    # TensorFlow configures collective ops only before its runtime starts: such a strategy connects before
    # the harness runs any TensorFlow op (the model check waits until then; data preparation uses none).
    connects_before_tensorflow: bool = False

    #: whether some of the strategy's tasks only serve (they report a preemption notice through S3)
    has_serving_tasks = True
    #: whether a task that ran the loop ends at once when done, skipping the interpreter's shutdown
    #: (:func:`tfc_harness.runner.end_now`)
    ends_without_shutdown = False
    #: whether the model's variables sit on other tasks than the loop's (the parameter servers): the loop's
    #: task then reads them in functions traced once (:mod:`tfc_harness.traced`: the finite check and the
    #: checkpoint's write before each save), not op by op, a round trip each
    variables_on_other_tasks = False

    def __init__(self, settings):
        self.settings = settings

    @property
    def shape(self) -> dict[str, tuple[int, int | None]]:
        return shape_for(self.name)

    @abc.abstractmethod
    def runs_loop(self) -> bool:
        """Whether this node runs the training loop (and then evaluates and publishes)."""

    @abc.abstractmethod
    def serve(self) -> int:
        """Run a task that does not run the loop until it is stopped; returns an exit code."""

    @abc.abstractmethod
    def connect(self) -> None:
        """Build the ``tf.distribute`` strategy (and whatever dispatches steps) from ``TF_CONFIG``."""

    @abc.abstractmethod
    def scope(self):
        """Context manager under which the model's and optimizer's variables are created."""

    @abc.abstractmethod
    def make_dataset(self, dataset_fn: Callable) -> Any:
        """The input the train function reads, from ``dataset_fn`` (each worker's own batches; see
        :meth:`tfc_harness.inputs.ArrayInput.dataset_fn`)."""

    @abc.abstractmethod
    def make_train_fn(self, replica_step: Callable, dataset: Any) -> Callable[[int], list[float]]:
        """``train(n)``: run ``n`` steps of ``replica_step(x, y) -> loss``; returns some of their losses."""

    def while_first_call(self, work: Callable[[], None]) -> None:
        """Have ``work`` done while the first ``train(n)`` call waits for steps on other tasks, where the loop's
        task then idles (the saver's warm-up: :meth:`tfc_harness.saver.Saver.warm_up`).  Here at once."""
        work()

    @abc.abstractmethod
    def checkpoint_dir(self) -> Path:
        """Where this node writes checkpoints (a chief's directory is the one mirrored to S3)."""

    @abc.abstractmethod
    def checkpoint_options(self):
        """``tf.train.CheckpointOptions`` for saving and restoring."""

    def writes_published_checkpoints(self) -> bool:
        """Whether this node's checkpoints are the run's (uploaded to S3); others' are scratch copies."""
        return self.settings.role == "chief"

    def publishes(self) -> bool:
        """Whether this node, after training, evaluates, exports and publishes the model."""
        return self.settings.role == "chief"

    def prepare_input(self, source) -> Any:
        """Before connecting: make this loop-running task's own share of the training data available
        (``source`` is a :mod:`tfc_harness.inputs` input).  Returns what must stay alive while training
        (a stream), or None.  Nothing to do where the loop's node reads no training data itself."""
        return None

    def wait_for_peers(self, timeout_s: float) -> None:
        """The start barrier: block until every other task accepts connections; HarnessError naming the
        missing ones after ``timeout_s``."""
        from .peers import wait_for_peers

        wait_for_peers(self.settings.peers(), timeout_s)

    def examples_per_step(self) -> int:
        """Training examples one step consumes (for examples/s)."""
        return self.settings.batch_size

    def steps_per_round(self) -> int:
        """The fewest steps of a ``train(n)`` call that keep every training task busy until the call's end
        (the loop's chunks are whole rounds of it): 1 where every task takes part in each step."""
        return 1

    def agree(self, stop: bool, chunk: int, due: bool) -> tuple[bool, int, bool]:
        """Whether the training tasks stop now, how many steps their next ``train(n)`` call runs and whether a
        checkpoint is due (saved at the next ``checkpoint_every`` boundary), from this task's ``stop`` (a
        preemption notice), its own ``chunk`` (what its last call's time suggests, see
        :func:`tfc_harness.loop.next_chunk`) and its own ``due`` (its clock, see :func:`tfc_harness.loop.train`).
        One task runs the loop here: its own; a synchronous strategy makes its tasks agree, as they must issue
        the same calls and save the same checkpoints."""
        return stop, chunk, due

    def adapt_optimizer(self, optimizer) -> tuple[Any, str | None]:
        """The optimizer this strategy trains with, given the model module's ``optimizer`` (that object,
        changed or not, or another), and a line for the user about it (None: nothing to say).  Called in
        :meth:`scope`, before the optimizer is built.  Here: the module's, as it is."""
        return optimizer, None

    def weights_io(self, model):
        """How a replica step reads ``model``'s trainable weights and sends their gradients (the ``weights`` of
        :func:`tfc_harness.steps.make_replica_step`).  Here None: the model reads its own variables."""
        return None

    def training_note(self, optimizer) -> str | None:
        """A line for the user about the optimizer that only its traced train step shows (called after each
        ``train(n)`` call; a line already noted is not noted again), or None.  Here: none."""
        return None

    def prefers_local_checkpoints(self) -> bool:
        """Whether a local checkpoint newer than S3's (its upload failed) is restored instead of S3's.
        Not where every task must restore the same checkpoint: only S3's is common to all."""
        return True


def get(strategy: str) -> type[Strategy]:
    """The :class:`Strategy` subclass registered under ``strategy`` (imports its module)."""
    shape_for(strategy)
    module_name, class_name = REGISTERED[strategy].implementation.split(":")
    cls = getattr(importlib.import_module(f"{__package__}.{module_name}"), class_name)
    if cls.name != strategy:
        raise AssertionError(f"{cls.__name__}.name is {cls.name!r}, registered as {strategy!r}")
    return cls
