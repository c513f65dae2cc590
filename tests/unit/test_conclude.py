"""A published run's conclusion: the model is verified while the tasks still serving are stopped and the logs
fetched (training._conclude), and the record says whether every log was fetched, whatever verification
found. Before it, the chief's watch (progress.ChiefWatch): its looks, its progress lines, and its session
that follows the chief's status (remote.StatusFollower; ssh replaced by a local command that prints as a
node's ``tfc-supervise status --follow`` would, tests/unit/test_roles.py runs the supervisor's own)."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from tfcluster import cluster, progress, remote, runrecord, status, training
from tfcluster.errors import TfclusterError
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node, write_nodes

NODES = [Node("c-chief-0", "chief", 0, "10.0.0.10", "10.0.0.10", "debian", 22, 0),
         Node("c-worker-0", "worker", 0, "10.0.0.11", "10.0.0.11", "debian", 22, 0)]
SUCCEEDED = {"supervisor": {"state": "succeeded"}, "task": {"publish_seconds": 0.4}}


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    st = ClusterState("c")
    st.dir.mkdir(parents=True)
    return st


@pytest.fixture(autouse=True)
def no_evaluator_ahead(tmp_path, monkeypatch):
    """A train here starts no sandboxed evaluator (training._AheadEvaluator: none where the sandbox cannot run)
    and writes no copy of a run into the repository's artifacts/; the tests of the evaluator ahead allow it."""
    monkeypatch.setattr("tfc_harness.sandbox.available", lambda: "not in these unit tests")
    monkeypatch.setattr(training, "artifacts_root", lambda: tmp_path / "artifacts")


def _record_spans(monkeypatch, verify_result):
    """Fake fetch (0.3 s) and verify (0.3 s, returning or raising ``verify_result``), recording their spans."""
    spans: dict[str, tuple[float, float]] = {}

    def fetch(_state, run_id, forks, console=True):
        started = time.monotonic()
        time.sleep(0.3)
        spans["fetch"] = (started, time.monotonic())
        assert (console, forks) == (False, len(NODES))
        return True

    def verify(_spec, run, warm=None):
        started = time.monotonic()
        time.sleep(0.3)
        spans["verify"] = (started, time.monotonic())
        spans["verify_thread"] = threading.current_thread() is threading.main_thread()
        if isinstance(verify_result, BaseException):
            raise verify_result
        run["state"] = runrecord.RunState.VERIFIED
        return run

    monkeypatch.setattr(training, "stop_serving_and_fetch_logs", fetch)
    monkeypatch.setattr(training, "verify", verify)
    return spans


def test_a_published_model_is_verified_while_the_logs_are_fetched(state, monkeypatch, capsys):
    spans = _record_spans(monkeypatch, None)
    run = {"run_id": "r1", "state": "started"}
    out = training._conclude(None, state, NODES, run, SUCCEEDED)
    assert out["state"] == "verified" and spans["verify_thread"] is True
    (f0, f1), (v0, v1) = spans["fetch"], spans["verify"]
    assert f0 < v1 and v0 < f1, spans            # the two ran at the same time
    saved = runrecord.read(state)
    assert saved["state"] == "verified" and saved["logs_fetched"] is True and saved["publish_seconds"] == 0.4
    assert "stop the tasks still serving, fetch logs: done in" in capsys.readouterr().out


def test_the_fetch_is_waited_for_and_recorded_when_verification_fails(state, monkeypatch):
    spans = _record_spans(monkeypatch, TfclusterError("verification failed"))
    run = {"run_id": "r1", "state": "started"}
    with pytest.raises(TfclusterError, match="verification failed"):
        training._conclude(None, state, NODES, run, SUCCEEDED)
    assert "fetch" in spans                       # finished before the error went on
    saved = runrecord.read(state)
    assert saved["logs_fetched"] is True and saved["state"] == "unverified"


def test_a_failed_run_fetches_the_logs_before_it_reports(state, monkeypatch):
    calls = []
    monkeypatch.setattr(training, "stop_serving_and_fetch_logs", lambda *a, **kw: calls.append(kw) or True)
    monkeypatch.setattr(training, "verify", lambda *a: pytest.fail("a failed run is not verified"))
    run = {"run_id": "r1", "state": "started"}
    with pytest.raises(TfclusterError, match="training failed: the chief's task ended 'failed'"):
        training._conclude(None, state, NODES, run, {"supervisor": {"state": "failed", "exit_code": 1}})
    # its task has ended: nothing to save
    assert calls == [{"stop_chief": False, "save_first": False}] and runrecord.read(state)["state"] == "failed"


def test_a_failed_run_names_the_chiefs_own_error(state, monkeypatch):
    monkeypatch.setattr(training, "stop_serving_and_fetch_logs", lambda *a, **kw: True)
    final = {"supervisor": {"state": "failed", "exit_code": 1, "restarts": 3},
             "task": {"phase": "failed", "error": "Diverged: the training loss became nan in steps 101-110"}}
    with pytest.raises(TfclusterError, match=r"^training failed: the chief's task ended 'failed' \(exit 1, "
                       r"restarts 3\): Diverged: the training loss became nan in steps 101-110; logs in "):
        training._conclude(None, state, NODES, {"run_id": "r1", "state": "started"}, final)


def test_a_failed_run_says_why_its_chief_was_not_restarted(state, monkeypatch):
    monkeypatch.setattr(training, "stop_serving_and_fetch_logs", lambda *a, **kw: True)
    final = {"supervisor": {"state": "failed", "exit_code": 6, "restarts": 0,
                            "why": "a restart would fail the same way"},
             "task": {"phase": "failed", "error": "ModelModuleError: model module m.py: build_model() raised "
                                                  "ValueError: no"}}
    with pytest.raises(TfclusterError, match=r"^training failed: the chief's task ended 'failed' \(exit 6, "
                       r"restarts 0; not restarted: a restart would fail the same way\): ModelModuleError: model "
                       r"module m.py: build_model\(\) raised ValueError: no; logs in "):
        training._conclude(None, state, NODES, {"run_id": "r1", "state": "started"}, final)


def test_a_long_error_of_the_chief_is_cut_to_its_first_line(state, monkeypatch):
    monkeypatch.setattr(training, "stop_serving_and_fetch_logs", lambda *a, **kw: True)
    final = {"supervisor": {"state": "failed", "exit_code": 1},
             "task": {"error": "InternalError: " + "x" * 500 + "\n\tAdditional GRPC error information: ..."}}
    with pytest.raises(TfclusterError) as exc:
        training._conclude(None, state, NODES, {"run_id": "r1", "state": "started"}, final)
    first = str(exc.value).split("\n", 1)[0]
    assert first.startswith("training failed: the chief's task ended 'failed' (exit 1, restarts 0): ")
    cut, rest = first.removeprefix("training failed: the chief's task ended 'failed' (exit 1, restarts 0): ") \
        .split("…; logs in ", 1)
    assert cut == ("InternalError: " + "x" * 500)[:400] and rest


def test_ctrl_c_during_verification_waits_for_the_finish_and_records_it(state, monkeypatch):
    """The finish's playbook runs in a session of its own (Ctrl-C does not reach it): it is waited for and
    recorded before the interrupt goes on."""
    spans = _record_spans(monkeypatch, KeyboardInterrupt())
    run = {"run_id": "r1", "state": "started"}
    with pytest.raises(KeyboardInterrupt):
        training._conclude(None, state, NODES, run, SUCCEEDED)
    assert "fetch" in spans
    saved = runrecord.read(state)
    assert saved["logs_fetched"] is True and saved["state"] == "unverified"


@pytest.mark.parametrize("status, said, recorded", [
    ({"phase": "preempted", "step": 340, "error": "preempted at step 340 (chief 0)"},
     "resumes run r1 from step 340, which the chief saved before it stopped", 340),
    ({"phase": "done", "step": 500}, "had published run r1's model before the stop reached it: the next "
     "'make train' of this cluster verifies it", None),
    ({"phase": "publishing", "step": 500}, "resumes run r1 from the newest checkpoint in S3 (the chief had trained "
     "every step and was publishing when it was stopped)", None),
    ({"phase": "training", "step": 340}, "resumes run r1 from the newest checkpoint in S3 (the chief, training, did "
     "not save the step it reached within 60 s", None),
    (None, "(no state of this run's chief was fetched: it may not have started)", None),
    ("[1, 2]", "(no state of this run's chief was fetched", None),        # not an object: read as data
    # an earlier run's, left in the chief's directory by a Ctrl-C before this run's start
    ({"phase": "done", "step": 500, "run_id": "r0"}, "(no state of this run's chief was fetched", None),
    ({"phase": "preempted", "step": 90, "run_id": "r0"}, "(no state of this run's chief was fetched", None),
])
def test_after_a_ctrl_c_the_user_is_told_where_the_next_train_resumes(state, tmp_path, capsys, status, said,
                                                                      recorded):
    logs = tmp_path / "chief"
    logs.mkdir()
    if status is not None:
        (logs / "status.json").write_text(status if isinstance(status, str) else json.dumps({"run_id": "r1"} | status))
    run = {"run_id": "r1", "state": "interrupted"}
    runrecord.write(state, run)
    training._say_where_it_resumes(state, run, logs)
    assert said in capsys.readouterr().out
    assert runrecord.read(state).get("stopped_step") == recorded


def test_an_unexpected_error_in_the_finish_is_a_warning_and_recorded(state, monkeypatch, capsys):
    _record_spans(monkeypatch, None)
    monkeypatch.setattr(training, "stop_serving_and_fetch_logs",
                        lambda *a, **kw: (_ for _ in ()).throw(OSError("disk full")))
    run = {"run_id": "r1", "state": "started"}
    assert training._conclude(None, state, NODES, run, SUCCEEDED)["state"] == "verified"
    assert runrecord.read(state)["logs_fetched"] is False
    assert "warning: could not fetch every node's log: OSError: disk full" in capsys.readouterr().out


@pytest.mark.parametrize("fetched, finished", [(False, True), (True, False), (None, False)])
def test_an_unverified_run_is_finished_first_only_when_its_finish_was_cut_short(state, monkeypatch, fetched,
                                                                                finished):
    from tfcluster.providers.base import write_nodes

    write_nodes(state.nodes, NODES)
    record = {"run_id": "r1", "state": "unverified"}
    if fetched is not None:
        record["logs_fetched"] = fetched
    runrecord.write(state, record)
    calls = []
    monkeypatch.setattr(training, "_check_can_train", lambda *a: None)
    monkeypatch.setattr(training, "_finish", lambda *a, **kw: calls.append("finish"))
    monkeypatch.setattr(training, "verify", lambda _spec, run: calls.append("verify") or run)
    spec = type("Spec", (), {"cluster": "c"})()
    training.train(spec)
    assert calls == (["finish", "verify"] if finished else ["verify"])


def test_the_chief_watch_waits_on_the_node_for_news_and_reads_an_older_supervisor_the_plain_way(state, monkeypatch):
    """With ``until_change`` each look is `status --until-change poll_s` and the next follows at once (the
    node did the waiting), yet at least MIN_LOOK_S apart; a supervisor that does not know the option is read
    the plain way from then on, a look every poll_s; no answer also waits out poll_s."""
    asked, replies = [], iter(["news", "news", "old", "plain", "none", DONE])

    def report(_state, _node, timeout=None, until_change=0.0):
        asked.append((until_change, time.monotonic()))
        reply = next(replies)
        if reply == "old":
            raise remote.NodeCommandError("c-chief-0: '... status --until-change 0.3' failed (exit 2): "
                                          "tfc-supervise: error: unrecognized arguments: --until-change 0.3")
        return None if reply == "none" else DONE if reply is DONE else _report("training", 3)

    monkeypatch.setattr(progress.remote, "task_status", report)
    watch = progress.ChiefWatch(state, NODES[0], 1.0, until_change=True)
    assert [watch() for _ in range(6)][-1] == DONE
    assert [a for a, _ in asked] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    gaps = [b - a for (_, a), (_, b) in zip(asked, asked[1:], strict=False)]
    # after news the next look follows at once but for MIN_LOOK_S; plain or silent: a look a poll_s
    assert all(progress.MIN_LOOK_S - 0.01 <= g < 0.6 for g in gaps[:2]) and min(gaps[2:]) >= 0.99, gaps


def test_the_chief_watch_gives_up_on_a_chief_silent_for_chief_silence_s_of_wall_time(state, monkeypatch):
    """Each unanswered read lasts ~16 s (the follower's line interval plus the status timeout): the watch gives
    up once the chief has answered nothing for CHIEF_SILENCE_S of wall time, not after 61 reads (16 min); an
    answer between silences starts the count again."""
    now = [1000.0]
    replies = iter(["none"] * 5 + ["news"] + ["none"] * 30)

    def report(_state, _node, timeout=None, until_change=0.0):
        reply = next(replies)
        now[0] += 0.1 if reply == "news" else 16.0
        return _report("training", 3) if reply == "news" else None

    monkeypatch.setattr(progress.remote, "task_status", report)
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(progress.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    watch = progress.ChiefWatch(state, NODES[0], 1.0, until_change=True)
    for _ in range(6):      # 5 silent reads (~85 s) and an answer: no give-up
        assert watch() is None
    started, reads = now[0], 0
    with pytest.raises(TfclusterError) as err:
        while True:
            reads += 1
            watch()
    assert reads == 8 and 120 < now[0] - started < 140, (reads, now[0] - started)
    said = str(err.value)
    assert "the chief c-chief-0 has not answered for 128s" in said and "gives up after 120s" in said, said
    assert "'make down' and 'make up' first" in said, said      # lost nodes are not recreated by 'make up' alone


def test_the_chief_watch_prints_each_of_the_chiefs_notes_once(state, monkeypatch, capsys):
    note = "make_optimizer's keras.optimizers.Adam runs as tfc_harness.optimizers.LockedAdam ..."
    reports = iter([{"supervisor": {"state": "running"}, "task": {"phase": "starting", "step": 0}},
                    {"supervisor": {"state": "running"}, "task": {"phase": "training", "step": 3, "total": 10,
                                                                   "notes": [note]}},
                    {"supervisor": {"state": "running"}, "task": {"phase": "training", "step": 7, "total": 10,
                                                                   "notes": [note, "second"]}},
                    {"supervisor": {"state": "succeeded"}, "task": {"phase": "done", "step": 10, "total": 10,
                                                                     "notes": [note, "second"]}}])
    monkeypatch.setattr(progress.remote, "task_status", lambda *a, **kw: next(reports))
    watch = progress.ChiefWatch(state, NODES[0], 0.01)
    for _ in range(4):
        watch()
    lines = capsys.readouterr().out.splitlines()
    assert [ln for ln in lines if not ln.lstrip().startswith("[")] == [f"  c-chief-0: {note}", "  c-chief-0: second"]
    assert lines.index(f"  c-chief-0: {note}") < lines.index("  [training] step 3/10 (30%)")    # before its step


def test_the_chief_watch_prints_a_report_once_when_polled_again_before_the_next(state, monkeypatch, capsys):
    """Polls come about as often as the chief's reports: one that sees the same report again prints no second
    line for it that differs only in the ETA."""
    same = {"supervisor": {"state": "running"}, "task": {"phase": "training", "step": 473, "total": 600,
                                                         "examples_per_sec": 1880.0}}
    reports = iter([{"supervisor": {"state": "running"}, "task": {"phase": "training", "step": 100, "total": 600,
                                                                   "examples_per_sec": 1700.0}},
                    same, same, {"supervisor": {"state": "running"}, "task": dict(same["task"], step=520)}])
    monkeypatch.setattr(progress.remote, "task_status", lambda *a, **kw: next(reports))
    watch = progress.ChiefWatch(state, NODES[0], 0.01)
    clock = iter([t for t in (0.0, 10.0, 12.0, 13.0) for _ in range(2)])   # each look: as it asks, for its ETA
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    for _ in range(4):
        watch()
    steps = [ln.split(" (")[0] for ln in capsys.readouterr().out.splitlines()]
    assert steps == ["  [training] step 100/600", "  [training] step 473/600", "  [training] step 520/600"], steps


def test_a_starting_chief_shows_no_step_yet():
    """A resumed run's chief reports step 0 until it has restored its checkpoint: no 'step 0/3000 (0%)' before
    'step 1300/3000'."""
    assert progress.progress_line({"phase": "starting", "step": 0, "total": 3000}, {"state": "running"}, None) == \
        "  [starting] a run of 3000 steps"
    assert progress.progress_line({"phase": "starting", "step": 0, "total": 3000}, {"restarts": 2}, None) == \
        "  [starting] a run of 3000 steps, restarts 2"
    assert progress.progress_line({"phase": "training", "step": 1300, "total": 3000}, {}, 4.2) == \
        "  [training] step 1300/3000 (43%), eta 4s"


def test_before_the_chiefs_first_report_the_run_is_starting_whatever_its_process_does():
    """Its supervisor's 'running' (the process runs, silent yet) reads as the run starting, as the chief's first
    report says next: not [starting], [running], [starting]. A restart before that report is said."""
    lines = [progress.progress_line({}, {"state": state}, None) for state in ("starting", "running", "restarting")]
    assert lines == ["  [starting] waiting for the chief's first report"] * 2 + \
        ["  [restarting] waiting for the chief's first report"]


def _report(phase: str, step: int, sup: str = "running") -> dict:
    return {"supervisor": {"state": sup}, "task": {"phase": phase, "step": step, "total": 10}}


DONE = _report("done", 10, "succeeded")


def test_the_evaluator_ahead_starts_once_as_it_is_entered(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr("tfc_harness.verify.WarmEvaluator", lambda dest: started.append(dest) or "warm")
    monkeypatch.setattr("tfc_harness.sandbox.available", lambda: None)
    with training._AheadEvaluator(tmp_path / "copy") as ahead:
        assert ahead.warm == "warm" and started == [tmp_path / "copy"]
        ahead.start()
        assert started == [tmp_path / "copy"]                              # one only
        ahead.warm = None                                                  # (nothing to close: a stand-in)
    monkeypatch.setattr("tfc_harness.sandbox.available", lambda: "no user namespaces")
    with training._AheadEvaluator(tmp_path / "other") as ahead:
        assert ahead.warm is None and started == [tmp_path / "copy"]       # none where the sandbox cannot run


def test_train_starts_the_evaluator_ahead_before_the_tasks_and_ends_it_after(state, monkeypatch, tmp_path):
    from tfcluster.providers.base import write_nodes

    write_nodes(state.nodes, NODES)
    events = []

    class Evaluator:
        def __init__(self, dest):
            events.append(("evaluator", dest))

        def close(self):
            events.append("closed")

    monkeypatch.setattr("tfc_harness.verify.WarmEvaluator", Evaluator)
    monkeypatch.setattr("tfc_harness.sandbox.available", lambda: None)
    monkeypatch.setattr(training, "_check_can_train", lambda *a: None)
    monkeypatch.setattr(training.job, "prepare", lambda spec, every_hparam_read: events.append(
        ("every_hparam_read", every_hparam_read)) or {})
    monkeypatch.setattr(training, "_data_line", lambda *a: "data")
    monkeypatch.setattr(training, "_open_run", lambda *a: ({"run_id": "r1", "resumed": False}, {}))
    monkeypatch.setattr(training, "_local_copy", lambda *a: tmp_path / "copy")
    monkeypatch.setattr(training, "_run_tasks", lambda *a: events.append("tasks") or SUCCEEDED)
    monkeypatch.setattr(training, "_conclude", lambda *a: events.append(("conclude", type(a[-1]).__name__))
                        or {"state": "verified"})
    spec = type("Spec", (), {"cluster": "c", "provider": "local"})()
    assert training.train(spec, configure_first=False) == {"state": "verified"}
    # a run of its own checks every hparam is read (a sweep's trial: the sweep checked); the evaluator's import
    # goes on while the tasks start, the verification gets it, and it is ended after
    assert events == [("every_hparam_read", True), ("evaluator", tmp_path / "copy"), "tasks",
                      ("conclude", "Evaluator"), "closed"]


def test_the_chief_watch_looks_up_the_workers_read_rate_often_until_one_reports_it(state, monkeypatch, capsys):
    """A stream can end within DATA_POLL_S of its start: the rate is asked for every FIRST_DATA_POLL_S until a
    worker reports one, and only then every DATA_POLL_S."""
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    worker = NODES[1]
    asked, rates = [], iter([None, None, 42.5, 50.0])

    def report(_state, node, timeout=None, until_change=0.0):
        if node is worker:
            asked.append(clock[0])
            rate = next(rates)
            return {"task": {"data": {"mb_per_s": rate}} if rate is not None else {}}
        return _report("training", 3)

    monkeypatch.setattr(progress.remote, "task_status", report)
    watch = progress.ChiefWatch(state, NODES[0], 1.0, streamers=[worker])
    for _ in range(20):          # one call a second, as wait_for_chief makes them
        watch()
        clock[0] += 1.0
    first = progress.FIRST_DATA_POLL_S
    assert asked[:3] == [100.0, 100.0 + first, 100.0 + 2 * first], asked     # until the first rate
    assert asked[3] == asked[2] + progress.DATA_POLL_S, asked                   # then the slow period
    assert "data from S3 42.5 MB/s" in capsys.readouterr().out


@pytest.mark.parametrize("second, shown", [
    ({"mb_per_s": 7.5, "all_kept": True, "reused": 4}, "data from the workers' disks (each file downloaded once)"),
    ({"mb_per_s": 3.0}, "data from S3 3.0 MB/s"),       # the other still reads from S3: its rate alone
    (None, None),                 # the other's status is unknown: nothing is said of the data, not "kept"
])
def test_the_chief_watch_says_when_the_workers_read_their_kept_files(state, monkeypatch, capsys, second, shown):
    workers = [NODES[1], Node("c-worker-1", "worker", 1, "10.0.0.12", "10.0.0.12", "debian", 22, 0)]
    data = {workers[0].name: {"mb_per_s": 9.0, "all_kept": True, "reused": 2}, workers[1].name: second}

    def report(_state, node, timeout=None, until_change=0.0):
        if node not in workers:
            return _report("training", 3)
        return {"task": {"data": data[node.name]}} if data[node.name] else {}

    monkeypatch.setattr(progress.remote, "task_status", report)
    progress.ChiefWatch(state, NODES[0], 1.0, streamers=workers)()
    out = capsys.readouterr().out
    assert (shown in out and out.count("data ") == 1) if shown else "data " not in out, out


def test_the_chief_watch_asks_a_silent_worker_for_its_rate_often_only_at_first(state, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    worker, asked = NODES[1], []

    def report(_state, node, timeout=None, until_change=0.0):
        if node is worker:
            asked.append(clock[0])
            return {"task": {}}                  # never a rate
        return _report("training", 3)

    monkeypatch.setattr(progress.remote, "task_status", report)
    watch = progress.ChiefWatch(state, NODES[0], 1.0, streamers=[worker])
    for _ in range(200):
        watch()
        clock[0] += 1.0
    gaps = [b - a for a, b in zip(asked, asked[1:], strict=False)]
    early = int(progress.FIRST_DATA_WINDOW_S / progress.FIRST_DATA_POLL_S)
    assert set(gaps[:early - 1]) == {progress.FIRST_DATA_POLL_S}, gaps
    assert set(gaps[early + 1:]) == {progress.DATA_POLL_S}, gaps      # then the slow period, for good


def test_make_status_says_a_worker_reads_its_kept_files_without_an_old_s3_rate():
    kept = status._stream_text({"bytes": 19588, "mb_per_s": 0.3, "epoch": 39, "files": 3, "error": None,
                                  "reused": 114, "all_kept": True})
    assert kept == (", data from its disk: its 3 files were downloaded once (20 kB), 114 reads of them since "
                    "(epoch 39)")
    streaming = status._stream_text({"bytes": 2e9, "mb_per_s": 41.5, "epoch": 1, "files": 9, "error": None})
    assert streaming == ", data from S3 41.5 MB/s (epoch 1, 2000 MB read)"


def test_make_status_shows_the_chiefs_notes_below_its_row(monkeypatch, state):
    notes = ["warning: make_optimizer returns keras.optimizers.RMSprop: under parameter_server ...",
             "warning: 1 variable(s) (emb:0) are updated by Keras's own Adam update"]

    def report(state, node, timeout):
        task = {"phase": "training", "step": 5, "total": 10}
        return {"supervisor": {"state": "running"}, "task": task | ({"notes": notes} if node.role == "chief" else {})}

    monkeypatch.setattr(status.remote, "task_status", report)
    states = status.task_states(state, NODES)
    chief = next(n.name for n in NODES if n.role == "chief")
    assert states[chief].splitlines()[1:] == [f"    {note}" for note in notes], states[chief]
    assert all("\n" not in text for name, text in states.items() if name != chief), states


def test_make_status_says_why_a_failed_task_was_not_restarted(monkeypatch, state):
    def report(state, node, timeout):
        if node.role != "chief":
            return {"supervisor": {"state": "stopped"}, "task": {}}
        return {"supervisor": {"state": "failed", "restarts": 1, "why": "it failed with the same error at the same "
                               "step as on its last try"}, "task": {"phase": "failed", "step": 40, "total": 300}}

    monkeypatch.setattr(status.remote, "task_status", report)
    states = status.task_states(state, NODES)
    chief = next(n.name for n in NODES if n.role == "chief")
    assert states[chief] == ("failed (restarts 1; not restarted: it failed with the same error at the same step "
                             "as on its last try), failed step 40/300"), states
    assert all(text == "stopped" for name, text in states.items() if name != chief), states


def test_make_status_marks_the_tasks_of_an_earlier_run(monkeypatch, state):
    """A run whose start was cut short (Ctrl-C during the start play): the chief still reports the earlier run's
    end, which make status must not show as the new run's. Told by the run's deadline each supervisor was
    started with (the controller's number), not by the node's clock: this chief's clock is far behind."""
    runrecord.write(state, {"run_id": "r2", "state": "started", "started": 2000.0, "deadline": 5600.123456})

    def report(state, node, timeout):
        deadline = 4000.5 if node.role == "chief" else 5600.123456
        return {"supervisor": {"state": "succeeded", "started": 10.0, "deadline": deadline},
                "task": {"phase": "done", "step": 300, "total": 300}}

    monkeypatch.setattr(status.remote, "task_status", report)
    states = status.task_states(state, NODES)
    assert all(text.endswith(" (an earlier run's task)") == (name.endswith("chief-0")) for name, text in
               states.items()), states


def test_a_resumed_run_keeps_the_logs_its_earlier_attempts_fetched(state):
    """A resumed run's tasks start new node logs and its end fetches them to logs/<run-id>/ again: what an
    earlier attempt fetched moves to logs/<run-id>/attempt-<n>/ first, never replaced."""
    run = state.logs / "r1"
    assert training.keep_earlier_attempt_logs(state, "r1") is None          # nothing fetched yet
    for attempt in (1, 2):
        (run / "c-chief-0").mkdir(parents=True)
        (run / "c-chief-0" / "node.log").write_text(f"attempt {attempt}\n")
        assert training.keep_earlier_attempt_logs(state, "r1") == run / f"attempt-{attempt}"
        assert not (run / "c-chief-0").exists()
    assert [(p.parent.parent.name, p.read_text()) for p in sorted(run.glob("attempt-*/*/node.log"))] == [
        ("attempt-1", "attempt 1\n"), ("attempt-2", "attempt 2\n")]
    (run / "attempt-1").rename(run / "attempt-7")                            # a gap: after the highest
    (run / "c-chief-0").mkdir()
    assert training.keep_earlier_attempt_logs(state, "r1") == run / "attempt-8"


def test_a_run_of_other_settings_is_not_resumed(state, capsys):
    from tfcluster import config

    spec = config.resolve({"cluster": "cc"})     # (its record: the state of cluster c)
    prepared = {"describe": {"source": "module", "sha256": "ab"}, "data": None, "dataset_prefix": "p"}
    first, _ = training._open_run(spec, state, {}, prepared)
    again, _ = training._open_run(spec, state, dict(first, state="interrupted"), prepared)
    assert again["resumed"] and again["run_id"] == first["run_id"]
    changed = dict(first, state="interrupted", fingerprint=dict(first["fingerprint"], hparams={"u": 1}))
    other = training._open_run(spec, state, changed, prepared)[0]
    assert not other["resumed"] and f"run {first['run_id']} differs in hparams; starting a new run" in \
        capsys.readouterr().out


@pytest.mark.parametrize("record, fetched_first", [
    ({"run_id": "r1", "state": "started"}, True),                           # its controller was lost
    ({"run_id": "r1", "state": "interrupted", "logs_fetched": False}, True),  # its finish could not fetch
    ({"run_id": "r1", "state": "interrupted", "logs_fetched": True}, False),
    ({"run_id": "r1", "state": "verified", "logs_fetched": True}, False),
    # down could not fetch them either, and took its nodes: these are new ones, none of its tasks is on them
    ({"run_id": "r1", "state": "interrupted", "logs_fetched": False, "nodes_gone": True}, False),
])
def test_a_run_left_without_its_logs_has_them_fetched_before_new_tasks_start(state, monkeypatch, record,
                                                                            fetched_first):
    write_nodes(state.nodes, NODES)
    runrecord.write(state, record)
    calls = []
    monkeypatch.setattr(training, "_check_can_train", lambda *a: None)
    monkeypatch.setattr(training.job, "prepare", lambda spec, every_hparam_read: {})
    monkeypatch.setattr(training, "_data_line", lambda *a: "data")
    monkeypatch.setattr(training, "_finish", lambda _s, _st, _n, run, stop_chief, save_first=False: calls.append(
        ("finish", run["run_id"], stop_chief, save_first)))
    monkeypatch.setattr(training, "_open_run", lambda *a: calls.append("open") or ({"run_id": "r1",
                                                                                    "resumed": True}, {}))
    monkeypatch.setattr(training, "_published", lambda *a: False)
    monkeypatch.setattr(training, "keep_earlier_attempt_logs", lambda _state, run_id: calls.append("keep"))
    monkeypatch.setattr(training, "_run_tasks", lambda *a, **kw: calls.append("tasks") or SUCCEEDED)
    monkeypatch.setattr(training, "_conclude", lambda *a: {"state": "verified"})
    spec = type("Spec", (), {"cluster": "c", "provider": "aws"})()
    training.train(spec, configure_first=False)
    # not saving first: the nodes' supervisors may be an earlier tfcluster's, without `stop --save`
    assert calls == ([("finish", "r1", True, False)] if fetched_first else []) + ["open", "keep", "tasks"]


def test_a_resumed_run_published_before_it_stopped_is_verified_and_its_logs_stay(state, monkeypatch):
    write_nodes(state.nodes, NODES)
    runrecord.write(state, {"run_id": "r1", "state": "interrupted", "logs_fetched": True})
    calls = []
    monkeypatch.setattr(training, "_check_can_train", lambda *a: None)
    monkeypatch.setattr(training.job, "prepare", lambda spec, every_hparam_read: {})
    monkeypatch.setattr(training, "_data_line", lambda *a: "data")
    monkeypatch.setattr(training, "_open_run", lambda *a: ({"run_id": "r1", "resumed": True}, {}))
    monkeypatch.setattr(training, "_published", lambda *a: True)
    monkeypatch.setattr(training, "keep_earlier_attempt_logs", lambda *a: calls.append("keep"))
    monkeypatch.setattr(training, "verify", lambda _spec, run: calls.append("verify") or run)
    training.train(type("Spec", (), {"cluster": "c", "provider": "aws"})(), configure_first=False)
    assert calls == ["verify"]


def test_the_eta_waits_for_the_steps_after_the_first_call(monkeypatch):
    """A resumed run's first report is its resume step; the loop's first call (tracing) is slow, so the rate is
    taken from the first report past that step on: no ETA from the tracing's pace."""
    watch = progress.ChiefWatch(None, NODES[0], 1.0)
    clock = iter([0.0, 5.0, 6.0, 8.0, 9.0, 500.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    training_at = {"phase": "training", "total": 30000}
    assert watch._eta(training_at | {"step": 6700}) is None      # resumed here; the first call traces
    assert watch._eta(training_at | {"step": 6800}) is None      # the first call's end: the base
    assert watch._eta(training_at | {"step": 6900}) == pytest.approx((30000 - 6900) / 100)
    assert watch._eta(training_at | {"step": 7100}) == pytest.approx((30000 - 7100) / 100)
    # the same step again (the chief's status not rewritten yet): the ETA counts down instead of growing
    assert watch._eta(training_at | {"step": 7100}) == pytest.approx((30000 - 7100) / 100 - 1)
    assert watch._eta(training_at | {"step": 7100}) is None      # overdue: no ETA, not "eta 0s"


def test_the_eta_is_timed_by_the_chiefs_reports_not_by_when_they_arrive(monkeypatch):
    """The first report past the first call and the next one can arrive together: the rate is timed by the chief's
    own stamps (``updated``), so the ETA is not "eta 0s" when they do."""
    watch = progress.ChiefWatch(None, NODES[0], 1.0)
    clock = iter([0.0, 5.0, 5.01, 6.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    training_at = {"phase": "training", "total": 600}
    assert watch._eta(training_at | {"step": 0, "updated": 1000.0}) is None
    assert watch._eta(training_at | {"step": 10, "updated": 1004.0}) is None        # the first call's end: the base
    assert watch._eta(training_at | {"step": 110, "updated": 1005.0}) == pytest.approx((600 - 110) / 100)
    assert watch._eta(training_at | {"step": 110, "updated": 1005.0}) == pytest.approx((600 - 110) / 100 - 0.99)


def test_a_second_ctrl_c_does_not_cut_the_stop_of_the_tasks_short():
    """After a Ctrl-C the tasks are stopped with SIGINT ignored (in the main thread; a sweep's trial threads
    leave it to the sweep), then the handler the command had is back."""
    import os
    import signal

    before = signal.getsignal(signal.SIGINT)
    with cluster.ctrl_c_ignored():
        os.kill(os.getpid(), signal.SIGINT)      # would raise KeyboardInterrupt here
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before
    seen = []
    thread = threading.Thread(target=lambda: seen.append(cluster.ctrl_c_ignored().__enter__() is None))
    thread.start()
    thread.join()
    assert seen == [True] and signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("record, after", [
    ({"run_id": "r1", "state": "started"}, "abandoned"),         # open: it cannot be resumed on new nodes
    ({"run_id": "r1", "state": "interrupted"}, "interrupted"),   # resumable on new nodes (checkpoints in S3)
    ({"run_id": "r1", "state": "verified"}, "verified"),
])
def test_down_records_that_the_runs_nodes_are_gone(state, monkeypatch, record, after):
    """A re-up does not tell a kept node from a new one (nodes.json is written again either way): down records
    that the run's nodes went, and only that keeps the next train from stopping and fetching its tasks."""
    from tfcluster import teardown

    runrecord.write(state, record)
    teardown.close_run_after_down("c")
    saved = runrecord.read(state)
    assert saved["nodes_gone"] is True and saved["state"] == after
    write_nodes(state.nodes, NODES)
    state.spec.write_text("{}")
    monkeypatch.setattr(teardown, "load_spec", lambda state: type("Spec", (), {"node_total": 2})())
    monkeypatch.setattr(teardown.training, "stop_serving_and_fetch_logs", lambda *a: pytest.fail("fetched"))
    teardown.fetch_logs_before_down("c")      # its nodes are gone: nothing of it on these


def test_a_run_past_the_steps_asked_or_of_another_learning_rate_is_not_resumed(state, monkeypatch, capsys):
    """A resumed chief refuses a checkpoint beyond training.steps (and its supervisor would restart it to refuse
    again): a run whose checkpoint in S3 is past the steps asked starts anew, its checkpoints kept, unless its
    model is published (verified instead) or held on its chief (published by it). A checkpoint restores the
    optimizer's learning rate: another one starts a new run too; a record made before the learning rate was
    part of the fingerprint still resumes."""
    from tfc_harness import checkpoints

    from tfcluster import config

    listed, published = [], []

    def saved_steps(client, bucket, prefix, **retries):
        listed.append((bucket, prefix, retries))
        return [200, 400]

    monkeypatch.setattr(training.store, "client", lambda spec: object())
    monkeypatch.setattr(checkpoints, "saved_steps", saved_steps)
    monkeypatch.setattr(training, "_published", lambda spec, settings: settings["run_id"] in published)
    prepared = {"describe": {"source": "module", "sha256": "ab"}, "data": None, "dataset_prefix": "p"}

    def open_run(previous, **training_settings):
        spec = config.resolve({"cluster": "cc", "training": {"steps": 600, **training_settings}})
        run, _ = training._open_run(spec, state, previous, prepared)
        return run, capsys.readouterr().out

    first, _ = open_run({})
    assert listed == []                                             # nothing to resume: S3 not asked
    stopped = dict(first, state="interrupted")
    again, out = open_run(stopped, steps=400)
    assert again["resumed"] and again["run_id"] == first["run_id"], out
    assert listed == [("tfcluster", f"runs/cc/{first['run_id']}/checkpoints", {"tries": 1, "log": None})]
    other, out = open_run(stopped, steps=300)
    assert not other["resumed"] and other["run_id"] != first["run_id"]
    assert (f"run {first['run_id']} reached step 400 (its checkpoint in S3), beyond training.steps 300; starting a "
            "new run instead of resuming") in out
    published.append(first["run_id"])
    assert open_run(stopped, steps=300)[0]["run_id"] == first["run_id"]    # published: train verifies it
    published.clear()
    assert open_run(dict(stopped, state="unpublished"), steps=300)[0]["run_id"] == first["run_id"]
    other, out = open_run(stopped, learning_rate=0.0001)
    assert not other["resumed"] and f"run {first['run_id']} differs in learning_rate; starting a new run" in out
    older = dict(stopped, fingerprint={k: v for k, v in first["fingerprint"].items() if k != "learning_rate"})
    assert open_run(older, learning_rate=0.0001)[0]["resumed"]
    trial = dict(stopped, fingerprint=dict(first["fingerprint"], trial="s/t01"))   # a trial's run: only its own
    assert not open_run(trial)[0]["resumed"]


def test_a_failed_runs_log_tail_leaves_out_tensorflows_remote_cleanup_lines(tmp_path):
    log = tmp_path / "node.log"
    noise = ("E0000 00:00:1795788412.5 123 context.cc:911] Failed to remove function remotely due to Unavailable: "
             "... This could happen if the remote target has been disconnected from the client.")
    log.write_text("\n".join(["step 100/400 loss 0.3", "", "HarnessError: checkpoint step 7400 is beyond steps=3000",
                              "  ", *[noise] * 40]) + "\n")
    tail = training._log_tail(log).splitlines()
    assert tail == ["step 100/400 loss 0.3", "HarnessError: checkpoint step 7400 is beyond steps=3000",
                    f"(40 lines of TensorFlow's 'Failed to remove function remotely' left out; the whole log is {log})"]
    assert training._log_tail(tmp_path / "none.log") == f"(no log at {tmp_path / 'none.log'})"


def test_make_status_of_a_cluster_that_is_down_shows_how_its_last_run_ended(state, capsys):
    from tfcluster import cluster

    runrecord.write(state, {"run_id": "r3", "state": "verify_failed", "headline": "test_auc", "test_auc": 0.8869,
                            "s3_prefix": "s3://b/runs/c/r3/", "deadline": 1.0})
    assert cluster.status(state.cluster) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"cluster {state.cluster}: not up (no {state.nodes})",
                   "run r3: verify_failed, test auc 0.8869 (s3://b/runs/c/r3/)"], out


def test_the_eta_starts_afresh_after_the_chief_restarts(monkeypatch):
    """A chief restarted mid-run (its phase leaves training) resumes from its checkpoint: the ETA's rate is taken
    again from the restarted loop's steps, not across the restart's pause."""
    watch = progress.ChiefWatch(None, NODES[0], 1.0)
    clock = iter([0.0, 1.0, 2.0, 3.0, 100.0, 101.0, 102.0, 103.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    training_at = {"phase": "training", "total": 1000}
    for step in (0, 100, 200):
        watch._eta(training_at | {"step": step})
    assert watch._eta(training_at | {"step": 300}) == pytest.approx((1000 - 300) / 100)
    assert watch._eta({"phase": "starting", "step": 0, "total": 1000}) is None     # restarted: ~100 s pass
    assert watch._eta(training_at | {"step": 200}) is None      # resumed at its checkpoint; the first call traces
    assert watch._eta(training_at | {"step": 250}) is None      # the base
    # 150 steps a second since the restarted loop's first call (across the restart: 300 steps in 102 s, ~204 s)
    assert watch._eta(training_at | {"step": 400}) == pytest.approx((1000 - 400) / 150)


def _follow_status(phase: str, step: int = 0, state: str = "running") -> dict:
    return {"supervisor": {"state": state}, "task": {"phase": phase, "step": step, "total": 10},
            "unpublished": None}


@pytest.fixture
def node_prints(monkeypatch):
    """Make the follower's ssh a Python process that runs ``code`` (with json, sys, time imported) and
    records each command it was asked to run; returns (set_code, commands)."""
    commands, code = [], {"text": ""}

    def ssh_command(_state, _node, command):
        commands.append(command)
        return [sys.executable, "-c", "import json, sys, time\n" + code["text"]]

    monkeypatch.setattr(remote, "ssh_command", ssh_command)
    return (lambda text: code.update(text=text)), commands


def test_the_follower_reads_the_newest_line_runs_one_session_and_ends_it(state, node_prints, monkeypatch):
    set_code, commands = node_prints
    # ~5 KiB each, read 4 KiB at a time (through ssh a backlog arrives in pieces): still the newest is taken
    monkeypatch.setattr(remote, "READ_CHUNK", 4 << 10)
    lines = [json.dumps(dict(_follow_status("training", s), pad="x" * (5 << 10))) for s in (1, 2, 3)]
    set_code(f"print({lines[0]!r}, flush=True)\ntime.sleep(0.5)\nprint({lines[1]!r})\nprint({lines[2]!r}, "
             f"flush=True)\ntime.sleep(60)\n")
    follower = remote.StatusFollower(state, NODES[0], 1.0)
    try:
        assert follower.read(10)["task"]["step"] == 1
        time.sleep(1.0)                               # both later lines are there by now: the newest is taken
        assert follower.read(10)["task"]["step"] == 3
        proc = follower.proc
        t0 = time.monotonic()
        assert follower.read(0.5) is None              # silent for the whole time: no answer, the session ended
        assert 0.5 <= time.monotonic() - t0 < 3 and proc.poll() is not None and follower.proc is None
    finally:
        follower.close()
    assert commands == [f"sudo -n {remote.SUPERVISE} status --dir {remote.TASK_DIR} --follow 1"]


def test_the_follower_tells_an_ended_session_a_lost_node_and_an_older_supervisor_apart(state, node_prints):
    set_code, commands = node_prints
    done = json.dumps(_follow_status("done", 10, "succeeded"))
    set_code(f"print({done!r})\n")                    # its last status, then it ends by itself
    follower = remote.StatusFollower(state, NODES[0], 1.0)
    assert follower.read(10)["supervisor"]["state"] == "succeeded"
    assert follower.read(10) is None and follower.proc is None          # ended: the next read starts again
    set_code("sys.exit(255)\n")                       # ssh's own failure: the node did not answer
    assert follower.read(10) is None
    set_code("print('tfc-supervise: error: unrecognized arguments: --follow 1', file=sys.stderr)\nsys.exit(2)\n")
    with pytest.raises(remote.NodeCommandError, match="unrecognized arguments: --follow 1"):
        follower.read(10)
    set_code("print('not a status', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(remote.NodeCommandError, match="printed no status: 'not a status'"):
        follower.read(10)
    proc = follower.proc
    follower.close()
    assert proc.poll() is not None and follower.proc is None and len(commands) == 4   # a session a start


def test_wait_for_chief_follows_the_chief_and_ends_the_session(state, node_prints, capsys, monkeypatch):
    set_code, _ = node_prints
    steps = [json.dumps(_follow_status("training", s)) for s in (3, 7)]
    steps.append(json.dumps(_follow_status("done", 10, "succeeded")))
    set_code("".join(f"print({s!r}, flush=True)\ntime.sleep(0.3)\n" for s in steps) + "time.sleep(60)\n")
    started = []
    real = remote.StatusFollower.read

    def read(self, timeout):
        got = real(self, timeout)
        started.append(self.proc)
        return got

    monkeypatch.setattr(remote.StatusFollower, "read", read)
    final = progress.wait_for_chief(state, NODES[0], 30, poll_s=1.0)
    assert final["supervisor"]["state"] == "succeeded"
    out = capsys.readouterr().out
    assert "step 3/10" in out and "step 7/10" in out, out
    assert len({id(p) for p in started}) == 1 and started[0].poll() is not None   # one session, ended


def test_the_watch_reads_an_older_supervisor_by_until_change(state, monkeypatch):
    """A supervisor from before ``--follow`` refuses it: the watch drops the follower and reads by
    ``--until-change`` from then on."""
    class Old:
        closed = False

        def __init__(self, *_a):
            pass

        def read(self, _timeout):
            raise remote.NodeCommandError("c-chief-0: '... --follow 1' failed (exit 2): tfc-supervise: error: "
                                          "unrecognized arguments: --follow 1")

        def close(self):
            Old.closed = True

    asked = []
    monkeypatch.setattr(remote, "StatusFollower", Old)
    monkeypatch.setattr(remote, "task_status", lambda *_a, timeout=None, until_change=0.0:
                        asked.append(until_change) or _follow_status("done", 10, "succeeded"))
    watch = progress.ChiefWatch(state, NODES[0], 1.0, until_change=True, follow=True)
    assert watch() is None and Old.closed and watch.follower is None
    assert watch()["supervisor"]["state"] == "succeeded" and asked == [1.0]


def test_a_ctrl_c_during_the_watch_ends_its_session(state, node_prints, monkeypatch):
    set_code, _ = node_prints
    set_code(f"print({json.dumps(_follow_status('training', 3))!r}, flush=True)\ntime.sleep(60)\n")
    real, sessions = remote.StatusFollower.read, []

    def read(self, timeout):
        if sessions:
            raise KeyboardInterrupt
        got = real(self, timeout)
        sessions.append(self.proc)
        return got

    monkeypatch.setattr(remote.StatusFollower, "read", read)
    with pytest.raises(KeyboardInterrupt):
        progress.wait_for_chief(state, NODES[0], 30, poll_s=1.0)
    assert sessions[0].poll() is not None       # the ssh (here its stand-in, still sleeping) was ended
