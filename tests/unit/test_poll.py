"""poll: waiting, port probes and pid files."""

from __future__ import annotations

import os
import socket

from tfcluster import poll


def test_wait_until_returns_the_answer_gives_up_or_times_out():
    calls = []
    assert poll.wait_until(lambda: calls.append(1) or len(calls) >= 3 and "done", 5, 0.001) == "done"
    assert poll.wait_until(lambda: False, 5, 0.001, give_up=lambda: True) is None
    assert poll.wait_until(lambda: False, 0.05, 0.01) is None


def test_port_open():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert poll.port_open("127.0.0.1", s.getsockname()[1])
        port = s.getsockname()[1]
    assert not poll.port_open("127.0.0.1", port)


def test_owned_pid_only_for_a_live_process_with_the_marker(tmp_path):
    pid_file = tmp_path / "x.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert poll.owned_pid(pid_file, b"python") == os.getpid()
    assert poll.owned_pid(pid_file, b"moto.server") is None
    pid_file.write_text("not a pid\n")
    assert poll.owned_pid(pid_file, b"python") is None
    assert poll.owned_pid(tmp_path / "missing.pid", b"python") is None


def _process(ignore_term: bool):
    import subprocess
    import sys

    code = ("import signal, sys, time\n"
            f"{'signal.signal(signal.SIGTERM, signal.SIG_IGN)' if ignore_term else 'pass'}\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"          # its handler is in place
    return proc


def test_terminate_ends_a_process_by_term_or_after_the_grace_by_kill():
    import signal
    import time

    for ignore_term, sig in ((False, signal.SIGTERM), (True, signal.SIGKILL)):
        proc = _process(ignore_term)
        try:
            started = time.monotonic()
            assert poll.terminate(proc.pid, 2.0)
            assert proc.wait(5) == -sig
            # the grace is waited only for a process that outlives its SIGTERM (one that exits on it is a
            # zombie until wait() below: its exit itself ends the wait, not its collection)
            assert (time.monotonic() - started >= 2.0) == ignore_term
        finally:
            proc.kill()
            proc.wait()


def test_terminate_signals_nothing_the_check_disowns_nor_a_pid_that_is_gone():
    proc = _process(False)
    try:
        assert not poll.terminate(proc.pid, 0.1, still_it=lambda: False)
        assert proc.poll() is None                          # not signalled
    finally:
        proc.kill()
        proc.wait()
    assert not poll.terminate(proc.pid, 0.1)                # collected: no such process (the pid is not reused
                                                            # this quickly: pids go round the whole range first)


def test_without_pidfds_terminate_sends_sigterm_only(monkeypatch):
    import errno

    def no_pidfd(pid):
        raise OSError(errno.ENOSYS, "no pidfd_open")
    monkeypatch.setattr(poll.os, "pidfd_open", no_pidfd)
    proc = _process(True)                                   # ignores SIGTERM: no SIGKILL follows without a pidfd
    try:
        assert poll.terminate(proc.pid, 0.1)
        assert proc.poll() is None
        assert not poll.terminate(proc.pid, 0.1, still_it=lambda: False)
        proc.kill()
        proc.wait()
        assert not poll.terminate(proc.pid, 0.1)            # no such process
    finally:
        proc.kill()
        proc.wait()
