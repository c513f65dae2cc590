"""What ``train`` prints while the chief trains: one look at the chief's status per poll (its step, loss,
rate, the time left, the workers' data stream, its notes), until its task ends."""

from __future__ import annotations

import time

from . import poll, remote
from .errors import TfclusterError
from .paths import ClusterState
from .providers.base import Node


def progress_line(task: dict, sup: dict, eta_s: float | None, data: str | None = None) -> str:
    if not task:
        state = sup.get("state", "starting")
        # its process running but silent yet is the run's start, as the chief's own first report says next
        return f"  [{'starting' if state == 'running' else state}] waiting for the chief's first report"
    step, total = task.get("step", 0), task.get("total", 0) or 1
    phase = task.get("phase", sup.get("state", "?"))
    if phase == "starting":     # its step is not known yet (0, or where a resumed run goes on: after its restore)
        return f"  [starting] a run of {total} steps" + (f", restarts {sup['restarts']}" if sup.get("restarts") else "")
    parts = [f"[{phase}] step {step}/{total} ({100 * step // total}%)"]
    if task.get("loss") is not None:
        parts.append(f"loss {task['loss']:.4f}")
    if task.get("examples_per_sec"):
        parts.append(f"{task['examples_per_sec']:.0f} examples/s")
    if data is not None:
        parts.append(data)
    if eta_s is not None:
        parts.append(f"eta {eta_s:.0f}s")
    if sup.get("restarts"):
        parts.append(f"restarts {sup['restarts']}")
    return "  " + ", ".join(parts)


#: the least time between two looks at the chief that wait on its node for news
MIN_LOOK_S = 0.2
TERMINAL_TASK_STATES = ("succeeded", "failed", "stopped", "deadline", "lost", "preempted")
DATA_POLL_S = 15.0        # the workers' read rate, once it is known
FIRST_DATA_POLL_S = 2.0   # until then: a stream that ends within 15 s of its start must still show one
FIRST_DATA_WINDOW_S = 60.0  # but only this long: a worker that never reports a rate is not asked every 2 s
#: how long the chief may answer nothing (its node or the way to it gone: a VM reclaimed without a notice seen,
#: a cut network) before the watch gives up: the tasks are then stopped and the logs fetched, and the next train
#: resumes from the newest checkpoint in S3. Wall time from the first read left unanswered: a read that gets no
#: answer itself lasts up to the follower's line interval plus remote.STATUS_TIMEOUT (~16 s)
CHIEF_SILENCE_S = 120.0


class ChiefWatch:
    """One look at the chief per call: prints progress when it changed; returns the final status once
    its task has ended. Tolerates passing silences and errors, not lasting ones. ``until_change``: each look
    is a read that waits on the node up to ``poll_s`` for the supervisor's state or the task's phase to change
    (``tfc-supervise status --until-change``), so the loop's end and the task's are seen at once and the
    caller need not wait between calls (a plain read, no answer or an error then waits out ``poll_s`` here; a
    supervisor from before ``--until-change`` is read the plain way from then on). Without it, the caller
    waits between calls. ``follow`` (with ``until_change``): the looks read the lines of one SSH session in
    which the node prints the status as it changes and at least every ``poll_s`` (:class:`remote.StatusFollower`;
    a supervisor from before ``--follow`` is read by ``--until-change`` from then on); :meth:`close` ends it."""

    def __init__(self, state: ClusterState, chief: Node, poll_s: float, streamers: list[Node] = (),
                 until_change: bool = False, follow: bool = False):
        self.state, self.chief, self.poll_s = state, chief, poll_s
        self.paced, self.until_change = until_change, poll_s if until_change else 0.0
        self.follower = remote.StatusFollower(state, chief, poll_s) if follow and until_change else None
        self.last_line, self.errors = "", 0
        self.silent_since: float | None = None     # when the first read the chief left unanswered began
        self.last_report: tuple | None = None      # the chief's status, its supervisor's, the data's: last shown
        self.first_step: int | None = None         # the step the first training report gave
        self.since: tuple[float, int] | None = None   # (when, step) of the first report past it: the ETA's base
        self.last_eta: tuple[float, int, float] | None = None     # (when, step, seconds left) last computed
        self.streamers, self.data_mb_s, self.data_due, self.data_since = list(streamers), None, 0.0, None
        self.data_kept = False
        self.notes_shown = 0

    def __call__(self) -> dict | None:
        started = time.monotonic() if self.paced else 0.0
        self.waited = False
        final = self._look()
        if final is None and self.paced:   # a plain read, no answer, an error: a look every poll_s; after
            # news at least MIN_LOOK_S apart (a phase the task flips back and forth must not make a busy loop)
            least = MIN_LOOK_S if self.waited else self.poll_s
            time.sleep(max(0.0, least - (time.monotonic() - started)))
        return final

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()

    def _read(self) -> dict | None:
        if self.follower is not None:     # a line at least every poll_s; task_status's timeout beyond it
            return self.follower.read(self.poll_s + remote.STATUS_TIMEOUT)
        return remote.task_status(self.state, self.chief, until_change=self.until_change)

    def _look(self) -> dict | None:
        asked = time.monotonic()
        try:
            got = self._read()
            self.errors = 0
        except remote.NodeCommandError as exc:
            self.errors += 1
            if self.errors >= 3:  # not a passing hiccup: the status cannot be read, so waiting is pointless
                raise
            if "unrecognized arguments" in str(exc):    # a supervisor from before the option
                if self.follower is not None:
                    self.follower.close()
                    self.follower, self.errors = None, 0
                elif self.until_change:
                    self.until_change, self.errors = 0.0, 0
            return None
        if got is None:
            self.silent_since = asked if self.silent_since is None else self.silent_since
            silent = time.monotonic() - self.silent_since
            if silent > CHIEF_SILENCE_S:
                raise TfclusterError(f"the chief {self.chief.name} has not answered for {silent:.0f}s "
                                     f"(the watch gives up after {CHIEF_SILENCE_S:.0f}s): its node or the way to it "
                                     "is gone; 'make train' resumes the run from its newest checkpoint in S3 "
                                     "(where the provider took the node away: 'make down' and 'make up' first)")
            return None
        self.waited = bool(self.until_change)
        self.silent_since = None
        sup, task = got.get("supervisor", {}), got.get("task") or {}
        self._show_notes(task.get("notes") or [])
        data = self._data_text()
        line = progress_line(task, sup, self._eta(task), data)
        report = (task, sup.get("state"), sup.get("restarts"), data)
        if report != self.last_report:      # else a poll between two of the chief's reports: only its ETA is new
            self._show(line)
        self.last_report = report
        return got if sup.get("state") in TERMINAL_TASK_STATES else None

    def _data_text(self) -> str | None:
        rate = self._data_rate()
        if self.data_kept:
            return "data from the workers' disks (each file downloaded once)"
        return None if rate is None else f"data from S3 {rate:.1f} MB/s"

    def _data_rate(self) -> float | None:
        """The workers' summed S3 read rate (workers streaming files only), looked up every FIRST_DATA_POLL_S
        until a worker reports one (a worker refreshes it every second) or FIRST_DATA_WINDOW_S have passed,
        then every DATA_POLL_S."""
        if not self.streamers or time.monotonic() < self.data_due:
            return self.data_mb_s
        self.data_since = self.data_since or time.monotonic()
        rates, kept = [], 0
        for node in self.streamers:
            try:
                got = remote.task_status(self.state, node, timeout=10) or {}
            except remote.NodeCommandError:
                continue
            data = (got.get("task") or {}).get("data") or {}
            if data.get("all_kept"):        # its files are on its disk: it reads nothing from S3 any more
                kept += 1
            elif data.get("mb_per_s") is not None:
                rates.append(data["mb_per_s"])
        self.data_mb_s = sum(rates) if rates else self.data_mb_s
        self.data_kept = kept == len(self.streamers)     # every one of them said so in this lookup
        early = self.data_mb_s is None and time.monotonic() - self.data_since < FIRST_DATA_WINDOW_S
        self.data_due = time.monotonic() + (FIRST_DATA_POLL_S if early else DATA_POLL_S)
        return self.data_mb_s

    def _eta(self, task: dict) -> float | None:
        """Seconds left at the steps' rate since the step seen first moved on: that first step (0, or where a
        resumed run starts) waits for the loop's first call, which traces the step function and is slow. Out of
        the training phase (a restarted chief starts again, from its checkpoint) the base is dropped: the rate
        is taken afresh once the restarted loop's first call is over, not across the restart's pause. The rate is
        timed by the chief's clock (its report's ``updated``), not by when its reports arrive: two of them can
        arrive together (the first after the first call, then the next one), and their arrival times would make
        the rate many times too high ("eta 0s")."""
        step, total = task.get("step", 0), task.get("total", 0)
        if task.get("phase") != "training":
            self.first_step = self.since = self.last_eta = None
            return None
        now = time.monotonic()
        stamp = task.get("updated")
        when = float(stamp) if isinstance(stamp, (int, float)) else now
        if self.first_step is None:
            self.first_step = step
        if self.since is None:
            if step > self.first_step:
                self.since = (when, step)
            return None
        if self.last_eta and self.last_eta[1] == step:     # no new step reported yet: count down, not slow down
            left = self.last_eta[2] - (now - self.last_eta[0])
            return left if left > 0 else None       # overdue (a slow spell, a stall): no ETA rather than 0 s
        rate = (step - self.since[1]) / max(when - self.since[0], 1e-6)
        if rate <= 0:
            return None
        self.last_eta = (now, step, (total - step) / rate)
        return self.last_eta[2]

    def _show_notes(self, notes: list[str]) -> None:
        """The chief's lines for the user (its ``notes``, which only grow during a run), each printed once."""
        for note in notes[self.notes_shown:]:
            print(f"  {self.chief.name}: {note}", flush=True)
        self.notes_shown = max(self.notes_shown, len(notes))

    def _show(self, line: str) -> None:
        if line != self.last_line:
            print(line, flush=True)
            self.last_line = line


def wait_for_chief(state: ClusterState, chief: Node, timeout_s: float, poll_s: float = 1.0,
                   streamers: list[Node] = ()) -> dict:
    """Poll the chief's status and print progress until its task ends; return the last status.
    ``streamers``: the tasks streaming files from S3, whose summed read rate the progress line shows. The
    chief's node prints its status as it changes and at least every ``poll_s``, over one SSH session
    (:class:`ChiefWatch`, which paces the calls itself)."""
    watch = ChiefWatch(state, chief, poll_s, streamers, until_change=True, follow=True)
    try:
        final = poll.wait_until(watch, timeout_s, 0.0)
    finally:
        watch.close()
    if final is None:
        raise TfclusterError(f"the chief {chief.name} did not finish within {timeout_s:.0f}s")
    return final
