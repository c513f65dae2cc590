"""Entry point for one node: validate settings, prepare the process, run the node's part of its strategy.

Order matters: the TensorFlow environment variables (quiet logs, ``TF_CONFIG``) are set before anything
imports TensorFlow, and the process moves into ``state_dir`` so that the relative shard path in
:mod:`tfc_harness.records` names each node's own file.  TensorFlow's default kernels stay on (oneDNN: a
CNN step is ~1.5x slower without them); only its C++ log level is raised, its gRPC channels ping a silent
peer (:data:`GRPC_ENV`), and tensors come from its BFC allocator (:data:`ALLOCATOR_ENV`).  The thread pools are sized
(:mod:`tfc_harness.threads`) before the strategy runs any op, and the task's log says how.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import preemption, strategies, tfimport, threads
from . import settings as settings_mod
from .status import write_status

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}
#: tensors from TensorFlow's own (BFC) allocator, which keeps the memory it freed for the next step: through
#: glibc's malloc a task's many threads (~120 under multi_worker_mirrored) had their large buffers unmapped and
#: faulted in again every step (shapes32 tasks: ~41,000 page faults/s, a quarter of their CPU in the kernel,
#: against ~14,000 in a plain process). Read when the first op makes the CPU allocator, so it holds in a task
#: forked from the warm interpreter, which imported TensorFlow without it. Its limit defaults to 64 GiB in
#: TensorFlow: the task's memory is given instead. A value in the task's environment is kept (``false``: off).
ALLOCATOR_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}
ALLOCATOR_LIMIT_ENV = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
#: gRPC keepalive on the channels TensorFlow opens from the task (read once, when the process makes its first
#: channel: after the fork from the warm interpreter, which makes none). Without it a call to a peer that stops
#: answering without closing its connection (a cut link, a VM gone without a reset: a partition, a host failure)
#: waits for TCP to give up (~15 min), and the ClusterCoordinator's join on that call holds the whole loop: a local
#: worker's link cut for 30 s left the chief without a step for 56 s, 25 s of them after the link was back. With
#: pings after 5 s of silence and 5 s for their answer the call fails as unavailable, the coordinator gives its
#: steps to the other workers and takes the worker back once it answers (the same cut with 2 s / 4 s: ~8 s without a
#: step, then one worker's rate until the link came back, then both). It covers a cut while calls come and go (a
#: scheduled function is a few tenths of a second): gRPC sends a silent transport 2 pings at most, and TensorFlow's
#: servers keep gRPC's ping policy (it refuses more), so a call silent for longer is waited for as before; a 40 s
#: function on a worker kept its channel (2 s / 4 s). A value in the task's environment is kept.
GRPC_ENV = {"TF_GRPC_DEFAULT_OPTIONS": "grpc.keepalive_time_ms=5000,grpc.keepalive_timeout_ms=5000"}
MEMINFO = "/proc/meminfo"
#: the process's cgroups (``hierarchy:controllers:path`` lines) and where the hierarchies are mounted
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
#: the task's temporary directory, in its state_dir
TMP_DIR = "tmp"


def set_tf_env() -> None:
    """The TensorFlow variables of every task (:data:`TF_ENV`, :data:`GRPC_ENV`, :data:`ALLOCATOR_ENV` and its
    limit)."""
    os.environ.update(TF_ENV)
    for key, value in {**GRPC_ENV, **ALLOCATOR_ENV}.items():
        os.environ.setdefault(key, value)
    if ALLOCATOR_LIMIT_ENV not in os.environ:     # an operator's limit, or the one set by the call before
        limit = memory_mb()
        if limit:
            os.environ[ALLOCATOR_LIMIT_ENV] = str(limit)


def memory_mb() -> int | None:
    """The memory this task may use in MiB: the machine's (``MemTotal``), or the lowest memory limit of its
    cgroup and the cgroups above it where that is lower (a local node's limit is its own cgroup's, not the
    root's); None when nothing can be read."""
    found = []
    try:
        with open(MEMINFO) as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:")]
    except (OSError, ValueError, IndexError):
        pass
    found += cgroup_limits()
    return min(found) >> 20 if found else None


def cgroup_limits() -> list[int]:
    """The memory limits in bytes of this process's cgroup and each one above it: cgroup v2's ``memory.max``,
    v1's ``memory.limit_in_bytes`` (its "no limit" is a huge number); none where a file is absent or "max"."""
    try:
        with open(PROC_CGROUP) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            base, name = CGROUP_ROOT, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = os.path.join(CGROUP_ROOT, "memory"), "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p not in ("", ".", "..")]
        for depth in range(len(parts), -1, -1):
            try:
                with open(os.path.join(base, *parts[:depth], name)) as f:
                    found.append(int(f.read().strip()))
            except (OSError, ValueError):     # absent (the root has none), or "max"
                pass
    return found


def prepare_process(settings: settings_mod.Settings) -> settings_mod.Settings:
    """Set TF env vars and TF_CONFIG, create and enter ``state_dir``, give the process its own temporary
    directory there; returns settings with ``state_dir`` absolute."""
    set_tf_env()
    state_dir = Path(settings.state_dir).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(state_dir)
    use_private_tmp(state_dir / TMP_DIR)
    os.environ["TF_CONFIG"] = settings.tf_config_json()
    return settings.model_copy(update={"state_dir": str(state_dir)})


def use_private_tmp(directory: Path) -> None:
    """Point the process's temporary files at ``directory``, emptied first. TensorFlow's AutoGraph writes a
    file there for each function it converts and removes them only at an orderly interpreter exit, which a
    task skips (:func:`end_now`, a stopped server): in the machine's /tmp they piled up run after run."""
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    shutil.rmtree(directory, ignore_errors=True)    # what it cannot remove stays: it must not stop the task
    directory.mkdir(mode=0o700, exist_ok=True)
    directory.chmod(0o700)
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = str(directory)


def serve(strategy: strategies.Strategy) -> int:
    """Run a task that does not run the loop; a failure is reported in status.json and returns 1."""
    settings = strategy.settings
    try:
        write_status(settings.state_dir, role=settings.role, phase="starting")
        return strategy.serve()
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        write_status(settings.state_dir, role=settings.role, phase="failed", error=msg)
        print(f"ERROR: {settings.role} {settings.index} failed: {msg}", file=sys.stderr, flush=True)
        return 1


def main(raw_settings: dict) -> int:
    """Run this node's part; returns the process exit code (0 success, 1 failure, 2 bad settings,
    3 chief timeout, 4 chief stalled, 5 preempted after saving, 6 a failure a restart would repeat).
    Serving tasks only return on failure: they serve until killed (SIGINT, SIGKILL; SIGTERM and SIGUSR1 are a
    preemption notice)."""
    set_tf_env()
    preemption.listen()
    try:
        settings = settings_mod.validate(raw_settings)
    except settings_mod.SettingsError as exc:
        print(f"ERROR: invalid settings: {exc}", file=sys.stderr, flush=True)
        return 2
    settings = prepare_process(settings)
    print(f"tfc_harness: {settings.role} {settings.index} of cluster {settings.cluster} "
          f"run {settings.run_id} ({settings.strategy}) in {settings.state_dir}", flush=True)
    tfimport.import_tensorflow()    # the warm interpreter a node's task is forked from imported it; else the lean way
    print(threads.apply(settings.threads.model_dump() if settings.threads else None), flush=True)
    strategy = strategies.get(settings.strategy)(settings)
    if not strategy.runs_loop():
        return serve(strategy)
    from . import chief
    try:
        code = chief.run(settings, strategy)
    except KeyboardInterrupt:   # SIGINT: the supervisor stopped the task (a Ctrl-C of train, a run's end)
        from .server import STOPPED_EXIT_CODE

        print(f"{settings.role} {settings.index}: stopped (SIGINT); a next train resumes from the last "
              "checkpoint", file=sys.stderr, flush=True)
        code = STOPPED_EXIT_CODE
    if strategy.ends_without_shutdown:
        end_now(code)
    return code


def end_now(code: int) -> None:
    """End the process at once, its output flushed: after a synchronous run the interpreter's own shutdown
    waits for TensorFlow's coordination service, which stalls or fails once a peer has ended first (seen:
    workers done and still alive after the chief had exited); after a parameter-server run it spends about a
    second tearing TensorFlow down.  Everything the run leaves is written by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
