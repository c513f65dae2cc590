"""How the parameter-server loop packs steps into scheduled functions (no cluster: the tuning arithmetic)."""

from __future__ import annotations

import pytest
from tfc_harness.parameter_server import MIN_STEPS_PER_DISPATCH, Dispatch


@pytest.mark.parametrize("n", [1, 2, 7, 10, 64, 333])
def test_a_plan_runs_exactly_the_steps_asked(n):
    d = Dispatch(workers=2)
    for steps in (1, 3, 16, 200):
        d.steps = steps
        sizes = d.plan(n)
        assert sum(sizes) == n and all(1 <= k <= steps for k in sizes)


def test_the_first_call_runs_one_step_per_function():
    assert Dispatch(workers=2).plan(10) == [1] * 10


def test_every_worker_gets_a_function_while_there_are_steps_for_it():
    d = Dispatch(workers=4)
    d.steps = 100
    assert d.plan(10) == [3, 3, 2, 2]
    assert len(d.plan(3)) == 3


@pytest.mark.parametrize("n, sizes", [(56, [14] * 4), (44, [11] * 4), (30, [8, 8, 7, 7]), (20, [10, 10]),
                                      (3, [2, 1])])
def test_a_call_cut_short_is_spread_evenly_over_the_workers(n, sizes):
    """A call of fewer steps than whole rounds of the current size (cut at a checkpoint) gives every worker
    as many functions of about the same size: none idles through the call's last function."""
    d = Dispatch(workers=2)
    d.steps = 14
    assert d.plan(n) == sizes


def test_fast_steps_get_packed_toward_the_target_time():
    d = Dispatch(workers=2, target_s=0.05)
    d.observe([1] * 100, seconds=0.1)          # 100 steps over 2 busy workers: 2 ms a step
    assert d.steps == 25
    d.observe([25] * 4, seconds=0.1)           # now 2 ms a step still: same size
    assert d.steps == 25


def test_slow_steps_run_a_few_per_function_up_to_a_second_and_the_size_is_bounded():
    d = Dispatch(workers=2, target_s=0.05, limit=40)
    d.observe([1, 1], seconds=0.2)             # 200 ms a step: too long for the target, 4 a function
    assert d.steps == MIN_STEPS_PER_DISPATCH == 4
    d.observe([4, 4], seconds=1.4)             # 350 ms a step: as many as take a second
    assert d.steps == 2
    d.observe([2, 2], seconds=2.4)             # 1.2 s a step: one a function
    assert d.steps == 1
    d.observe([1] * 100, seconds=0.0)          # no measurable time: the limit, not a division by zero
    assert d.steps == 40


def test_a_call_with_fewer_functions_than_workers_counts_only_the_busy_ones():
    d = Dispatch(workers=4, target_s=0.05)
    d.observe([5], seconds=0.05)               # one worker ran 5 steps: 10 ms a step
    assert d.steps == 5


def test_a_size_is_reported_when_it_moves_by_half_or_more():
    d = Dispatch(workers=1, target_s=0.05)
    assert d.observe([1], seconds=1.2) is False         # 1 step a function still (a step over a second)
    assert d.observe([1] * 10, seconds=0.05) is True     # 5 ms a step: 10
    assert d.observe([10] * 2, seconds=0.08) is False    # 4 ms a step: 12, within half of 10
    assert d.observe([12] * 2, seconds=0.024) is True    # 1 ms a step: 50


def test_a_call_cut_short_below_the_planned_size_does_not_retune():
    d = Dispatch(workers=2, target_s=0.05)
    d.steps = 25
    # 3 steps to a checkpoint: functions of 2 and 1 steps, each mostly the dispatch's own cost
    assert d.observe(d.plan(3), seconds=0.05) is False
    assert d.steps == 25


def simulated_call(d: Dispatch, n: int, dispatch_s: float, step_s: float) -> tuple[list[int], float]:
    """The plan of a call of ``n`` steps and its time: each worker runs its share of the functions one after
    another, each costing the dispatch plus its steps."""
    sizes = d.plan(n)
    per_worker = [0.0] * d.workers
    for i, k in enumerate(sizes):
        per_worker[i % d.workers] += dispatch_s + k * step_s
    return sizes, max(per_worker)


@pytest.mark.parametrize("dispatch_s, step_s", [(0.040, 0.015), (0.010, 0.003), (0.002, 0.0015)])
def test_the_default_target_packs_steps_even_where_one_steps_dispatch_costs_more_than_its_step(dispatch_s, step_s):
    """Measured at the slow phase (digits, 1 ps, 2 workers): a one-step function took ~55 ms, of which ~40 ms
    the dispatch's. With a target below one function's time the size stayed 1 and most of the time went to
    dispatching; the default leaves the dispatch a small part of each function's time."""
    d = Dispatch(workers=2)
    for _ in range(8):
        d.observe(*simulated_call(d, 400, dispatch_s, step_s))
    assert d.steps > 1
    assert dispatch_s / (dispatch_s + d.steps * step_s) < 0.25


def test_a_full_call_of_the_new_plan_retunes_and_one_stretched_to_a_checkpoint_does_not():
    d = Dispatch(workers=2, target_s=0.05)
    d.steps = 14
    assert d.plan(56) == [14] * 4
    d.observe(d.plan(56), seconds=0.056)       # 2 ms a step: 25
    assert d.steps == 25
    d.steps = 14
    assert max(d.plan(62)) < 14                # the steps left to a checkpoint in one call: smaller functions
    assert d.observe(d.plan(62), seconds=0.5) is False and d.steps == 14


def test_the_first_call_does_its_work_after_scheduling_and_before_waiting():
    """The work handed to while_first_call runs once, inside the first call, once its functions are
    scheduled (the workers start on them) and before the chief waits for them; its failure is only logged."""
    pytest.importorskip("tensorflow")
    from harness_support import example_settings
    from tfc_harness.parameter_server import ParameterServer
    from tfc_harness.settings import validate

    events = []

    class Result:
        def fetch(self):
            return 0.5

    class Coordinator:
        def schedule(self, fn, args):
            events.append("schedule")
            return Result()

        def join(self):
            events.append("join")

    strategy = ParameterServer(validate(example_settings()))
    strategy.tf_strategy, strategy.coordinator = None, Coordinator()
    train = strategy.make_train_fn(replica_step=None, dataset=None)
    strategy.while_first_call(lambda: events.append("work"))
    assert events == []
    train(2)
    train(2)
    assert events == ["schedule", "schedule", "work", "join", "schedule", "schedule", "join"]

    def fails():
        raise RuntimeError("no ps")

    strategy.while_first_call(fails)
    assert train(2) == [0.5, 0.5]              # logged, not raised: the call waits for its functions
