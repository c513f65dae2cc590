"""Tasks that only serve: TensorFlow's gRPC server until stopped.

A ``parameter_server`` worker prepares its data first (:mod:`tfc_harness.inputs`), so a worker that
accepts connections always has its data (or is streaming it).  A serving task never exits by itself: the
playbook stops it.  A preemption notice (SIGUSR1 from the node's supervisor, or SIGTERM) is passed on to
the chief through S3 (:mod:`tfc_harness.preemption`).  While it serves, its status.json is refreshed with
the data stream's figures (bytes, MB/s, epoch), which ``make status`` and the progress lines show.
Stopped (SIGINT from the supervisor), it leaves at once: it holds nothing to save, and Python's and
TensorFlow's own teardown of a serving process took ~2.5 s of every run's stop here.
"""

from __future__ import annotations

import os
import signal
import sys

from . import preemption, s3io, threads
from .settings import Settings
from .status import write_status

STATUS_EVERY_S = 1.0   # a stream can run through gigabytes in seconds: its figures must show in time
STOPPED_EXIT_CODE = 128 + signal.SIGINT


#: what a stopped task removes before it leaves (a worker's kept stream files: :meth:`stream.Prefetcher.discard`)
_ON_STOP: list = []


def _leave_at_once(signum, frame) -> None:
    try:   # the main thread may be printing itself (a reentrant print raises): leave whatever happens
        for discard in _ON_STOP:
            discard()
        print("stopped: leaving without TensorFlow's teardown (a serving task holds nothing to save)", flush=True)
        sys.stderr.flush()
    finally:
        os._exit(STOPPED_EXIT_CODE)


def serve(settings: Settings, feed=None) -> int:
    """Start the server from TF_CONFIG (already set by the runner), report ``serving`` and serve until killed.

    ``feed`` is a worker's data stream (anything with ``stats() -> dict``), or None."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc",
                                  config=threads.server_config(settings.threads and settings.threads.model_dump()),
                                  start=True)
    address = settings.cluster_spec[settings.role][settings.index]
    if callable(getattr(feed, "discard", None)):
        _ON_STOP.append(feed.discard)
    signal.signal(signal.SIGINT, _leave_at_once)
    write_status(settings.state_dir, role=settings.role, phase="serving", address=address)
    print(f"{settings.role} {settings.index}: serving on {address}", flush=True)
    while server is not None:   # always: `server` stays referenced, it serves as long as this process lives
        if preemption.NOTICE.wait(STATUS_EVERY_S):   # a preemption notice: tell the chief, which saves at once
            preemption.NOTICE.clear()
            preemption.mark(s3io.client_from_settings(settings), settings)
        extra = {"data": feed.stats()} if feed is not None else {}
        write_status(settings.state_dir, role=settings.role, phase="serving", address=address, **extra)
