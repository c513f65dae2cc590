"""The chief: coordinates training with ParameterServerStrategy, then evaluates and publishes.

Sequence: refuse an already published run; load the test split (it also gives the example shape); wait
until every ps and worker accepts connections; build model and optimizer in the strategy's scope
(variables on the ps); restore the newest checkpoint from S3 if there is one; run a custom training loop
(``model.fit`` does not work with this strategy under Keras 3) whose steps the ``ClusterCoordinator``
spreads over the workers, each reading its own local shard; checkpoint every ``checkpoint_every`` steps
(locally, then to S3); copy the weights into a local model, evaluate it on the test split, export a
SavedModel and publish it (:mod:`tfc_harness.publish`).  A watchdog ends the process with exit code 3
once ``max_runtime_s`` has passed, whatever it is blocked on.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

from . import checkpoints, data, publish, records, s3io, usermodel
from .evaluate import EVAL_BATCH, classification_metrics
from .settings import Settings
from .status import Progress, write_status

TIMEOUT_EXIT_CODE = 3
STALL_EXIT_CODE = 4
DEFAULT_STALL_TIMEOUT_S = 90  # no training step for this long: the coordinator is stuck
LOSS_SAMPLES = 8          # remote losses fetched per scheduling chunk
CHUNK_TARGET_S = 0.5      # aim for this much work between coordinator.join() calls


class HarnessError(RuntimeError):
    """A failure with a message meant for the operator."""


class ChiefState:
    """What the chief is doing, shared with the watchdog and the failure handler."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.phase = "starting"
        self.step = 0
        self.loss: float | None = None
        self.examples_per_sec: float | None = None

    def report(self, phase: str | None = None, **extra) -> None:
        if phase:
            self.phase = phase
        write_status(self.settings.state_dir, role="chief", phase=self.phase, step=self.step,
                     total=self.settings.steps, loss=self.loss, examples_per_sec=self.examples_per_sec,
                     **extra)


def log(msg: str) -> None:
    print(msg, flush=True)


UNPUBLISHED = "unpublished.json"


def mark_unpublished(settings: Settings, step: int, reason: str) -> None:
    """Record that this node holds training state S3 does not have (``down`` must not destroy it)."""
    path = Path(settings.state_dir) / UNPUBLISHED
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"run_id": settings.run_id, "step": step, "reason": reason,
                               "checkpoints": str(Path(settings.state_dir) / "checkpoints" / settings.run_id)}))
    os.replace(tmp, path)


def clear_unpublished(settings: Settings) -> None:
    (Path(settings.state_dir) / UNPUBLISHED).unlink(missing_ok=True)


class PeerMonitor:
    """Probes every ps and worker once a second during training; counts losses and rejoins.

    The ClusterCoordinator carries on without a lost worker and takes it back when it returns; this
    makes that visible (log lines, and ``peer_failures``/``peer_rejoins`` in the published metrics).
    """

    def __init__(self, peers: list[tuple[str, str]], interval_s: float = 1.0):
        self.peers = peers
        self.interval_s = interval_s
        self.up = {name: True for name, _ in peers}
        self.failures: dict[str, int] = {}
        self.rejoins: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="peer-monitor")

    def start(self) -> PeerMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            for name, address in self.peers:
                try:
                    with socket.create_connection(_host_port(address), timeout=1):
                        alive = True
                except OSError:
                    alive = False
                if alive != self.up[name]:
                    self.up[name] = alive
                    if alive:
                        self.rejoins[name] = self.rejoins.get(name, 0) + 1
                        log(f"peer {name} ({address}) is back")
                    else:
                        self.failures[name] = self.failures.get(name, 0) + 1
                        log(f"peer {name} ({address}) lost; training continues with the others")


class StallWatchdog:
    """Ends the chief when training makes no step for ``timeout_s``.

    A ClusterCoordinator can hang for good while it recovers a worker whose link came back; exiting lets
    the node's supervisor restart the chief, which resumes from the newest checkpoint.
    """

    def __init__(self, state: ChiefState, timeout_s: float):
        self.state, self.timeout_s = state, timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="stall-watchdog")

    def start(self) -> StallWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        last_step, since = self.state.step, time.monotonic()
        while not self._stop.wait(1.0):
            if self.state.step != last_step:
                last_step, since = self.state.step, time.monotonic()
            elif time.monotonic() - since > self.timeout_s and not self._stop.is_set():
                msg = (f"chief: no training progress for {self.timeout_s:.0f}s at step {last_step}; exiting so "
                       "that the supervisor restarts the chief from the newest checkpoint")
                try:
                    self.state.report("failed", error=msg)
                finally:
                    print(f"ERROR: {msg}", file=sys.stderr, flush=True)
                    os._exit(STALL_EXIT_CODE)


def start_watchdog(state: ChiefState, max_runtime_s: float) -> threading.Timer:
    """After ``max_runtime_s`` report failure and hard-exit (the main thread may be stuck in gRPC)."""
    def expire():
        msg = (f"chief: max_runtime_s={state.settings.max_runtime_s} exceeded during phase "
               f"{state.phase!r} at step {state.step}/{state.settings.steps}; giving up")
        try:
            state.report("failed", error=msg)
        finally:
            print(f"ERROR: {msg}", file=sys.stderr, flush=True)
            os._exit(TIMEOUT_EXIT_CODE)

    timer = threading.Timer(max_runtime_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def wait_for_peers(peers: list[tuple[str, str]], timeout_s: float, poll_s: float = 0.5) -> None:
    """Block until every ``(name, "host:port")`` accepts a TCP connection; HarnessError after timeout."""
    waiting = dict(peers)
    deadline = time.monotonic() + timeout_s
    next_note = time.monotonic()
    while True:
        for name, address in list(waiting.items()):
            try:
                with socket.create_connection(_host_port(address), timeout=2):
                    del waiting[name]
            except OSError:
                pass
        if not waiting:
            return
        now = time.monotonic()
        if now >= deadline:
            raise HarnessError(f"peers not reachable after {timeout_s:.0f}s: "
                               + ", ".join(f"{n} ({a})" for n, a in sorted(waiting.items())))
        if now >= next_note:
            log("waiting for " + ", ".join(f"{n} ({a})" for n, a in sorted(waiting.items())))
            next_note = now + 10
        time.sleep(poll_s)


def _build(spec, example_shape):
    model = spec.build_model()
    if not model.built:
        model.build((None, *example_shape))
    return model


def _predict(model, x: np.ndarray, from_logits: bool) -> np.ndarray:
    import tensorflow as tf

    out = []
    for start in range(0, len(x), EVAL_BATCH):
        scores = model(tf.constant(x[start:start + EVAL_BATCH]), training=False)
        out.append((tf.nn.softmax(scores) if from_logits else scores).numpy())
    return np.concatenate(out)


def run(settings: Settings) -> int:
    """Train, evaluate, publish.  Returns 0 only after ``_SUCCESS`` was written."""
    state = ChiefState(settings)
    watchdog = start_watchdog(state, settings.max_runtime_s)
    started = time.monotonic()
    try:
        return _run(settings, state, started)
    except Exception as exc:
        phase, msg = state.phase, f"{type(exc).__name__}: {exc}"
        state.report("failed", error=msg)
        print(f"ERROR: chief failed in phase {phase!r}: {msg}", file=sys.stderr, flush=True)
        return 1
    finally:
        watchdog.cancel()


def _run(settings: Settings, state: ChiefState, started: float) -> int:
    import keras
    import tensorflow as tf

    state.report("starting")
    s3 = settings.s3
    client = s3io.client_from_settings(settings)
    if publish.published(client, s3.bucket, s3.run_prefix):
        raise HarnessError(f"s3://{s3.bucket}/{s3.run_prefix}/{publish.SUCCESS} exists: this run was "
                           "already published; use a new run_id")
    spec = usermodel.load(settings.model_module)
    from_logits = usermodel.from_logits(spec)
    x_test, y_test = data.load_split(client, s3.bucket, s3.dataset_prefix, "test")
    example_shape = tuple(int(d) for d in x_test.shape[1:])

    # Leave the watchdog a little time so that an absent peer ends in an error naming it, not a timeout.
    remaining = max(1.0, settings.max_runtime_s - (time.monotonic() - started) - 2)
    wait_for_peers(settings.peers(), min(remaining, settings.start_timeout_s or remaining))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = _build(spec, example_shape)
        optimizer = usermodel.make_optimizer(spec, settings.learning_rate)
        optimizer.build(model.trainable_variables)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")

    # Checkpoint I/O happens on the chief: by default each ps would write its variables to its own disk.
    io_options = tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
    # Per run, and kept across restarts of this chief: a checkpoint S3 could not take is not lost.
    ckpt_dir = Path(settings.state_dir) / "checkpoints" / settings.run_id
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir), max_to_keep=checkpoints.KEEP,
                                         checkpoint_name=checkpoints.PREFIX)
    restored_from = 0
    local_step = int(manager.latest_checkpoint.rsplit("-", 1)[1]) if manager.latest_checkpoint else 0
    s3_steps = checkpoints.saved_steps(client, s3.bucket, s3.checkpoint_prefix)
    if local_step and local_step > (s3_steps[-1] if s3_steps else 0):
        ckpt.restore(manager.latest_checkpoint, options=io_options).assert_existing_objects_matched()
        restored_from = int(step_var.numpy())
        log(f"resumed from checkpoint at step {restored_from} (local, newer than S3)")
    else:
        latest = checkpoints.download_latest(client, s3.bucket, s3.checkpoint_prefix, ckpt_dir)
        if latest:
            ckpt.restore(str(latest[1]), options=io_options).assert_existing_objects_matched()
            restored_from = int(step_var.numpy())
            log(f"resumed from checkpoint at step {restored_from}")
    if restored_from > settings.steps:
        raise HarnessError(f"checkpoint step {restored_from} is beyond steps={settings.steps}")

    @tf.function
    def train_step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    y, out, from_logits=from_logits))
                if model.losses:
                    loss += tf.add_n(model.losses)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        x, y = next(iterator)
        losses = strategy.run(replica_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    dataset_fn = records.make_dataset_fn(example_shape, settings.batch_size)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    def save_checkpoint(step: int) -> None:
        step_var.assign(step)
        manager.save(checkpoint_number=step, options=io_options)
        try:
            checkpoints.upload(client, s3.bucket, s3.checkpoint_prefix, ckpt_dir, step)
        except Exception as exc:
            mark_unpublished(settings, step, f"checkpoint upload failed: {exc}")
            raise
        log(f"checkpoint saved at step {step}")

    step = state.step = restored_from
    progress = Progress(settings.steps, settings.batch_size, start_step=step)
    state.report("training")
    log(f"training {settings.steps - step} steps on {settings.num_workers} workers "
        f"(batch {settings.batch_size}, learning rate {settings.learning_rate})")
    chunk = 10
    monitor = PeerMonitor(settings.peers()).start()
    stall = StallWatchdog(state, settings.stall_timeout_s or DEFAULT_STALL_TIMEOUT_S).start()
    while step < settings.steps:
        boundary = min(settings.steps, (step // settings.checkpoint_every + 1) * settings.checkpoint_every)
        n = max(1, min(chunk, boundary - step))
        t0 = time.monotonic()
        results = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(n)]
        coordinator.join()
        step += n
        chunk = max(1, int(n * CHUNK_TARGET_S / max(time.monotonic() - t0, 1e-3)))
        state.step = step
        state.loss = float(np.mean([r.fetch() for r in results[-LOSS_SAMPLES:]]))
        state.examples_per_sec = progress.examples_per_sec(step)
        if progress.due() or step == settings.steps:
            log(progress.line(step, state.loss))
            state.report()
        if step == boundary:
            save_checkpoint(step)
    train_seconds = progress.elapsed()
    stall.stop()
    monitor.stop()

    state.report("evaluating")
    local_model = _build(spec, example_shape)   # outside the scope: variables on the chief
    local_model.set_weights(model.get_weights())
    metrics = classification_metrics(_predict(local_model, x_test, from_logits), y_test)
    log(f"test accuracy {metrics['test_accuracy']:.4f} loss {metrics['test_loss']:.4f} "
        f"({metrics['n']} examples)")

    state.report("publishing", accuracy=metrics["test_accuracy"])
    publish_started = time.monotonic()
    model_dir = Path(settings.state_dir) / "model"
    shutil.rmtree(model_dir, ignore_errors=True)
    publish.export_saved_model(local_model, example_shape, from_logits, model_dir)
    done_steps = settings.steps - restored_from
    run_metrics = {
        "test_accuracy": metrics["test_accuracy"],
        "test_loss": metrics["test_loss"],
        "steps": settings.steps,
        "examples_per_sec": round(done_steps * settings.batch_size / train_seconds, 1)
        if train_seconds > 0 and done_steps else 0.0,
        "train_seconds": round(train_seconds, 3),
        "workers": settings.num_workers,
        "restored_from_step": restored_from,
        "peer_failures": monitor.failures,
        "peer_rejoins": monitor.rejoins,
    }
    try:
        publish.publish_run(client, s3.bucket, s3.run_prefix, model_dir, run_metrics,
                            run_id=settings.run_id, cluster=settings.cluster,
                            dataset_prefix=s3.dataset_prefix, log=log)
    except Exception as exc:
        mark_unpublished(settings, settings.steps, f"publishing failed: {exc}")
        raise
    clear_unpublished(settings)
    state.report("done", accuracy=metrics["test_accuracy"],
                 publish_seconds=round(time.monotonic() - publish_started, 3))
    log("chief: done")
    return 0
