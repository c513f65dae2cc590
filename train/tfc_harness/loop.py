"""The outer training loop: it only sequences (train a chunk of steps, report, checkpoint at boundaries).

How steps run is the strategy's ``train(n)`` (:meth:`tfc_harness.strategies.Strategy.make_train_fn`); what
a step computes is :mod:`tfc_harness.steps`; saving is :class:`tfc_harness.saver.Saver`.  Chunks adapt so
that each ``train(n)`` call takes about :data:`CHUNK_TARGET_S` (dispatch has a fixed cost per call), never
crossing a checkpoint boundary that is due (:func:`train`: a boundary saves once ``min_interval_s`` passed
since the last checkpoint); where the tasks all run this loop in lockstep they agree on each chunk and on
whether a checkpoint is due (:meth:`tfc_harness.strategies.Strategy.agree`, through
:meth:`tfc_harness.preemption.Notices.agree`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

from .errors import HarnessError
from .preemption import Preempted
from .status import ChiefState, Progress, log_line

FIRST_CHUNK = 10
CHUNK_TARGET_S = 0.5      # aim for this much work per train(n) call


@dataclasses.dataclass(frozen=True)
class LoopTime:
    """How long the loop took, and its first ``train(n)`` call apart: that call traces the step function (and
    under a synchronous strategy sets up the collectives), which a plain process's warm-up steps also do."""

    seconds: float
    first_call_steps: int = 0
    first_call_seconds: float = 0.0

    def examples_per_sec_after_first_call(self, steps: int, examples_per_step: int) -> float | None:
        """Examples/s of the loop's ``steps`` less the first call's (checkpoints included); None when the
        first call was the whole loop or nothing was trained."""
        rest_steps, rest_s = steps - self.first_call_steps, self.seconds - self.first_call_seconds
        return rest_steps * examples_per_step / rest_s if rest_steps > 0 and rest_s > 0 else None


class Diverged(HarnessError):
    """Training stopped being finite (a loss, the weights or the optimizer's state): what it produced is not
    saved."""


log = log_line    # one write a line: the checkpoint upload's thread logs beside the loop


def diverged(what: str, first: int, last: int, saved: int) -> Diverged:
    """The error for ``what`` (e.g. ``the training loss became nan``) in steps ``first``..``last``, naming the
    newest checkpoint (``saved``; 0: none), which is what a restart resumes from."""
    kept = f"the newest checkpoint is step {saved}'s" if saved else "no checkpoint was saved yet"
    return Diverged(f"{what} in steps {first}-{last}: training diverged, so nothing from these steps was saved "
                    f"({kept}); a lower learning rate, or input values without extremes, usually cure it")


def check_finite(losses: list[float], first: int, last: int, saved: int) -> None:
    """Raise :func:`diverged` when a loss of steps ``first``..``last`` is NaN or infinite."""
    bad = next((v for v in losses if not math.isfinite(v)), None)
    if bad is not None:
        raise diverged(f"the training loss became {bad}", first, last, saved)


def next_boundary(step: int, checkpoint_every: int, total: int) -> int:
    """The next checkpoint step after ``step`` (the last step is always one)."""
    return min(total, (step // checkpoint_every + 1) * checkpoint_every)


def call_steps(chunk: int, left: int) -> int:
    """The steps of the next call: ``chunk``, or every step ``left`` to the next checkpoint when they are at
    most half a chunk more.  Chunks that stopped short of a boundary left a call of a few steps before it (6
    steps after 94, 14 after 186: measured at a 100-step interval), which paid a whole call's fixed cost (the
    workers' idle wait at its end, each function's dispatch) for a few steps' work."""
    return left if left <= chunk + chunk // 2 else chunk


def next_chunk(done: int, took_s: float, target_s: float = CHUNK_TARGET_S, round_steps: int = 1) -> int:
    """Steps for the next call, from how long ``done`` steps took: about ``target_s`` of work, in whole
    rounds of ``round_steps`` (the fewest that keep every training task busy), at least one round."""
    steps = done * target_s / max(took_s, 1e-3)
    round_steps = max(1, round_steps)
    # the nearest whole number of rounds: a parameter-server round is ~0.25 s (its functions' target), so
    # rounding down turned a proposal of just under 2 rounds into 1, and every call into half the target
    return round_steps * max(1, int(steps / round_steps + 0.5))


def _report(state: ChiefState, progress: Progress, step: int, losses: list[float],
            on_report: Callable[[int, float, float], None] | None) -> None:
    state.step = step
    state.loss = sum(losses) / len(losses)
    state.examples_per_sec = progress.examples_per_sec(step)
    if progress.due() or step == state.total:
        log(progress.line(step, state.loss))
        state.report()
        if on_report:
            on_report(step, state.loss, state.examples_per_sec)


def train(train_fn: Callable[[int], list[float]], state: ChiefState, *, examples_per_step: int,
          checkpoint_every: int, save: Callable[[int], None],
          on_report: Callable[[int, float, float], None] | None = None, notices=None,
          finite: Callable[[], bool] = lambda: True, round_steps: Callable[[], int] = lambda: 1,
          min_interval_s: float = 0.0) -> LoopTime:
    """Run ``train_fn`` from ``state.step`` to ``state.total``; returns how long it took (:class:`LoopTime`).

    A checkpoint is saved at the first ``checkpoint_every`` boundary after a call that ended ``min_interval_s``
    or more after the last one (the loop's start counts as one; 0: at every boundary), and always at the last
    step.  At a fixed number of steps alone, a fast model's checkpoints came several times a second (digits:
    every ~0.5 s at 100 steps, each stopping the workers and costing the chief and the ps CPU beside them).
    Whether one is due is this task's clock, agreed between the tasks with the chunk.
    Chunks adapt to how long calls take (:func:`next_chunk`).  ``on_report(step, loss,
    examples_per_sec)`` is called with each progress line (the TensorBoard summaries).  A loss that is NaN or
    infinite raises :class:`Diverged` before anything of that call is reported or saved, and so does
    ``finite()`` returning False before a save (a step's loss comes before its update, so the weights are
    asked too: :func:`tfc_harness.steps.all_finite`).  ``notices``
    (:class:`tfc_harness.preemption.Notices`) is asked after each chunk for the next one and whether a
    checkpoint is due: on a preemption notice the step reached is saved at once (unless it just was) and
    :class:`tfc_harness.preemption.Preempted` raised.  A synchronous strategy's tasks must all pass theirs:
    its agreement keeps their calls and their checkpoints the same.
    ``round_steps()`` is the fewest steps of a call that keep every training task busy
    (:meth:`tfc_harness.strategies.Strategy.steps_per_round`): chunks are whole rounds of it, but where a
    checkpoint boundary cuts one short."""
    step, total = state.step, state.total
    progress = Progress(total, examples_per_step, start_step=step)
    state.report("training")
    chunk = FIRST_CHUNK
    first_call: tuple[int, float] | None = None
    saved, saved_at = step, time.monotonic()
    due = min_interval_s <= 0

    def save_finite(at: int) -> None:
        if not finite():
            raise diverged("the model's weights or the optimizer's state became NaN or infinite", saved + 1, at,
                           saved)
        save(at)

    while step < total:
        boundary = next_boundary(step, checkpoint_every, total) if due else total
        n = max(1, call_steps(chunk, boundary - step))
        started = time.monotonic()
        losses = train_fn(n)
        check_finite(losses, step + 1, step + n, saved)
        step += n
        chunk = next_chunk(n, time.monotonic() - started, round_steps=round_steps())
        first_call = first_call or (n, progress.elapsed())
        _report(state, progress, step, losses, on_report)
        if step == boundary:
            save_finite(step)
            saved, saved_at = step, time.monotonic()
        due = time.monotonic() - saved_at >= min_interval_s
        if notices is not None and step < total:
            agreed = notices.agree(chunk, due)
            if agreed is None:
                if step != saved:
                    save_finite(step)
                raise Preempted(step, notices.who)
            chunk, due = agreed
    return LoopTime(progress.elapsed(), *(first_call or (0, 0.0)))
