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


def test_a_process_has_ended_once_it_exits_even_before_its_status_is_collected():
    import subprocess

    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not poll.ended(proc.pid)
        proc.kill()
        assert poll.wait_until(lambda: poll.ended(proc.pid), 10, 0.01)
        assert os.path.exists(f"/proc/{proc.pid}")        # a zombie: its exit status not yet collected
    finally:
        proc.kill()
        proc.wait()
    assert poll.ended(proc.pid)
