"""What the fault scenarios share: `tfcluster train` in the background (or paused at a line of the chief's
log), signalling a task (at once, or at a line of its log), waiting for lines in a log and for a signal to be
pending.

Each scenario module has its own configured cluster; these helpers take its name (and its state root,
``home``) so that one set serves every module.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import PYTHON, REPO, interruptible
from tests.integration.helpers import ssh, ssh_argv

TASK = "/var/lib/tfcluster/task"
#: a Python expression, on the node: the pid of the task its supervisor runs
_CHILD_PID = f"json.load(open('{TASK}/supervisor.json'))['child_pid']"


#: the scenarios' faults land at checkpoints of given steps (``checkpoint saved at step N``), and their runs
#: last seconds: a checkpoint at every ``checkpoint_every`` boundary, not at most one each 30 s (the default)
EVERY_BOUNDARY = ["--set", "training.checkpoint_min_interval_seconds=0"]


class Train:
    """`tfcluster train --skip-configure` on ``cluster`` in the background, with its output in a file; a
    checkpoint at every boundary (:data:`EVERY_BOUNDARY`, before ``args``)."""

    def __init__(self, env: dict, cluster: str, *args: str):
        self.out = Path(env["TFCLUSTER_HOME"]) / f"train-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen([PYTHON, "-m", "tfcluster", "train", "--skip-configure", "--cluster", cluster,
                                      *EVERY_BOUNDARY, *args], cwd=REPO, env=env, stdout=open(self.out, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=interruptible)
        self.args = self.proc.args

    def wait(self, timeout=600) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode, self.out.read_text()

    def text(self) -> str:
        return self.out.read_text()


def kill_task(home: Path, cluster: str, nodes: dict, node: str) -> None:
    """SIGKILL the node's TensorFlow process (its supervisor stays and restarts it)."""
    signal_task(home, cluster, nodes, node, signal.SIGKILL)


@contextmanager
def continued_after(home: Path, cluster: str, nodes: dict, node: str = "chief-0") -> Iterator[None]:
    """The node's task is paused (SIGSTOP): continue it (SIGCONT) when the block ends, however it ends."""
    try:
        yield
    finally:
        signal_task(home, cluster, nodes, node, signal.SIGCONT)


def signal_task(home: Path, cluster: str, nodes: dict, node: str, signum: int) -> None:
    """Send ``signum`` to the node's TensorFlow process (the supervisor's child)."""
    cmd = f"python3 -c \"import json,os; os.kill({_CHILD_PID}, {int(signum)})\""
    res = ssh(home, cluster, nodes[f"{cluster}-{node}"]["private_ip"], cmd)
    assert res.returncode == 0, res.stderr


#: runs on the node (python3 -c): watches the task's node.log and signals the task at the first line matching
#: the pattern (after the first line matching ``after``, when one is given). It ignores the log it finds at its
#: start (the previous run's: the run's start renames it to node.log.1) and follows the next one, or with
#: ``current`` follows that log from its present end (a run under way); if the one it follows is replaced (a
#: later run), it gives up.
_WATCHER = r"""
import json, os, re, sys, time
log, pattern, signum = sys.argv[1], re.compile(sys.argv[2].encode()), int(sys.argv[3])
end = time.time() + float(sys.argv[4])
current, after = sys.argv[6] == "current", re.compile(sys.argv[7].encode()) if sys.argv[7] else None
def inode():
    try:
        return os.stat(log).st_ino
    except FileNotFoundError:
        return None
old, ours, pos, rest = inode(), None, 0, b""
if current and old is not None:
    ours, pos = old, os.path.getsize(log)
print("watching", flush=True)
while time.time() < end:
    now = inode()
    if now is not None and now != ours and ours is not None:
        sys.exit(4)
    if now is not None and (now == ours or now != old):
        ours = now
        with open(log, "rb") as f:
            f.seek(pos)
            chunk = f.read()
            pos += len(chunk)
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for i, line in enumerate(lines):
            if after is not None and after.search(line):
                lines, after = lines[i + 1:], None
                break
        if after is None and any(pattern.search(line) for line in lines):
            pid = json.load(open(os.path.join(os.path.dirname(log), "supervisor.json")))["child_pid"]
            os.kill(pid, signum)
            print("fired", flush=True)
            sys.exit(0)
    time.sleep(0.02)
sys.exit(3)
"""


class OnLogLine:
    """Send ``signum`` to a node's task the moment its log gets a line matching ``pattern`` (a regular
    expression): a watcher on the node itself acts within ~20 ms, where a poll of the chief's status over SSH
    lags it by 1-2 s (~300 steps at this machine's fast phase). Make it before the run starts: it watches the
    log that run's start makes; or with ``current``, while a run's task is paused: it follows that run's log
    from its present end. With ``after``, only lines after the first matching that expression count. A
    context manager: leaving it stops the watcher if it has not fired."""

    def __init__(self, home: Path, cluster: str, nodes: dict, node: str, pattern: str, signum: int,
                 timeout: float = 600, current: bool = False, after: str = ""):
        self.what = f"{signal.Signals(signum).name} to {node} at /{pattern}/" + (f" after /{after}/" if after else "")
        self.token = f"tfct-watch-{os.getpid()}-{time.monotonic_ns()}"
        self.ip = nodes[f"{cluster}-{node}"]["private_ip"]
        self.home, self.cluster = home, cluster
        command = " ".join(shlex.quote(a) for a in ("python3", "-c", _WATCHER, f"{TASK}/node.log", pattern,
                                                    str(int(signum)), str(timeout), self.token,
                                                    "current" if current else "next", after))
        self.proc = subprocess.Popen(ssh_argv(home, cluster, self.ip, command), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline().strip()
        assert first == "watching", f"the watcher for {self.what} did not start: {first} {self.proc.stderr.read()}"

    def wait(self, timeout: float = 300) -> None:
        """Wait until the watcher has sent the signal."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no {self.what} within {timeout}s") from None
        assert self.proc.returncode == 0 and "fired" in out, (self.what, self.proc.returncode, out, err)

    def __enter__(self) -> OnLogLine:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            # "[t]fct-watch-…" matches the watcher's command line, not this command's own (sudo, sh)
            try:
                ssh(self.home, self.cluster, self.ip, f"pkill -f '[{self.token[0]}]{self.token[1:]}'", timeout=15)
            except subprocess.TimeoutExpired:
                pass   # the watcher gives up by itself (its timeout, or the next run's log)


#: runs on the node (python3 -c): pauses the task (SIGSTOP) until a stop that saves reaches it (its supervisor's
#: log line, or its SIGUSR1 pending), then continues it. A `multi_worker_mirrored` task is let run for a moment
#: every PAUSE_S seconds meanwhile: its peers' heartbeats to TensorFlow's coordination service (sent every ~5 s,
#: failing after 10 s) would otherwise fail during a long pause and end the run before its stop came. With a
#: pattern, it pauses at the first line of the task's live log (from its start: the run's) that matches it.
_PAUSER = r"""
import json, os, re, signal, sys, time
task, pause_s, run_s, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
at = re.compile(sys.argv[6].encode(), re.M) if sys.argv[6] else None
def ended(signum, frame):      # a SIGTERM (the test's cleanup) still continues the task: the finally below
    raise SystemExit(1)
signal.signal(signal.SIGTERM, ended)
signal.signal(signal.SIGHUP, ended)
pid = json.load(open(os.path.join(task, "supervisor.json")))["child_pid"]
log = os.path.join(task, "node.log")
if at is not None:
    print("watching", flush=True)
    end, seen = time.monotonic() + timeout, b""
    while not at.search(seen):
        if time.monotonic() > end or not os.path.exists(f"/proc/{pid}"):
            sys.exit(3)
        time.sleep(0.02)
        with open(log, "rb") as f:
            seen = f.read()
start = os.path.getsize(log)
usr1 = 1 << (signal.SIGUSR1 - 1)
def stop_came():
    with open(log, "rb") as f:
        f.seek(start)
        if b"stop that saves first" in f.read():
            return True
    try:
        status = open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return True            # the task ended (a stop that came and was handled in a run window)
    return any(int(m, 16) & usr1 for m in re.findall(r"^(?:ShdPnd|SigPnd):\s+([0-9a-f]+)$", status, re.M))
def send(signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
def say(word):               # the test may have gone (its ssh ended): the task is continued all the same
    try:
        print(word, flush=True)
    except OSError:
        pass
end, paused, cycles = time.monotonic() + timeout, time.monotonic(), 0
try:
    send(signal.SIGSTOP)
    say("paused")
    while not stop_came():
        if time.monotonic() > end:
            sys.exit(3)
        if time.monotonic() - paused > pause_s:
            send(signal.SIGCONT)
            time.sleep(run_s)
            send(signal.SIGSTOP)
            paused, cycles = time.monotonic(), cycles + 1
        time.sleep(0.1)
finally:
    send(signal.SIGCONT)
say(f"continued (let run {cycles} times)")
"""


class PausedUntilStop:
    """Pause a node's task now, or with ``at`` (a regular expression) at the first line of its run's log that
    matches it (:meth:`wait_paused`), and continue it once a stop that saves (a Ctrl-C of its train) reaches
    it: the stop then lands at the step it was paused near, whatever the machine's speed. Every ``pause_s``
    seconds the task runs for ``run_s`` (see :data:`_PAUSER`). A context manager: leaving it ends the pauser,
    the task continued, if the stop never came."""

    def __init__(self, home: Path, cluster: str, nodes: dict, node: str, pause_s: float = 2.5,
                 run_s: float = 0.2, timeout: float = 300, at: str = ""):
        self.what = f"{cluster}'s {node}" + (f" at /{at}/" if at else "")
        self.token = f"tfct-pause-{os.getpid()}-{time.monotonic_ns()}"
        self.ip = nodes[f"{cluster}-{node}"]["private_ip"]
        self.home, self.cluster, self.at = home, cluster, at
        command = " ".join(shlex.quote(a) for a in ("python3", "-c", _PAUSER, TASK, str(pause_s), str(run_s),
                                                    str(timeout), self.token, at))
        self.proc = subprocess.Popen(ssh_argv(home, cluster, self.ip, command), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._expect("watching" if at else "paused")

    def _expect(self, word: str) -> None:
        first = self.proc.stdout.readline().strip()
        if first != word:
            self._end()
            err = self.proc.stderr.read()
            self.__exit__(None, None, None)
            raise AssertionError(f"{self.what}: the pauser said {first!r}, not {word!r}: {err}")

    def wait_paused(self) -> None:
        """With ``at``: wait until the task's log got that line and the task was paused there."""
        assert self.at, "a pauser without `at` pauses at its start"
        self._expect("paused")

    def wait(self, timeout: float = 300) -> str:
        """Wait until the stop reached the task and it was continued; what the pauser said."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the stop never reached {self.what} within {timeout}s") from None
        assert self.proc.returncode == 0 and "continued" in out, (self.what, self.proc.returncode, out, err)
        return out.strip()

    def __enter__(self) -> PausedUntilStop:
        return self

    def __exit__(self, *exc) -> None:
        self._end()
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()

    def _end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            try:     # its SIGTERM handler continues the task; "[t]fct-pause-…" skips this command's own line
                ssh(self.home, self.cluster, self.ip, f"pkill -f '[{self.token[0]}]{self.token[1:]}'", timeout=15)
            except subprocess.TimeoutExpired:
                pass   # it gives up by itself (its timeout), and continues the task


def train_paused_at(env: dict, home: Path, cluster: str, nodes: dict, pattern: str, *args: str) -> Train:
    """Start ``tfcluster train *args`` and return it once the chief's task is paused (SIGSTOP) at the first
    line of its log matching ``pattern``: the fault then lands at that line. Continue the chief with
    :func:`continued_after`."""
    with OnLogLine(home, cluster, nodes, "chief-0", pattern, signal.SIGSTOP) as pause:
        train = Train(env, cluster, *args)
        pause.wait()
    return train


def wait_for_pending(home: Path, cluster: str, nodes: dict, node: str, signum: int, timeout=120) -> None:
    """Wait until ``signum`` is pending on the node's (stopped) task: it was sent, and the task will handle it
    once it continues."""
    bit = 1 << (int(signum) - 1)
    cmd = f"pid=$(python3 -c \"import json; print({_CHILD_PID})\") && grep -E '^(ShdPnd|SigPnd):' /proc/$pid/status"
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = ssh(home, cluster, nodes[f"{cluster}-{node}"]["private_ip"], cmd, timeout=15).stdout
        if any(int(mask, 16) & bit for mask in re.findall(r"^\w+:\s+([0-9a-f]+)$", seen, re.M)):
            return
        time.sleep(0.2)
    raise AssertionError(f"{signal.Signals(signum).name} never pending on {node}'s task: {seen}")


def wait_for_log_lines(home: Path, cluster: str, nodes: dict, node: str, pattern: str, count: int = 1,
                       after: str = "", timeout=120) -> None:
    """Wait until the node's live log (its supervisor's node.log) holds ``count`` lines matching the
    extended regular expression ``pattern`` (counted from the first line matching ``after``, if given)."""
    program = "($0 ~ a) {f = 1} (f && $0 ~ p) {n++} END {print n + 0}"
    cmd = (f"awk -v a={shlex.quote(after or '^')} -v p={shlex.quote(pattern)} {shlex.quote(program)} "
           f"{TASK}/node.log")
    deadline = time.monotonic() + timeout
    found = 0
    while time.monotonic() < deadline:
        res = ssh(home, cluster, nodes[f"{cluster}-{node}"]["private_ip"], cmd, timeout=15)
        found = int(res.stdout.strip() or 0)
        if found >= count:
            return
        time.sleep(0.3)
    where = f" after the first matching {after!r}" if after else ""
    raise AssertionError(f"{node}'s log has {found} line(s) matching {pattern!r}{where} after {timeout}s, "
                         f"not {count}")


def cluster_nodes(home: Path, cluster: str) -> dict:
    """The cluster's nodes by name, as its nodes.json lists them (the helpers here take this as ``nodes``)."""
    return {n["name"]: n for n in json.loads((home / cluster / "nodes.json").read_text())}


def run_record(home: Path, cluster: str) -> dict:
    return json.loads((home / cluster / "run.json").read_text())


def printed_metric(out: str, name: str = "accuracy") -> float:
    """A test metric as `make train` prints it (``test accuracy: 0.9833``)."""
    return float(re.search(rf"^test {name}: ([0-9.]+)$", out, re.M).group(1))


def node_log(home: Path, cluster: str, node: str = "chief-0") -> str:
    """The node's log as fetched after the newest run."""
    run = run_record(home, cluster)
    return (home / cluster / "logs" / run["run_id"] / f"{cluster}-{node}" / "node.log").read_text()


def resumed_steps(log: str) -> list[int]:
    return [int(s) for s in re.findall(r"resumed from checkpoint at step (\d+)", log)]


def saved_before_restart(log: str) -> list[int]:
    """The checkpoints the chief saved (and uploaded) before its first restart: the newest is where a task
    killed then must resume."""
    before = log.split("resumed from checkpoint at step", 1)[0]
    return [int(s) for s in re.findall(r"checkpoint saved at step (\d+)", before)]
