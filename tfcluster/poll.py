"""One way to wait: call a check until it answers, the time is up, or waiting is pointless."""

from __future__ import annotations

import os
import select
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float, interval: float = 0.1,
               give_up: Callable[[], bool] | None = None) -> T | None:
    """Call ``check`` until it returns a true value (returned), at least once; None once ``timeout``
    seconds have passed or ``give_up()`` says the awaited thing can no longer happen."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if (give_up is not None and give_up()) or time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at host:port now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def owned_pid(pid_file: Path, marker: bytes) -> int | None:
    """The pid a pid file names, if that process still runs and its command line has ``marker`` (a pid
    file can outlive its process, and the pid be reused by another)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if marker in cmdline else None


def terminate(pid: int, grace: float, still_it: Callable[[], bool] = lambda: True) -> bool:
    """SIGTERM process ``pid``, SIGKILL once ``grace`` seconds pass without its exit: both through a pidfd
    opened first, so a process that ends meanwhile is never confused with another given its pid. ``still_it``,
    asked once the pidfd holds the process, says the pid still names the process meant (a pid file's check).
    False when there was no such process, or not the one meant. (A kernel without pidfds: SIGTERM only.)"""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:                                         # no pidfd here: never a SIGKILL to a guessed pid
        if not still_it():
            return False
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True
    try:
        if not still_it():
            return False
        signal.pidfd_send_signal(fd, signal.SIGTERM)
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)                  # a pidfd reads ready once its process has exited
        if not waiter.poll(grace * 1000):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except ProcessLookupError:                              # it exited between the open and a signal
        return True
    finally:
        os.close(fd)
