"""Commands on a cluster's nodes outside Ansible: the task's status and log, over the same SSH set-up.

Ansible and these commands share one set of SSH options: the general ones live in ``ansible.cfg``
(``[ssh_connection] ssh_args``), the cluster's own (its key, its known_hosts) in :func:`cluster_options`,
which the inventory carries to Ansible as ``ansible_ssh_common_args``, and its control sockets in
:func:`control_options`, which Ansible gets in its environment.
"""

from __future__ import annotations

import configparser
import functools
import json
import os
import select
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .errors import TfclusterError
from .paths import ANSIBLE_CFG, ClusterState
from .providers.base import Node

#: roles/tf_node's defaults these commands share with its tasks (tests/unit/test_remote_finish.py holds them
#: equal; tfcluster never sets them otherwise, and its commands assume them): where a node's task keeps its
#: log and state (root's, 0750), the supervisor, the task's credentials file, and the directory (made afresh,
#: root's) of the archive a run's end leaves for the controller
TASK_DIR = "/var/lib/tfcluster/task"
SUPERVISE = "/usr/local/bin/tfc-supervise"
ENV_FILE = "/etc/tfcluster/task.env"
COLLECT_DIR = "/var/lib/tfcluster/collect"
#: the longest a node's part of a run's end may take: the supervisor's stop waits up to its grace (15 s) for
#: the task before it kills it, then the archive (at most the log's last 64 MiB)
FINISH_TIMEOUT = 60
CONNECT_TIMEOUT = 10
#: how long a status read waits for the node's answer (a followed status's: beyond the time between its lines)
STATUS_TIMEOUT = 15.0
#: the most nodes :func:`on_each` talks to at once (ansible.cfg's forks)
AT_ONCE = 32
#: the most of a status session's output :meth:`StatusFollower.read` takes in at once to find its newest line
MAX_BACKLOG = 8 << 20
READ_CHUNK = 1 << 16
T = TypeVar("T")


class NodeCommandError(TfclusterError):
    """The node answered, but the command failed (as opposed to a node that does not answer)."""


@functools.cache
def general_options() -> tuple[str, ...]:
    """The SSH options of ansible.cfg (control master, keep-alives): one home for both; read once."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ANSIBLE_CFG)
    return tuple(shlex.split(cfg.get("ssh_connection", "ssh_args", fallback="")))


def keepalive() -> tuple[int, int]:
    """``ServerAliveInterval`` and ``ServerAliveCountMax`` of ansible.cfg's ssh_args, for mitogen's SSH, which
    puts its own (30 s x 10) ahead of ssh_args, where ssh would keep them (the first value wins)."""
    opts = dict(o.split("=", 1) for o in general_options() if "=" in o)
    return int(opts.get("ServerAliveInterval", 10)), int(opts.get("ServerAliveCountMax", 3))


def cluster_options(state: ClusterState) -> list[str]:
    """The cluster's own SSH options: its known_hosts (new hosts accepted once, then checked), no agent keys."""
    return ["-o", f"UserKnownHostsFile={state.known_hosts}", "-o", "StrictHostKeyChecking=accept-new",
            "-o", "IdentitiesOnly=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}"]


def control_options(state: ClusterState) -> list[str]:
    """The cluster's control sockets, one per node (ssh's %C), which these commands, Ansible's own ssh and
    mitogen's share (:func:`tfcluster.ansible_run.environment`): a master one of them left serves the others,
    and a play through mitogen then skips each node's SSH handshake. Not in the inventory: the directory is
    under this run's temporary directory (:attr:`tfcluster.paths.ClusterState.control_dir`)."""
    return ["-o", f"ControlPath={state.ensure_control_dir()}/%C"]


def ssh_command(state: ClusterState, node: Node, command: str) -> list[str]:
    """``ssh`` running ``command`` on a node, with Ansible's options and the cluster's control sockets."""
    return ["ssh", "-i", str(state.ssh_key), *general_options(), *cluster_options(state), "-o", "BatchMode=yes",
            *control_options(state), "-p", str(node.ssh_port), f"{node.ssh_user}@{node.public_ip}", command]


def on_each(nodes: list[Node], one: Callable[[Node], T]) -> dict[str, T]:
    """``one(node)`` for every node at once (at most :data:`AT_ONCE` at a time), by node name."""
    with ThreadPoolExecutor(max_workers=min(AT_ONCE, max(1, len(nodes)))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(one, nodes), strict=True))


def close_masters(state: ClusterState) -> None:
    """End the SSH master connections of the cluster's control sockets (ssh and Ansible keep one per node
    for ``ControlPersist``, 60 s after its last use): once the nodes are gone, nothing else ends them sooner
    than their keep-alives do. Asks each through its socket only; the node is not contacted."""
    if not state.control_dir.is_dir():
        return
    for sock in state.control_dir.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "node"], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=10, check=False)


def as_root(node: Node, command: str) -> str:
    """A node command that needs root's rights (the task's state is root's): through sudo for the
    non-root users of cloud images and of the local base image."""
    return command if node.ssh_user == "root" else f"sudo -n {command}"


def call(state: ClusterState, node: Node, command: str, timeout: float = 30, root: bool = True,
         own_session: bool = False, text: bool = True) -> subprocess.CompletedProcess:
    """Run a command on a node with root's rights (``root=False``: as the login user, without sudo's start):
    its result, or ssh's own failure as exit status 255; raises ``subprocess.TimeoutExpired``.
    ``own_session``: ssh in a session of its own, out of reach of a Ctrl-C meant for other work; ``text=False``:
    its output as bytes."""
    decoded = {"text": True, "errors": "replace"} if text else {}   # a task's log may hold any bytes
    return subprocess.run(ssh_command(state, node, as_root(node, command) if root else command),
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          start_new_session=own_session, **decoded)


def run(state: ClusterState, node: Node, command: str, timeout: float = 30, root: bool = True,
        own_session: bool = False, text: bool = True) -> subprocess.CompletedProcess | None:
    """:func:`call`, or None when the node does not answer (ssh's own exit status 255, or nothing within the
    timeout)."""
    try:
        res = call(state, node, command, timeout, root, own_session, text)
    except subprocess.TimeoutExpired:
        return None
    return None if res.returncode == 255 else res


def task_status(state: ClusterState, node: Node, timeout: float = STATUS_TIMEOUT,
                until_change: float = 0.0) -> dict | None:
    """The node's supervisor and task status; None when the node does not answer. A node that answers
    with an error raises NodeCommandError naming it: an empty answer is never taken for a status.
    ``until_change``: the node first waits up to that long for its supervisor's state or its task's phase to
    change (``tfc-supervise status --until-change``)."""
    command = f"{SUPERVISE} status --dir {TASK_DIR}" + (f" --until-change {until_change:g}" if until_change else "")
    res = run(state, node, command, timeout)
    if res is None:
        return None
    if res.returncode != 0:
        raise _status_failed(node, command, res.returncode, res.stderr or res.stdout)
    return _status_in(node, command, res.stdout)


def _status_failed(node: Node, command: str, code: int, said: str) -> NodeCommandError:
    return NodeCommandError(f"{node.name}: '{as_root(node, command)}' failed (exit {code}): {said.strip()[-500:]}")


def _status_in(node: Node, command: str, printed: str) -> dict:
    """The status in the last line a status command printed; NodeCommandError when it holds none."""
    try:
        got = json.loads(printed.strip().splitlines()[-1])
    except (ValueError, IndexError):
        got = None
    if not isinstance(got, dict):
        raise NodeCommandError(f"{node.name}: '{as_root(node, command)}' printed no status: "
                               f"{printed.strip()[-300:]!r}")
    return got


class StatusFollower:
    """The node's status as its supervisor prints it while it changes (``tfc-supervise status --follow``),
    over one SSH session for as long as it lasts: the chief's watch during a run, where a command for each
    look cost the node an interpreter's start, sudo's and an SSH session's every second (~0.1 s of CPU each,
    perf, on a 2-core machine that also trains). :meth:`read` is :func:`task_status`'s contract: the newest
    status printed, None when the node does not answer within the time, NodeCommandError when the command
    fails there (an older supervisor without ``--follow``: "unrecognized arguments"). A session that ends
    or does not answer is started again at the next read. :meth:`close` ends it."""

    def __init__(self, state: ClusterState, node: Node, every: float):
        self.state, self.node = state, node
        self.command = f"{SUPERVISE} status --dir {TASK_DIR} --follow {every:g}"
        self.proc: subprocess.Popen | None = None
        self.buf = b""

    def read(self, timeout: float) -> dict | None:
        if self.proc is None:
            self._start()
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + timeout
        ready = select.poll()
        ready.register(fd, select.POLLIN)
        ended = False
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()        # silent for the whole time: as a node that does not answer
                return None
            if not ready.poll(left * 1000):
                continue
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                return self._ended()
            self.buf += chunk
        # the lines printed meanwhile too (a controller held up elsewhere), so the status taken is the node's
        # newest, not an old one of a backlog; at most MAX_BACKLOG of them at a time
        while not ended and len(self.buf) < MAX_BACKLOG and ready.poll(0):
            chunk = os.read(fd, READ_CHUNK)
            ended = not chunk
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return _status_in(self.node, self.command, lines[-1].decode(errors="replace"))

    def _start(self) -> None:
        # stderr to a file, which never fills up and blocks the node's printing (a Ctrl-C ends the ssh with
        # the run's other foreground processes; the watch's close ends it otherwise)
        self.err, self.buf = tempfile.TemporaryFile(), b""
        try:
            self.proc = subprocess.Popen(ssh_command(self.state, self.node, as_root(self.node, self.command)),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.err)
        except BaseException:
            self.err.close()
            raise

    def _ended(self) -> dict | None:
        try:
            code = self.proc.wait(timeout=CONNECT_TIMEOUT)     # its output has ended: ssh is ending
        except subprocess.TimeoutExpired:
            code = 255
        self.err.seek(0)
        said = self.err.read().decode(errors="replace")
        self.close()
        if code in (0, 255):     # it printed its last status (read before), or ssh did not reach the node
            return None
        raise _status_failed(self.node, self.command, code, said)

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.err.close()
            self.proc = None


def finish_command(stop: bool) -> str:
    """The supervisor's command for a node's part of a run's end, as roles/tf_node/tasks/finish.yml runs it
    (``_tf_node_supervise_finish``): stop the task (``stop``), remove its credentials file, archive its log and
    state into :data:`COLLECT_DIR`."""
    return (f"{SUPERVISE} finish --dir {TASK_DIR} --env-file {ENV_FILE}" + (" --stop" if stop else "")
            + f" --to {COLLECT_DIR}")


def save_and_stop_command(save_s: float) -> str:
    """The supervisor's stop that first has the task save the step it reached and end, for ``save_s`` seconds at
    most (``tfc-supervise stop --save``): the chief's after a Ctrl-C, as roles/tf_node's finish does it."""
    return f"{SUPERVISE} stop --dir {TASK_DIR} --save {save_s:g}"


def read_archive(state: ClusterState, node: Node, timeout: float = 60, own_session: bool = False) -> bytes | None:
    """The archive of the node's log and state that :func:`finish_command` left (root's); None when the node
    does not answer or the read fails (``own_session``: :func:`call`'s)."""
    res = run(state, node, f"cat {COLLECT_DIR}/collected.tar.gz", timeout, own_session=own_session, text=False)
    return res.stdout if res is not None and res.returncode == 0 else None


def task_log(state: ClusterState, node: Node, lines: int) -> str | None:
    """The last lines of the node's task log; None when the node does not answer or has no log yet."""
    # the supervisor reads it: the log lies in the task user's directory, and root must not follow a link there
    res = run(state, node, f"{SUPERVISE} tail --dir {TASK_DIR} --lines {int(lines)}")
    if res is None or res.returncode == 3:     # no log yet
        return None
    if res.returncode != 0:
        raise NodeCommandError(f"{node.name}: reading its log failed (exit {res.returncode}): "
                               f"{res.stderr.strip()[-500:]}")
    return res.stdout
