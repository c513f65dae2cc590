"""The outer loop's sequencing with a fake train function: chunks, boundaries, checkpoints, status."""

from __future__ import annotations

import functools
import itertools
import json
import socket
import time

import pytest
from harness_support import free_port
from tfc_harness import loop
from tfc_harness.peers import PeerMonitor
from tfc_harness.preemption import Preempted
from tfc_harness.status import ChiefState


class Agreed:
    """Notices whose tasks always agree on ``chunk`` steps a call (the fixed chunks make these tests exact),
    and on this task's own ``due``, unless ``due`` is given: then on that."""

    who = ""

    def __init__(self, chunk: int, due: bool | None = None):
        self.chunk, self.due, self.proposed = chunk, due, []

    def agree(self, chunk: int, due: bool) -> tuple[int, bool]:
        self.proposed.append((chunk, due))
        return self.chunk, due if self.due is None else self.due


@pytest.mark.parametrize("step, every, total, boundary", [(0, 100, 300, 100), (100, 100, 300, 200),
                                                          (250, 100, 300, 300), (0, 100, 30, 30)])
def test_next_boundary(step, every, total, boundary):
    assert loop.next_boundary(step, every, total) == boundary


def test_next_chunk_aims_at_the_target_time():
    assert loop.next_chunk(10, 0.05, target_s=0.5) == 100     # fast steps: bigger chunks
    assert loop.next_chunk(10, 5.0, target_s=0.5) == 1        # slow steps: never below 1
    assert loop.next_chunk(10, 0.0, target_s=0.5) == 5000    # a zero duration does not divide by zero


def test_a_call_takes_the_steps_left_to_a_checkpoint_when_they_are_at_most_half_a_chunk_more():
    assert loop.call_steps(56, 62) == 62      # not 56 and then a call of 6
    assert loop.call_steps(56, 84) == 84
    assert loop.call_steps(56, 85) == 56      # 29 left after it: a call of its own
    assert loop.call_steps(56, 20) == 20      # fewer left than a chunk: those
    assert loop.call_steps(1, 1) == 1 and loop.call_steps(1, 2) == 1


def test_next_chunk_is_whole_rounds_of_the_steps_that_keep_every_task_busy():
    assert loop.next_chunk(10, 0.05, target_s=0.5, round_steps=8) == 104     # 100 steps: 12.5 rounds of 8
    assert loop.next_chunk(10, 0.05, target_s=0.5, round_steps=30) == 90     # 3.3 rounds of 30
    # rounds of ~0.25 s (a parameter-server round: each worker's function) and a call that took a little
    # more than one: two rounds next, not one (rounding down halved every call)
    assert loop.next_chunk(24, 0.26, target_s=0.5, round_steps=24) == 48
    assert loop.next_chunk(2, 0.75, target_s=0.5, round_steps=2) == 2        # 1.3 steps: still one round
    assert loop.next_chunk(1, 0.75, target_s=0.5, round_steps=2) == 2
    assert loop.next_chunk(10, 0.05, target_s=0.5, round_steps=0) == 100     # no round: as for 1


def test_steps_longer_than_the_chunk_target_still_keep_two_parallel_workers_busy(tmp_path, monkeypatch):
    """A model whose step takes longer than the chunk target on 2 workers that run a call's steps in parallel:
    without rounds the chunk fell to 1 step, one worker idle a whole call (shapes32 under parameter_server)."""
    calls = []

    def two_workers(n):
        calls.append(n)
        time.sleep(0.03 * -(-n // 2))        # each worker runs its half of the steps, 30 ms each
        return [0.5] * n

    def run(round_steps):
        calls.clear()
        loop.train(two_workers, ChiefState(tmp_path, total=30), examples_per_step=4, checkpoint_every=1000,
                   save=lambda step: None, round_steps=round_steps)
        return list(calls)

    monkeypatch.setattr(loop, "next_chunk", functools.partial(loop.next_chunk, target_s=0.02))
    assert run(lambda: 1)[1:4] == [1, 1, 1]            # the old way: one step a call
    chunks = run(lambda: 2)
    assert chunks[0] == loop.FIRST_CHUNK and sum(chunks) == 30
    assert all(n % 2 == 0 for n in chunks), chunks


def test_train_runs_every_step_checkpoints_at_boundaries_and_reports(tmp_path):
    calls, saved = [], []

    def train_fn(n):
        calls.append(n)
        time.sleep(0.001 * n)
        return [0.5] * min(n, 8)

    state = ChiefState(tmp_path, total=250)
    state.step = 20          # resumed
    took = loop.train(train_fn, state, examples_per_step=4, checkpoint_every=100, save=saved.append)
    assert sum(calls) == 230 and calls[0] == loop.FIRST_CHUNK
    assert took.first_call_steps == loop.FIRST_CHUNK and 0 < took.first_call_seconds < took.seconds
    assert saved == [100, 200, 250]
    done = 20
    for n in calls:          # no call crosses a checkpoint boundary
        assert loop.next_boundary(done, 100, 250) >= done + n
        done += n
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["phase"] == "training" and status["step"] == 250 and status["total"] == 250
    assert status["loss"] == 0.5 and status["examples_per_sec"] > 0


def test_each_call_runs_the_chunk_the_tasks_agreed_on_and_proposes_its_own_from_its_time(tmp_path):
    calls = []

    def train_fn(n):
        calls.append(n)
        time.sleep(0.002 * n)       # ~2 ms a step: a 0.5 s call would be ~250 steps
        return [0.5] * n

    agreed = Agreed(7)
    loop.train(train_fn, ChiefState(tmp_path, total=60), examples_per_step=4, checkpoint_every=25,
               save=lambda step: None, notices=agreed)
    # the first call is FIRST_CHUNK everywhere, then the agreed 7, up to the boundaries 25, 50 and 60 (the
    # steps left to one in a single call when they are at most half a chunk more: 8, not 7 and 1)
    assert calls == [10, 7, 8, 7, 7, 7, 4, 10]
    assert len(agreed.proposed) == len(calls) - 1       # asked after every call but the last
    assert all(30 <= p <= 600 and due for p, due in agreed.proposed), agreed.proposed   # its own time: ~0.5 s


def test_a_checkpoint_waits_for_the_first_boundary_after_the_minimum_interval(tmp_path, monkeypatch):
    """Fast steps: at most one checkpoint per ``min_interval_s``, each at a boundary; the last step always.
    (Calls of ~20 ms here, as the loop's 0.5 s calls are against a minimum interval of seconds.)"""
    monkeypatch.setattr(loop, "next_chunk", functools.partial(loop.next_chunk, target_s=0.02))
    saves = []

    def train_fn(n):
        time.sleep(0.002 * n)       # ~2 ms a step: 10 steps between boundaries take ~20 ms
        return [0.5] * n

    started = time.monotonic()
    loop.train(train_fn, ChiefState(tmp_path, total=300), examples_per_step=4, checkpoint_every=10,
               save=lambda step: saves.append((step, time.monotonic())), min_interval_s=0.15)
    steps = [step for step, _ in saves]
    assert steps[-1] == 300 and all(step % 10 == 0 for step in steps), steps
    assert 2 <= len(steps) < 30, steps               # not all 30 boundaries: ~0.6 s of steps, one save per 0.15 s
    times = [started] + [at for _, at in saves]
    assert all(later - earlier >= 0.15 for earlier, later in itertools.pairwise(times[:-1])), times   # but the last


def test_no_checkpoint_but_the_last_when_the_run_is_shorter_than_the_interval(tmp_path):
    saved = []
    loop.train(lambda n: [0.5] * n, ChiefState(tmp_path, total=250), examples_per_step=4, checkpoint_every=100,
               save=saved.append, min_interval_s=3600)
    assert saved == [250]


@pytest.mark.parametrize("interval, agreed_due, saved", [(3600, True, [25, 50, 60]), (0, False, [60])])
def test_the_tasks_agreement_decides_whether_a_checkpoint_is_due(tmp_path, interval, agreed_due, saved):
    """Under a synchronous strategy every task must save the same checkpoints: the agreed ``due`` wins over
    this task's clock (asked after the first call, at step 10, before the first boundary)."""
    saves = []
    loop.train(lambda n: [0.5] * n, ChiefState(tmp_path, total=60), examples_per_step=4, checkpoint_every=25,
               save=saves.append, notices=Agreed(7, due=agreed_due), min_interval_s=interval)
    assert saves == saved


def test_a_preemption_notice_saves_the_step_reached_though_no_checkpoint_was_due(tmp_path):
    class NoticeAtSecondCall:
        who, asked = "worker 0", 0

        def agree(self, chunk, due):
            self.asked += 1
            return (10, due) if self.asked == 1 else None

    saved = []
    with pytest.raises(Preempted):
        loop.train(lambda n: [0.5] * n, ChiefState(tmp_path, total=300), examples_per_step=4,
                   checkpoint_every=100, save=saved.append, notices=NoticeAtSecondCall(), min_interval_s=3600)
    assert saved == [20]


def test_a_preemption_notice_right_after_a_checkpoint_does_not_save_it_again(tmp_path):
    class NoticeAfterStep100:
        who = "worker 0"

        def __init__(self):
            self.steps = 0

        def agree(self, chunk, due):
            return None if self.steps >= 100 else (10, due)

    notice, saved = NoticeAfterStep100(), []

    def train_fn(n):
        notice.steps += n
        return [0.5] * n

    with pytest.raises(Preempted):
        loop.train(train_fn, ChiefState(tmp_path, total=300), examples_per_step=4, checkpoint_every=100,
                   save=saved.append, notices=notice)
    assert saved == [100]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_loss_that_is_not_finite_stops_training_before_it_is_saved_or_reported(tmp_path, bad):
    calls, saved = [], []

    def train_fn(n):
        calls.append(n)
        return [0.5] * n if sum(calls) <= 100 else [0.5, bad]

    state = ChiefState(tmp_path, total=300)
    with pytest.raises(loop.Diverged) as exc:
        loop.train(train_fn, state, examples_per_step=4, checkpoint_every=100, save=saved.append,
                   notices=Agreed(10))
    assert saved == [100]                           # the boundary before it, not the step it reached
    assert str(exc.value) == (f"the training loss became {bad} in steps 101-110: training diverged, so nothing "
                              "from these steps was saved (the newest checkpoint is step 100's); a lower learning "
                              "rate, or input values without extremes, usually cure it")
    assert state.step == 100 and state.loss == 0.5   # what the chief reports as the step reached
    assert not {"NaN", "Infinity"} & set((tmp_path / "status.json").read_text().split("\""))


def test_a_loss_that_is_not_finite_before_any_checkpoint_says_none_was_saved(tmp_path):
    state = ChiefState(tmp_path, total=300)
    with pytest.raises(loop.Diverged, match=r"in steps 1-10: .*\(no checkpoint was saved yet\)"):
        loop.train(lambda n: [float("nan")], state, examples_per_step=4, checkpoint_every=100,
                   save=lambda step: pytest.fail("saved a diverged step"), notices=Agreed(10))


def test_weights_that_are_not_finite_are_not_saved_though_every_loss_was(tmp_path):
    """A step's loss comes before its update: the last update of a call can break the weights unseen."""
    saved, done = [], [0]

    def train_fn(n):
        done[0] += n
        return [0.5] * n

    state = ChiefState(tmp_path, total=300)
    with pytest.raises(loop.Diverged) as exc:       # an update in steps 141-150 made them NaN
        loop.train(train_fn, state, examples_per_step=4, checkpoint_every=100, save=saved.append,
                   notices=Agreed(10), finite=lambda: done[0] < 150)
    assert saved == [100]
    assert str(exc.value).startswith("the model's weights or the optimizer's state became NaN or infinite in "
                                     "steps 101-200: training diverged, so nothing from these steps was saved "
                                     "(the newest checkpoint is step 100's)")


def test_a_preemption_save_is_refused_too_when_the_weights_are_not_finite(tmp_path):
    class Notice:
        who = "worker 0"

        def agree(self, chunk, due):
            return None

    with pytest.raises(loop.Diverged, match=r"in steps 1-10: .*\(no checkpoint was saved yet\)"):
        loop.train(lambda n: [0.5] * n, ChiefState(tmp_path, total=300), examples_per_step=4,
                   checkpoint_every=100, save=lambda step: pytest.fail("saved NaN weights"),
                   notices=Notice(), finite=lambda: False)


def test_examples_per_sec_after_the_first_call():
    took = loop.LoopTime(seconds=5.0, first_call_steps=20, first_call_seconds=2.0)
    assert took.examples_per_sec_after_first_call(320, examples_per_step=64) == 300 * 64 / 3.0
    assert loop.LoopTime(2.0, 20, 2.0).examples_per_sec_after_first_call(20, 64) is None   # one call was all
    assert loop.LoopTime(0.0).examples_per_sec_after_first_call(0, 64) is None             # nothing left to train


def test_peer_monitor_counts_losses_and_rejoins():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    monitor = PeerMonitor([("worker/0", address), ("worker/1", f"127.0.0.1:{free_port()}")])
    monitor.probe()
    assert monitor.failures == {"worker/1": 1} and monitor.rejoins == {}
    listener.close()
    monitor.probe()
    monitor.probe()
    assert monitor.failures == {"worker/0": 1, "worker/1": 1}
    with socket.create_server(("127.0.0.1", int(address.rsplit(":", 1)[1]))):
        monitor.probe()
    assert monitor.rejoins == {"worker/0": 1}


def test_each_progress_line_is_reported_to_the_summaries(tmp_path):
    reported = []
    state = ChiefState(tmp_path, total=40)
    loop.train(lambda n: [0.25] * n, state, examples_per_step=4, checkpoint_every=20, save=lambda step: None,
               notices=Agreed(10), on_report=lambda *args: reported.append(args))
    # a line about once a second, and always at the last step: a fast loop reports only that one
    assert [(step, loss) for step, loss, _ in reported] == [(40, 0.25)]
    assert reported[-1][2] > 0
