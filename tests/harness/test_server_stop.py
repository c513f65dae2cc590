"""A serving task stopped by its supervisor (SIGINT) leaves at once with exit code 130 and says so, without
Python's and TensorFlow's teardown (tfc_harness.server)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tfc_harness import server

TRAIN = Path(__file__).resolve().parents[2] / "train"
CHILD = """
import shutil, signal, sys, threading, time
from tfc_harness import server
server._ON_STOP.append(lambda: shutil.rmtree(sys.argv[1]))     # as a worker's kept stream files
signal.signal(signal.SIGINT, server._leave_at_once)
threading.Thread(target=time.sleep, args=(600,)).start()   # a live non-daemon thread: a normal exit would wait
print("ready", flush=True)
while True:
    print("busy", file=sys.stderr)    # printing when the signal lands must not keep it from leaving
"""


def test_a_stopped_serving_task_leaves_at_once_with_130(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "0").write_bytes(b"a kept file")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(kept)], cwd=TRAIN, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
        took = time.monotonic() - sent
        out = proc.stdout.read()
    finally:
        proc.kill()
    assert code == server.STOPPED_EXIT_CODE == 130
    assert "stopped: leaving without TensorFlow's teardown" in out
    assert took < 10      # a thread sleeping 600 s would have held a normal exit
    assert not kept.exists()      # what it had to remove first is gone


@pytest.mark.parametrize("ends_without_shutdown", [False, True])     # parameter_server's chief; all-reduce tasks
def test_a_stopped_loop_running_task_says_so_and_exits_130_without_a_traceback(monkeypatch, capsys,
                                                                              ends_without_shutdown):
    """The chief (and, under all-reduce, every task) runs the loop: SIGINT, the supervisor's stop after a Ctrl-C of
    train, reaches it as KeyboardInterrupt, which ends it with one line (its log is what make logs shows)."""
    import types

    from tfc_harness import chief, runner, strategies, threads
    from tfc_harness import settings as settings_mod

    fake = types.SimpleNamespace(role="chief", index=0, cluster="c", run_id="r", strategy="parameter_server",
                                 state_dir="/nonexistent", threads=None)
    monkeypatch.setattr(settings_mod, "validate", lambda raw: fake)
    monkeypatch.setattr(runner, "prepare_process", lambda settings: settings)
    monkeypatch.setattr(threads, "apply", lambda given: "threads: TensorFlow's defaults")

    class Loop:
        pass

        def __init__(self, settings):
            pass

        def runs_loop(self):
            return True

    Loop.ends_without_shutdown = ends_without_shutdown
    monkeypatch.setattr(strategies, "get", lambda name: Loop)
    ended = []
    monkeypatch.setattr(runner, "end_now", ended.append)     # os._exit: recorded here instead

    def interrupted(settings, strategy):
        raise KeyboardInterrupt

    monkeypatch.setattr(chief, "run", interrupted)
    monkeypatch.setattr(runner.preemption, "listen", lambda: None)
    assert runner.main({}) == server.STOPPED_EXIT_CODE
    assert ended == ([server.STOPPED_EXIT_CODE] if ends_without_shutdown else [])
    err = capsys.readouterr().err
    assert err.strip().endswith("chief 0: stopped (SIGINT); a next train resumes from the last checkpoint")
    assert "Traceback" not in err
