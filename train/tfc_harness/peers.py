"""The chief's view of its peers: the start barrier, and a monitor of losses and rejoins during training."""

from __future__ import annotations

import contextlib
import socket
import time

from .errors import HarnessError
from .status import log_line
from .watchdogs import Periodic

log = log_line    # one write a line: threads log beside each other (status.log_line)


def host_port(address: str) -> tuple[str, int]:
    """``"[::1]:2222"`` -> ``("::1", 2222)``"""
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def accepts(address: str, timeout_s: float) -> bool:
    """Whether ``host:port`` accepts a TCP connection now."""
    try:
        with socket.create_connection(host_port(address), timeout=timeout_s):
            return True
    except OSError:
        return False


def _names(waiting: dict[str, str]) -> str:
    return ", ".join(f"{n} ({a})" for n, a in sorted(waiting.items()))


def wait_for_peers(peers: list[tuple[str, str]], timeout_s: float, poll_s: float = 0.5) -> None:
    """Block until every ``(name, "host:port")`` accepts a TCP connection; HarnessError naming the missing
    ones after ``timeout_s``."""
    waiting = dict(peers)
    deadline = time.monotonic() + timeout_s
    next_note = time.monotonic()
    while True:
        waiting = {name: address for name, address in waiting.items() if not accepts(address, 2)}
        if not waiting:
            return
        now = time.monotonic()
        if now >= deadline:
            raise HarnessError(f"peers not reachable after {timeout_s:.0f}s: {_names(waiting)}")
        if now >= next_note:
            log("waiting for " + _names(waiting))
            next_note = now + 10
        time.sleep(poll_s)


@contextlib.contextmanager
def holding_port(address: str):
    """Listen on ``address``'s port (all interfaces) without accepting, so that peers waiting for this
    task see it started before its TensorFlow server exists; the port is free again on exit."""
    _, port = host_port(address)
    family = socket.AF_INET6 if ":" in host_port(address)[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
        sock.listen(64)
        yield


class PeerMonitor(Periodic):
    """Probes every peer once a second during training; counts losses and rejoins.

    The ClusterCoordinator carries on without a lost worker and takes it back when it returns; this
    makes that visible (log lines, and ``peer_failures``/``peer_rejoins`` in the published metrics).
    """

    def __init__(self, peers: list[tuple[str, str]], interval_s: float = 1.0):
        super().__init__(interval_s, "peer-monitor")
        self.peers = peers
        self.up = {name: True for name, _ in peers}
        self.failures: dict[str, int] = {}
        self.rejoins: dict[str, int] = {}

    def tick(self) -> None:
        self.probe()

    def probe(self) -> None:
        """Check every peer once; log and count each change."""
        for name, address in self.peers:
            alive = accepts(address, 1)
            if alive == self.up[name]:
                continue
            self.up[name] = alive
            if alive:
                self.rejoins[name] = self.rejoins.get(name, 0) + 1
                log(f"peer {name} ({address}) is back")
            else:
                self.failures[name] = self.failures.get(name, 0) + 1
                log(f"peer {name} ({address}) lost; training continues with the others")
