"""The nodes that run the training loop: it sequences small pieces, each with one job.

Under ``parameter_server`` only the chief runs the loop; under ``multi_worker_mirrored`` every task does,
and only the chief concludes (steps 5 and 6).

1. refuse an already published run; load the user's model module, its loss and metrics, and a few test
   examples (:mod:`tfc_harness.inputs`, which also give the example shape); build a local copy of the model
   and check its outputs against the labels, the loss and the metrics (:mod:`tfc_harness.usermodel`);
2. prepare this task's own share of the training data where it reads one, then wait until every peer
   accepts connections (the strategy's start barrier, :mod:`tfc_harness.peers`);
3. connect the strategy (:mod:`tfc_harness.strategies`; a strategy that must connect before TensorFlow
   runs anything, ``multi_worker_mirrored``, has the checks of step 1 done only now), build model and
   optimizer in its scope and restore the newest checkpoint (:mod:`tfc_harness.saver`);
4. train (:mod:`tfc_harness.loop`) under a peer monitor and a stall watchdog (:mod:`tfc_harness.watchdogs`);
5. copy the weights into the local model and evaluate the loss and metrics on the test split
   (:mod:`tfc_harness.evaluate`);
6. export a SavedModel and publish it with its metrics (:mod:`tfc_harness.publish`).

The chief writes TensorBoard summaries of training (at each progress line) and of the evaluation, copied to
S3 with each checkpoint, before publishing and when the run fails (:mod:`tfc_harness.summaries`).

A runtime watchdog ends the process with exit code 3 once ``max_runtime_s`` has passed, whatever it is
blocked on; any other failure is reported in status.json, the summaries so far are copied to S3, and it
ends with exit code 6 when a restart would fail the same way (:func:`tfc_harness.errors.is_final`: its
supervisor does not restart it), else 1.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

from . import evaluate as evaluation
from . import formats, inputs, loop, preemption, publish, s3io, unpublished, usermodel, watchdogs
from .errors import FINAL_EXIT_CODE, FinalError, bad_labels, described, is_final
from .peers import PeerMonitor
from .saver import Saver
from .settings import Settings
from .status import ChiefState, log_line
from .steps import make_replica_step
from .strategies import Strategy
from .summaries import NoSummaries, Summaries, learning_rate_of

# Kept importable from here: the exit codes the node's supervisor and the controller read.
TIMEOUT_EXIT_CODE = watchdogs.TIMEOUT_EXIT_CODE
STALL_EXIT_CODE = watchdogs.STALL_EXIT_CODE
FAILURE_UPLOAD_TRIES = 2   # a failed run's TensorBoard events: the store may be what failed, do not linger


log = log_line    # one write a line: threads log beside each other (status.log_line)


@dataclasses.dataclass
class Job:
    """What the chief trains and evaluates: the user's module and loss, the run's input, the example shape
    (once checked), and (once the strategy is connected) a copy of the model whose variables live on the
    chief, for evaluation and export."""

    module: ModuleType
    loss: object
    input: object
    hparams: dict
    summaries: NoSummaries = dataclasses.field(default_factory=NoSummaries)   # the chief's TensorBoard events
    example_shape: tuple[int, ...] | None = None
    local_model: object = None
    feed: object = None   # this task's data stream, when it reads its own share (kept alive while training)
    data_format: str | None = None    # the data files' format (None: the module's arrays)


def _repeats(exc: BaseException) -> bool:
    """Whether a restarted task would fail the same way: a final error (:func:`tfc_harness.errors.is_final`), or
    the data's own: a file a reader refused (:func:`tfc_harness.formats.bad_content`), a label outside the
    model's classes (:func:`tfc_harness.errors.bad_labels`; its message lists the batch's labels, so two tries'
    errors differ, and the supervisor's rule for the same error twice would not stop the restarts)."""
    return is_final(exc) or formats.bad_content(exc) or bad_labels(exc)


def run(settings: Settings, strategy: Strategy) -> int:
    """Train; the chief then evaluates and publishes.  Returns 0 only after training (and, on the chief,
    ``_SUCCESS``) was written, :data:`tfc_harness.preemption.PREEMPTED_EXIT_CODE` after saving the step reached
    on a preemption notice, :data:`tfc_harness.errors.FINAL_EXIT_CODE` on a failure a restart would repeat
    (:func:`_repeats`), 1 on another failure."""
    state = ChiefState(settings.state_dir, settings.steps, role=settings.role, run_id=settings.run_id)
    watchdog = watchdogs.start_runtime_watchdog(state, settings.max_runtime_s, settings.steps)
    started = time.monotonic()
    summaries = Summaries.for_task(settings, strategy)
    try:
        return _run(settings, strategy, state, started, summaries)
    except preemption.Preempted as exc:
        state.report("preempted", error=str(exc))
        log(f"{settings.role} {settings.index}: {exc}; ending (the next train resumes from it)")
        summaries.upload(tries=FAILURE_UPLOAD_TRIES)
        return preemption.PREEMPTED_EXIT_CODE
    except Exception as exc:
        phase, msg = state.phase, f"{type(exc).__name__}: {exc}"
        state.report("failed", error=described(exc))   # one line (the log has all of it)
        who = "chief" if settings.role == "chief" else f"{settings.role} {settings.index}"   # (every mirrored task)
        print(f"ERROR: {who} failed in phase {phase!r}: {msg}", file=sys.stderr, flush=True)
        summaries.upload(tries=FAILURE_UPLOAD_TRIES)   # best effort, after the error is out
        return FINAL_EXIT_CODE if _repeats(exc) else 1
    finally:
        watchdog.cancel()


@dataclasses.dataclass
class Trained:
    """What training leaves for the conclusion: the distributed model, where it started and how long it took."""

    model: object
    restored: int
    loop_time: loop.LoopTime
    monitor: PeerMonitor


def _run(settings: Settings, strategy: Strategy, state: ChiefState, started: float,
         summaries: NoSummaries) -> int:
    state.report("starting")
    client = s3io.client_from_settings(settings)
    summaries.use_client(client)
    refuse_published(client, settings)
    job = load_job(client, settings, strategy)
    job.summaries = summaries
    trained = train(settings, strategy, state, client, job, started)
    if not strategy.publishes():
        state.report("done")
        log(f"{settings.role} {settings.index}: done")
        return 0
    conclude(settings, strategy, state, client, job, trained)
    log("chief: done")
    return 0


def train(settings: Settings, strategy: Strategy, state: ChiefState, client, job: Job, started: float) -> Trained:
    """The part every loop-running task shares: its data, the start barrier, connect, restore, train."""
    job.feed = state.feed = strategy.prepare_input(job.input)
    # Leave the runtime watchdog a little time so that an absent peer ends in an error naming it.
    remaining = max(1.0, settings.max_runtime_s - (time.monotonic() - started) - 2)
    strategy.wait_for_peers(min(remaining, settings.start_timeout_s or remaining))
    strategy.connect()
    if job.example_shape is None:
        check_job(job)
    model, optimizer, note = build_distributed(strategy, job, settings.learning_rate)
    add_note(state, note)
    job.summaries.watch_learning_rate(learning_rate_of(optimizer))
    saver = Saver(strategy, client, model, optimizer)
    restored = state.step = saver.restore()

    # the events copied with each checkpoint, beside training: a run in progress can be looked at
    saver.after_each_upload(job.summaries.upload)

    def save(step: int) -> None:
        saver.save(step)
        if step == settings.steps:   # the last: in S3 within the loop's time, as every save was when uploads blocked
            saver.wait_uploaded()

    replica_step = make_replica_step(model, optimizer, job.loss, strategy.weights_io(model))
    train_fn = noting(strategy, optimizer, state,
                      strategy.make_train_fn(replica_step,
                                             strategy.make_dataset(job.input.dataset_fn(settings.batch_size))))
    strategy.while_first_call(saver.warm_up)
    log(f"training {settings.steps - restored} steps on {settings.num_training_tasks} training tasks "
        f"(batch {settings.batch_size}, learning rate {settings.learning_rate})")
    if strategy.publishes():
        preemption.clear(client, settings)    # an earlier attempt's notices are not this one's
    watch_s3 = client if strategy.publishes() and strategy.has_serving_tasks else None   # their markers
    with PeerMonitor(settings.peers()) as monitor, \
            watchdogs.StallWatchdog(state, settings.stall_timeout_s or watchdogs.DEFAULT_STALL_TIMEOUT_S), \
            preemption.Notices(settings, watch_s3, strategy.agree) as notices, saver.uploads():
        loop_time = loop.train(train_fn, state, examples_per_step=strategy.examples_per_step(),
                                   checkpoint_every=settings.checkpoint_every,
                                   min_interval_s=settings.checkpoint_min_interval_s, save=save,
                                   on_report=job.summaries.training,
                                   notices=notices, finite=saver.finite, round_steps=strategy.steps_per_round)
    # the traced functions outlive the run: dropped here, each one's deletion has TensorFlow remove it from
    # the context, which under parameter_server held the chief ~30 s at times between its last checkpoint and
    # its evaluation (py-spy: AtomicFunction.__del__ -> Context.remove_function). The process ends with
    # os._exit (runner.end_now), so they are never removed; one run's at a time (in-process tests run several)
    _TRACED[:] = [train_fn, replica_step, saver]
    return Trained(model, restored, loop_time, monitor)


#: the last run's traced functions, kept until the process ends (see :func:`train`)
_TRACED: list = []


def noting(strategy: Strategy, optimizer, state: ChiefState, train_fn):
    """``train_fn``, adding the strategy's note about the traced step (:meth:`Strategy.training_note`) to the
    chief's notes once, after the call that traced it."""
    def train(n: int):
        losses = train_fn(n)
        add_note(state, strategy.training_note(optimizer))
        return losses

    return train


def add_note(state: ChiefState, note: str | None) -> None:
    """A line for the user, in the log and once in the chief's status (the controller prints it with the
    progress)."""
    if note and note not in state.notes:
        log(note)
        state.notes.append(note)


def conclude(settings: Settings, strategy: Strategy, state: ChiefState, client, job: Job, trained: Trained) -> None:
    """The chief's part after training: evaluate, then export and publish with the run's metrics."""
    metrics = evaluate(state, job, trained.model)
    job.summaries.evaluation(settings.steps, metrics)
    job.summaries.upload()
    run_metrics = dict(metrics, **training_metrics(settings, strategy, trained), data=job.input.describe())
    publish_model(client, settings, state, job, run_metrics, strategy.checkpoint_dir())


def refuse_published(client, settings: Settings) -> None:
    """A run is published once; training again under the same run_id would overwrite it."""
    s3 = settings.s3
    if publish.published(client, s3.bucket, s3.run_prefix):
        raise FinalError(f"s3://{s3.bucket}/{s3.run_prefix}/{publish.SUCCESS} exists: this run was "
                         "already published; use a new run_id")


def load_job(client, settings: Settings, strategy: Strategy) -> Job:
    """The user's module, its loss and the run's input; checked on a few test examples before any peer is
    asked, unless the strategy must connect before TensorFlow runs anything (then after connecting)."""
    module = usermodel.load(settings.model_module)
    job = Job(module, usermodel.loss_fn(module), inputs.for_settings(settings, client, module),
              dict(settings.hparams), data_format=settings.data.format if settings.data else None)
    if not strategy.connects_before_tensorflow:
        check_job(job)
    return job


def check_job(job: Job) -> None:
    """The example shape, and a local model checked against labels, loss and metrics on a few test examples."""
    x, y = job.input.probe()
    job.example_shape = tuple(int(d) for d in x.shape[1:])
    # A throwaway copy: variables made before the strategy connects cannot be used after it did.
    probe = usermodel.build_model(job.module, job.example_shape, job.hparams)
    usermodel.check_batch(job.module, probe, x, y, job.loss, job.data_format)


def build_distributed(strategy: Strategy, job: Job, learning_rate: float):
    """Model and optimizer in the (connected) strategy's scope, the local copy (``job.local_model``) outside;
    and the strategy's line about the optimizer, if any (:meth:`Strategy.adapt_optimizer`)."""
    with strategy.scope():
        model = usermodel.build_model(job.module, job.example_shape, job.hparams)
        optimizer, note = strategy.adapt_optimizer(usermodel.make_optimizer(job.module, learning_rate))
        optimizer.build(model.trainable_variables)
    job.local_model = usermodel.build_model(job.module, job.example_shape, job.hparams)
    return model, optimizer, note


def evaluate(state: ChiefState, job: Job, model) -> dict:
    """Copy the trained weights into the chief's local model; its loss and metrics on the test split."""
    state.report("evaluating")
    job.local_model.set_weights(model.get_weights())
    metrics = usermodel.metric_objects(job.module, job.loss)
    # the verifier's batch size too: a metric that is not batch-invariant still compares equal
    result = evaluation.evaluate(evaluation.keras_predictor(job.local_model),
                                 job.input.test_batches(evaluation.EVAL_BATCH), job.loss, metrics)
    n = result.pop("n")
    result["headline"] = evaluation.headline(metrics)
    log(" ".join(f"{k.removeprefix('test_')} {v:.4f}" for k, v in result.items() if k.startswith("test_"))
        + f" on {n} test examples")
    return dict(result, test_examples=n)


def training_metrics(settings: Settings, strategy: Strategy, trained: Trained) -> dict:
    """The published metrics about training itself (this run's part of it, from ``trained.restored`` on)."""
    done = settings.steps - trained.restored
    seconds, per_step = trained.loop_time.seconds, strategy.examples_per_step()
    after_first_call = trained.loop_time.examples_per_sec_after_first_call(done, per_step)
    return {
        "steps": settings.steps,
        "examples_per_sec": round(done * per_step / seconds, 1) if seconds > 0 and done else 0.0,
        "examples_per_sec_after_first_call": after_first_call and round(after_first_call, 1),
        "train_seconds": round(seconds, 3),
        "workers": settings.num_training_tasks,
        "restored_from_step": trained.restored,
        "peer_failures": trained.monitor.failures,
        "peer_rejoins": trained.monitor.rejoins,
    }


def publish_model(client, settings: Settings, state: ChiefState, job: Job, run_metrics: dict,
                  checkpoint_dir: Path) -> None:
    """Export the SavedModel and publish it; a failure leaves the unpublished marker for ``down``."""
    headline = run_metrics["headline"]
    state.report("publishing", metric=headline, value=run_metrics[headline])
    started = time.monotonic()
    model_dir = Path(settings.state_dir) / "model"
    shutil.rmtree(model_dir, ignore_errors=True)
    publish.export_saved_model(job.local_model, job.example_shape, usermodel.probability_fn(job.loss), model_dir)
    s3 = settings.s3
    try:
        publish.publish_run(client, s3.bucket, s3.run_prefix, model_dir, run_metrics, run_id=settings.run_id,
                            cluster=settings.cluster, log=log)
    except Exception as exc:
        unpublished.mark(settings.state_dir, settings.run_id, settings.steps, f"publishing failed: {exc}",
                         checkpoint_dir)
        raise
    unpublished.clear(settings.state_dir)
    state.report("done", metric=headline, value=run_metrics[headline],
                 publish_seconds=round(time.monotonic() - started, 3))
