"""Roles: argument specs in step with defaults; the task supervisor's behaviour."""

from __future__ import annotations

import json
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.imds import FakeImds
from tests.unit.supervise import SUPERVISE

ROLES = sorted(p for p in (REPO / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_argument_specs_match_defaults(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert set(specs["main"]["options"]) == set(defaults), role.name
    for name in defaults:
        assert name.startswith(role.name + "_"), f"{name} lacks the role prefix"
    for entry, spec in specs.items():
        for name, opt in spec["options"].items():
            assert "type" in opt and "description" in opt, f"{role.name}/{entry}/{name}"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_task_is_named_and_fqcn(role):
    def tasks(listed):      # a block's tasks, and its rescue's and always's, count too
        for task in listed or []:
            yield task
            for part in ("block", "rescue", "always"):
                yield from tasks(task.get(part))

    for path in (role / "tasks").glob("*.yml"):
        for task in tasks(yaml.safe_load(path.read_text())):
            assert task.get("name"), f"{path}: unnamed task {task}"
            if "block" in task:
                continue
            module = next(k for k in task if k not in ("name", "register", "when", "loop", "vars", "no_log",
                                                       "changed_when", "failed_when", "delegate_to", "run_once",
                                                       "environment", "with_fileglob", "tags", "become"))
            assert module.startswith("ansible."), f"{path}: {task['name']} uses {module} without FQCN"


def _sup(*args, timeout=30):
    return subprocess.run([str(SUPERVISE), *args], capture_output=True, text=True, timeout=timeout)


def _state(d: Path) -> dict:
    return json.loads(_sup("status", "--dir", str(d)).stdout)["supervisor"]


def _wait_state(d: Path, states, timeout=30.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = _state(d)
        if st.get("state") in states:
            return st
        time.sleep(0.1)
    raise AssertionError(f"supervisor never reached {states}: {_state(d)}")


def _wait_running(d: Path, timeout=30.0) -> dict:
    """The supervisor's state once its task has said ``running`` in its log: the shell has set its traps (a
    signal between the supervisor's "running" and the trap would end it instead)."""
    st = _wait_state(d, ("running",), timeout)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if "running" in (d / "node.log").read_text().splitlines():
            return st
        time.sleep(0.05)
    raise AssertionError(f"the task never said running: {(d / 'node.log').read_text()}")


def test_supervisor_restarts_with_bounded_tries_and_env_file(tmp_path):
    env = tmp_path / "env"
    env.write_text("SECRET_FOR_TASK=s3cr3t\n")
    d = tmp_path / "task"
    res = _sup("start", "--dir", str(d), "--env-file", str(env), "--max-restarts", "2", "--",
               "/bin/sh", "-c", '[ "${#SECRET_FOR_TASK}" = 6 ] && echo has-env; exit 3')
    assert res.stdout.startswith("started"), res.stdout + res.stderr
    st = _wait_state(d, ("failed",))
    assert (st["restarts"], st["exit_code"]) == (2, 3)
    log = (d / "node.log").read_text()
    assert log.splitlines().count("has-env") == 3 and "restarting in 1s" in log and "restarting in 2s" in log
    assert "s3cr3t" not in log


def test_a_task_exiting_6_is_not_restarted_and_the_state_says_why(tmp_path):
    d = tmp_path / "task"
    _sup("start", "--dir", str(d), "--max-restarts", "3", "--", "/bin/sh", "-c", "echo tried; exit 6")
    st = _wait_state(d, ("failed",))
    assert (st["restarts"], st["exit_code"], st["why"]) == (0, 6, "a restart would fail the same way"), st
    log = (d / "node.log").read_text()
    assert log.splitlines().count("tried") == 1 and "not restarted: a restart would fail the same way" in log


#: a task that records an error in its status.json, as the harness does, and fails: the error's text is $1, its
#: directory $2; at step $3 (0 unless given) with exit code $4 (1 unless given)
RECORDS_ERROR = ("""printf '{"phase": "failed", "step": %s, "error": "%s"}' "${3:-0}" "$1" > "$2/status.json"; """
                 """exit ${4:-1}""")


def test_a_task_failing_twice_with_the_same_recorded_error_is_not_restarted_again(tmp_path):
    same = tmp_path / "same"
    _sup("start", "--dir", str(same), "--max-restarts", "3", "--", "/bin/sh", "-c", RECORDS_ERROR, "sh",
         "InvalidArgumentError: Field 2 in record 5 is not a valid float", str(same))
    st = _wait_state(same, ("failed",))
    assert (st["restarts"], st["exit_code"]) == (1, 1), st
    assert st["why"] == "it failed with the same error at the same step as on its last try", st
    # the same error at a later step (training went on between the two), or with a watchdog's exit: restarted
    later = tmp_path / "later"
    _sup("start", "--dir", str(later), "--max-restarts", "2", "--", "/bin/sh", "-c",
         'echo x >> "$2/tries"; ' + RECORDS_ERROR.replace('"${3:-0}"', '$(wc -l < "$2/tries")'),
         "sh", "AbortedError: worker/1 lost", str(later))
    st = _wait_state(later, ("failed",))
    assert (st["restarts"], "why" in st) == (2, False), st
    stalled = tmp_path / "stalled"
    _sup("start", "--dir", str(stalled), "--max-restarts", "2", "--", "/bin/sh", "-c", RECORDS_ERROR, "sh",
         "no training step for 90 s", str(stalled), "300", "4")
    st = _wait_state(stalled, ("failed",))
    assert (st["restarts"], st["exit_code"], "why" in st) == (2, 4, False), st
    # another error each try, or none recorded (a crash before the harness wrote its status): every restart
    differs = tmp_path / "differs"
    _sup("start", "--dir", str(differs), "--max-restarts", "2", "--",
         "/bin/sh", "-c", 'echo x >> "$2/tries"; n=$(wc -l < "$2/tries"); ' + RECORDS_ERROR.replace('"$1"', '"try $n"'),
         "sh", "", str(differs))
    st = _wait_state(differs, ("failed",))
    assert (st["restarts"], "why" in st) == (2, False), st
    silent = tmp_path / "silent"
    silent.mkdir()
    (silent / "status.json").write_text('{"phase": "failed", "error": "from an earlier run"}')
    _sup("start", "--dir", str(silent), "--max-restarts", "2", "--", "/bin/sh", "-c", "exit 1")
    st = _wait_state(silent, ("failed",))
    assert (st["restarts"], "why" in st) == (2, False), st


def test_supervisor_start_is_idempotent_and_stop_ends_the_task(tmp_path):
    d = tmp_path / "task"
    assert _sup("start", "--dir", str(d), "--", "sleep", "300").stdout.startswith("started")
    first = _wait_state(d, ("running",))
    assert _sup("start", "--dir", str(d), "--", "sleep", "300").stdout.startswith("already running")
    assert _state(d)["child_pid"] == first["child_pid"]
    assert _sup("stop", "--dir", str(d)).stdout.startswith("stopped")
    assert _state(d)["state"] == "stopped"
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(first["child_pid"], 0)


def test_supervisor_success_and_deadline(tmp_path):
    ok = tmp_path / "ok"
    _sup("start", "--dir", str(ok), "--", "true")
    assert _wait_state(ok, ("succeeded", "failed"))["state"] == "succeeded"
    late = tmp_path / "late"
    _sup("start", "--dir", str(late), "--deadline", str(time.time() + 1), "--", "sleep", "300")
    assert _wait_state(late, ("deadline",), timeout=20)["state"] == "deadline"
    assert "max runtime reached" in (late / "node.log").read_text()


def test_fresh_start_rotates_the_log(tmp_path):
    d = tmp_path / "task"
    _sup("start", "--dir", str(d), "--", "/bin/echo", "first")
    _wait_state(d, ("succeeded",))
    _sup("start", "--fresh", "--dir", str(d), "--", "/bin/echo", "second")
    _wait_state(d, ("succeeded",))
    assert "second" in (d / "node.log").read_text() and "first" not in (d / "node.log").read_text()
    assert "first" in (d / "node.log.1").read_text()


#: a task that saves on SIGUSR1 and exits 5, as the harness does on a preemption notice
SAVES_ON_NOTICE = "trap 'echo saved-at-once; exit 5' USR1; echo running; while :; do sleep 0.1; done"


def test_supervisor_passes_the_aws_spot_notice_to_the_task_which_is_not_restarted(tmp_path):
    imds = FakeImds()
    try:
        d = tmp_path / "task"
        _sup("start", "--dir", str(d), "--notice", "aws", "--metadata-url", imds.url, "--",
             "/bin/sh", "-c", SAVES_ON_NOTICE)
        _wait_state(d, ("running",))
        time.sleep(3)       # a few polls without a notice: the task runs on
        assert _state(d)["state"] == "running" and ("PUT", "/latest/api/token") in imds.requests
        imds.action = '{"action": "terminate", "time": "2026-11-23T05:00:00Z"}'
        st = _wait_state(d, ("preempted",), timeout=20)
        assert st["exit_code"] == 5 and st["restarts"] == 0 and "terminate" in st["notice"], st
        log = (d / "node.log").read_text()
        assert "saved-at-once" in log and "not restarted" in log, log
    finally:
        imds.close()


def test_sigterm_is_a_notice_and_stop_still_stops(tmp_path):
    """A VM shutting down sends SIGTERM: the task is told to save; `stop` (Ctrl-C, end of a run) just stops."""
    d = tmp_path / "shutdown"
    _sup("start", "--dir", str(d), "--", "/bin/sh", "-c", SAVES_ON_NOTICE)
    st = _wait_running(d)
    os.kill(st["pid"], signal.SIGTERM)
    assert _wait_state(d, ("preempted",), timeout=20)["notice"] == "SIGTERM"
    d = tmp_path / "stopped"
    _sup("start", "--dir", str(d), "--", "/bin/sh", "-c", SAVES_ON_NOTICE)
    _wait_running(d)
    assert _sup("stop", "--dir", str(d)).stdout.startswith("stopped")
    assert _state(d)["state"] == "stopped" and "saved-at-once" not in (d / "node.log").read_text().splitlines()


def test_stop_that_saves_first_lets_the_task_save_and_end_and_records_it_stopped(tmp_path):
    """`stop --save` (a chief after a Ctrl-C): the task gets the notice, saves, ends by itself (exit 5), and is
    recorded stopped, not preempted, never restarted; one that does not end in time is stopped all the same."""
    d = tmp_path / "saves"
    _sup("start", "--dir", str(d), "--max-restarts", "3", "--", "/bin/sh", "-c", SAVES_ON_NOTICE)
    _wait_running(d)
    assert _state(d)["saves_first"] is True
    out = _sup("stop", "--dir", str(d), "--save", "20").stdout
    assert out.startswith("stopped: the task ended by itself after the stop that saves first (exit 5, state "
                          "stopped)"), out
    st = _state(d)
    assert (st["state"], st["exit_code"], st["restarts"]) == ("stopped", 5, 0), st
    log = (d / "node.log").read_text()
    assert "saved-at-once" in log.splitlines() and "stop that saves first" in log and "stopped (exit 5)" in log, log
    # a task that ignores the notice: after --save's seconds, the usual stop (SIGINT) ends it
    late = tmp_path / "ignores"
    _sup("start", "--dir", str(late), "--", "/bin/sh", "-c", "trap '' USR1; echo running; while :; do sleep 0.1; done")
    _wait_running(late)
    started = time.monotonic()
    out = _sup("stop", "--dir", str(late), "--save", "1").stdout
    assert out.splitlines() == ["the task did not end within 1 s of the stop that saves first: stopping it",
                                "stopped (state stopped)"], out
    assert time.monotonic() - started >= 1 and _state(late)["state"] == "stopped"
    # a supervisor that has ended: nothing to save, said at once
    assert _sup("stop", "--dir", str(d), "--save", "20").stdout.startswith("not running (state stopped)")
    # one that does not record that it takes the save (an earlier tfcluster's, to which SIGUSR1 is the end):
    # the usual stop only
    old = tmp_path / "earlier"
    _sup("start", "--dir", str(old), "--", "/bin/sh", "-c", SAVES_ON_NOTICE)
    recorded = _wait_running(old)
    (old / "supervisor.json").write_text(json.dumps({k: v for k, v in recorded.items() if k != "saves_first"}))
    assert _sup("stop", "--dir", str(old), "--save", "20").stdout.splitlines() == ["stopped (state stopped)"]
    assert "saved-at-once" not in (old / "node.log").read_text().splitlines()


@pytest.mark.skipif(os.geteuid() != 0, reason="running a task as another user needs root")
def test_supervisor_runs_the_task_as_the_given_user_and_keeps_the_env_file_from_it():
    """The task runs unprivileged (uid of `nobody`, HOME its directory); the credentials it needs arrive in its
    environment, read by the root supervisor from a 0600 file the task could not open itself."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="tfct-sup-"))   # not under pytest's root-only directory
    try:
        top.chmod(0o755)
        env = top / "task.env"
        env.write_text("SECRET_FOR_TASK=s3cr3t\n")
        env.chmod(0o600)
        d = top / "task"
        d.mkdir()
        os.chown(d, pwd.getpwnam("nobody").pw_uid, -1)
        script = (f'id -un; echo "home=$HOME"; [ "$SECRET_FOR_TASK" = s3cr3t ] && echo has-env; '
                  f'cat {env} 2>/dev/null || echo cannot-read-env; touch "$HOME/mine"')
        _sup("start", "--dir", str(d), "--env-file", str(env), "--user", "nobody", "--", "/bin/sh", "-c", script)
        assert _wait_state(d, ("succeeded", "failed"))["state"] == "succeeded", (d / "node.log").read_text()
        log = (d / "node.log").read_text().splitlines()
        assert "nobody" in log and f"home={d}" in log and "has-env" in log and "cannot-read-env" in log, log
        assert (d / "mine").stat().st_uid == pwd.getpwnam("nobody").pw_uid
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_supervisor_refuses_an_unknown_user(tmp_path):
    d = tmp_path / "task"
    _sup("start", "--dir", str(d), "--user", "no-such-user-tfc", "--", "true")
    st = _wait_state(d, ("failed",))
    assert st["exit_code"] == 127 and "no user 'no-such-user-tfc'" in (d / "node.log").read_text()


def test_the_supervisor_never_writes_through_a_link_the_task_put_in_its_directory(tmp_path):
    """The task's directory is the task user's and the supervisor is root: a link in place of the log or of
    the state file's temporary file must not make it write into the file the link points at."""
    target = tmp_path / "precious"
    target.write_text("keep\n")
    d = tmp_path / "task"
    d.mkdir()
    (d / "supervisor.json.tmp").symlink_to(target)
    (d / "node.log").symlink_to(target)
    _sup("start", "--dir", str(d), "--", "/bin/echo", "hello")
    st = _wait_state(d, ("failed",))        # the task's output has nowhere safe to go: it is not started
    assert st["exit_code"] == 127 and target.read_text() == "keep\n"
    assert not (d / "supervisor.json").is_symlink() and (d / "node.log").is_symlink()


def _forge(d: Path, **pids) -> None:
    """Rewrite the state file as the task's user can (the directory is theirs)."""
    state = json.loads((d / "supervisor.json").read_text())
    (d / "supervisor.json").write_text(json.dumps(dict(state, **pids)))


def _gone(pid: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(") ", 1)[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_stop_signals_only_the_directory_s_supervisor_and_task_whatever_the_state_file_names(tmp_path):
    """The state file is the task user's to rewrite, and a process of theirs can carry any command line: `stop`
    (root) signals only the supervisor and task root's own record names, never the processes a forged file
    names, even one that looks like the directory's supervisor."""
    d, stubborn = tmp_path / "task", tmp_path / "stubborn"
    # session leaders (a killpg would reach them), one of them root's with the supervisor's command line
    victims = [subprocess.Popen(["sleep", "300"], start_new_session=True),
               subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "tfc-supervise", "start",
                                 "--dir", str(d)], start_new_session=True)]
    try:
        _sup("start", "--dir", str(d), "--", "sleep", "300")
        real = _wait_state(d, ("running",))
        _forge(d, pid=victims[1].pid, child_pid=victims[0].pid)
        assert _sup("start", "--dir", str(d), "--", "sleep", "300").stdout.startswith(
            f"already running (supervisor pid {real['pid']})")
        assert _state(d)["state"] == "running"          # the file names another pid; root's record tells
        assert _sup("stop", "--dir", str(d)).stdout.startswith("stopped")
        assert _gone(real["pid"]) and _gone(real["child_pid"])
        assert all(v.poll() is None for v in victims)

        # a task that outlives the grace: stop kills the supervisor and its task, not the forged ones
        _sup("start", "--dir", str(stubborn), "--", "/bin/sh", "-c", "trap '' INT; while :; do sleep 0.1; done")
        real = _wait_state(stubborn, ("running",))
        _forge(stubborn, pid=victims[1].pid, child_pid=victims[0].pid)
        assert _sup("stop", "--dir", str(stubborn), "--grace", "1").stdout.startswith("killed")
        assert _gone(real["pid"]) and _gone(real["child_pid"])
        assert all(v.poll() is None for v in victims)
    finally:
        for each in (d, stubborn):      # whatever a failed assertion left running (stop trusts root's record)
            _sup("stop", "--dir", str(each), "--grace", "1")
        for v in victims:
            v.kill()
            v.wait()


def _start_phases(d: Path, marker: Path) -> None:
    """A supervised task whose status.json says phase 'training' until ``marker`` exists, then 'publishing';
    returns once it says 'training' (stopped if it does not within 20 s)."""
    script = (f"import json, os, time\n"
              f"def say(phase):\n"
              f"    open('{d}/s.tmp', 'w').write(json.dumps({{'phase': phase}}))\n"
              f"    os.replace('{d}/s.tmp', '{d}/status.json')\n"         # as the harness writes it: whole
              f"say('training')\nwhile not os.path.exists('{marker}'): time.sleep(0.02)\n"
              f"say('publishing')\ntime.sleep(60)\n")
    _sup("start", "--dir", str(d), "--", sys.executable, "-c", script)
    try:
        _wait_state(d, ("running",))
        end = time.monotonic() + 20
        while json.loads(_sup("status", "--dir", str(d)).stdout)["task"].get("phase") != "training":
            assert time.monotonic() < end
            time.sleep(0.05)
    except BaseException:
        _sup("stop", "--dir", str(d), "--grace", "1")
        raise


def test_status_until_change_answers_as_the_task_s_phase_or_state_changes_else_after_its_time(tmp_path):
    """`status --until-change S` is the controller's look at the chief: it answers at once when the task's
    phase or the supervisor's state changes (the loop's end, the task's), else after S seconds, and at once
    for a supervisor that has ended or is gone."""
    d = tmp_path / "task"
    marker = tmp_path / "go"
    _start_phases(d, marker)
    try:
        t0 = time.monotonic()
        res = _sup("status", "--dir", str(d), "--until-change", "1.5")        # no change: its whole time
        assert json.loads(res.stdout)["task"]["phase"] == "training" and time.monotonic() - t0 >= 1.5
        threading.Timer(3.0, marker.touch).start()
        t0 = time.monotonic()
        res = _sup("status", "--dir", str(d), "--until-change", "9")          # the phase changes after ~3 s
        took = time.monotonic() - t0
        assert json.loads(res.stdout)["task"]["phase"] == "publishing" and 2.9 < took < 8, (took, res.stdout)
        os.kill(_state(d)["pid"], signal.SIGKILL)           # its state file still says running
        t0 = time.monotonic()
        res = _sup("status", "--dir", str(d), "--until-change", "9")          # lost: at once
        assert json.loads(res.stdout)["supervisor"]["state"] == "lost" and time.monotonic() - t0 < 5, res.stdout
        ended = tmp_path / "ended"
        _sup("start", "--dir", str(ended), "--", "/bin/echo", "hello")
        _wait_state(ended, ("succeeded",))
        t0 = time.monotonic()
        res = _sup("status", "--dir", str(ended), "--until-change", "9")      # ended: at once
        assert json.loads(res.stdout)["supervisor"]["state"] == "succeeded" and time.monotonic() - t0 < 5
        t0 = time.monotonic()           # nothing started there yet: no news, the whole time
        res = _sup("status", "--dir", str(tmp_path / "never"), "--until-change", "1.5")
        assert json.loads(res.stdout)["supervisor"] == {} and time.monotonic() - t0 >= 1.5, res.stdout
    finally:
        _sup("stop", "--dir", str(d), "--grace", "1")       # also the task of the killed supervisor


def test_status_follow_prints_each_change_and_at_least_every_interval_until_the_supervisor_ends(tmp_path):
    """`status --follow S` is the controller's watch of the chief over one SSH session: a line at once, one
    within S when nothing changes, one as soon as the task's phase changes, and a last one when the supervisor
    is gone, after which it ends by itself (exit 0); a reader that goes away ends it too, quietly."""
    d = tmp_path / "task"
    marker = tmp_path / "go"
    _start_phases(d, marker)
    follow = None
    try:
        follow = subprocess.Popen([str(SUPERVISE), "status", "--dir", str(d), "--follow", "2"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()      # read by a thread: a silent --follow fails the test, not hangs it
        threading.Thread(target=lambda: [*map(lines.put, follow.stdout), lines.put("")], daemon=True).start()
        seen = []

        def line():
            got = json.loads(lines.get(timeout=10))
            seen.append((time.monotonic(), got["supervisor"].get("state"), got["task"].get("phase")))
            return seen[-1]

        t0 = time.monotonic()
        assert line()[1:] == ("running", "training") and seen[-1][0] - t0 < 5
        assert line()[1:] == ("running", "training")                 # no change: after its interval
        assert 1.9 <= seen[1][0] - seen[0][0] < 4, seen
        touched = time.monotonic()
        marker.touch()                  # the phase changes at once: its line long before the next interval's
        assert line()[2] == "publishing" and seen[-1][0] - touched < 1.0, seen
        os.kill(_state(d)["pid"], signal.SIGKILL)                    # its state file still says running
        while line()[1] != "lost":
            assert len(seen) < 15, seen
        assert follow.wait(timeout=5) == 0 and lines.get(timeout=5) == ""     # the last line: it ended
        # a reader that goes away: the next line finds no pipe, and it ends without a traceback
        again = subprocess.Popen([str(SUPERVISE), "status", "--dir", str(d.parent / "never"), "--follow", "0.2"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert json.loads(again.stdout.readline())["supervisor"] == {}
        again.stdout.close()
        assert again.wait(timeout=5) == 0
        assert again.stderr.read() == b""
        again.stderr.close()
    finally:
        if follow is not None:
            follow.kill()
            follow.wait()
            follow.stderr.close()
        _sup("stop", "--dir", str(d), "--grace", "1")       # also the task of the killed supervisor


def test_status_reads_no_fifo_or_link_the_task_put_in_place_of_its_files(tmp_path):
    """`status` runs as root over the task user's files: a FIFO in place of one must not hang it, and a link
    must not make it print the file the link points at."""
    d = tmp_path / "task"
    _sup("start", "--dir", str(d), "--", "/bin/echo", "hello")
    _wait_state(d, ("succeeded",))
    secret = tmp_path / "root-only.json"
    secret.write_text('{"secret": "root-only"}')
    os.mkfifo(d / "status.json")
    (d / "unpublished.json").symlink_to(secret)
    res = _sup("status", "--dir", str(d), timeout=10)      # a FIFO opened for reading would block here
    doc = json.loads(res.stdout)
    assert doc["supervisor"]["state"] == "succeeded" and doc["task"] == {} and doc["unpublished"] is None
    assert "root-only" not in res.stdout
    # a socket, JSON nested past Python's recursion limit, valid JSON far larger than any state file
    (d / "unpublished.json").unlink()
    (d / "unpublished.json").write_text("[" * 100_000)
    (d / "supervisor.json").unlink()
    (d / "status.json").unlink()
    (d / "status.json").write_text(json.dumps({"step": 1, "pad": "x" * (2 << 20)}))   # valid, over 1 MiB
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(d / "supervisor.json"))
        res = _sup("status", "--dir", str(d), timeout=10)
        assert res.returncode == 0 and json.loads(res.stdout) == {"supervisor": {}, "task": {}, "unpublished": None}
        for args in (("stop",), ("start", "--fresh", "--", "/bin/echo", "again")):
            res = _sup(*args[:1], "--dir", str(d), *args[1:], timeout=10)
            assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        assert _wait_state(d, ("succeeded",))["state"] == "succeeded"


def test_start_clears_what_the_task_left_in_place_of_its_files(tmp_path):
    """What a task leaves in its directory stays there for the next run's start: a directory in place of a
    state file or of the previous log, a dangling link as the log, a FIFO as the log. The next start still
    starts (or, for the FIFO it cannot write to, fails the task at once, never hanging)."""
    d = tmp_path / "task"
    _sup("start", "--dir", str(d), "--", "/bin/echo", "first")
    _wait_state(d, ("succeeded",))
    for name in ("supervisor.json", "status.json", "node.log.1", "supervisor.json.tmp"):
        (d / name).unlink(missing_ok=True)
        (d / name).mkdir()
        (d / name / "inside").write_text("x")
    assert json.loads(_sup("status", "--dir", str(d)).stdout)["supervisor"] == {}
    res = _sup("start", "--fresh", "--dir", str(d), "--", "/bin/echo", "second")
    assert res.stdout.startswith("started"), res.stdout + res.stderr
    assert _wait_state(d, ("succeeded",))["state"] == "succeeded" and "second" in (d / "node.log").read_text()

    (d / "node.log").unlink()
    (d / "node.log").symlink_to(tmp_path / "nowhere")
    _sup("start", "--fresh", "--dir", str(d), "--", "/bin/echo", "third")
    assert _wait_state(d, ("succeeded",))["state"] == "succeeded" and "third" in (d / "node.log").read_text()

    (d / "node.log").unlink()
    os.mkfifo(d / "node.log")
    _sup("start", "--dir", str(d), "--", "/bin/echo", "fourth")
    assert _wait_state(d, ("failed",), timeout=10)["exit_code"] == 127


def test_stop_and_start_end_the_task_of_a_supervisor_that_was_killed(tmp_path):
    """A supervisor killed (the OOM killer, say) leaves its task running: `stop` ends it through root's record,
    and so does the next `start` before it starts another."""
    for how in ("stop", "start"):
        d = tmp_path / how
        _sup("start", "--dir", str(d), "--", "sleep", "300")
        st = _wait_state(d, ("running",))
        try:
            os.kill(st["pid"], signal.SIGKILL)
            assert _gone(st["pid"]) and not _gone(st["child_pid"], timeout=0.5)
            res = _sup(how, "--dir", str(d), *(["--", "/bin/echo", "next"] if how == "start" else []))
            assert f"the task (pid {st['child_pid']})" in res.stdout, res.stdout + res.stderr
            assert _gone(st["child_pid"])
            if how == "stop":   # nothing of it is left in root's record either
                assert all(json.loads(f.read_text()).get("dir") != str(d.resolve())
                           for f in Path("/run/tfc-supervise").glob("*.json"))
        finally:
            _sup("stop", "--dir", str(d), "--grace", "1")
            try:
                os.killpg(st["child_pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def _collected(copy: Path) -> dict[str, bytes]:
    """What `collect` put into its archive: {name: bytes}."""
    with tarfile.open(copy / "collected.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def test_tail_and_collect_read_only_regular_files_of_the_task_never_through_a_link(tmp_path):
    """`tail` (make logs) and `collect` (the archive the controller fetches) run as root over the task user's
    files: a link in place of one must not make them read the file it points at, a FIFO must not hang them,
    a state file over 1 MiB is left out, and a sparse log of any size is archived only as its tail."""
    d, copy = tmp_path / "task", tmp_path / "copy"
    assert _sup("tail", "--dir", str(d)).returncode == 3          # no log yet
    _sup("start", "--dir", str(d), "--", "/bin/sh", "-c", "for i in $(seq 100); do echo line $i; done")
    _wait_state(d, ("succeeded",))
    end = time.monotonic() + 10     # the supervisor's last line follows the state it records
    while "task succeeded" not in (d / "node.log").read_text() and time.monotonic() < end:
        time.sleep(0.05)
    res = _sup("tail", "--dir", str(d), "--lines", "3")
    last = (d / "node.log").read_text().splitlines(keepends=True)[-3:]    # the supervisor's lines and the task's
    assert res.returncode == 0 and res.stdout == "".join(last) and "line 100\n" in res.stdout, res.stdout + res.stderr
    assert _sup("collect", "--dir", str(d), "--to", str(copy)).stdout == ""
    got = _collected(copy)
    assert sorted(got) == ["node.log", "supervisor.json"] and got["node.log"] == (d / "node.log").read_bytes()
    assert [p.name for p in copy.iterdir()] == ["collected.tar.gz"]
    assert oct(copy.stat().st_mode & 0o777) == "0o700"
    assert oct((copy / "collected.tar.gz").stat().st_mode & 0o777) == "0o600"

    secret = tmp_path / "root-only"
    secret.write_text("root-only secret\n")
    (d / "node.log").unlink()
    (d / "node.log").symlink_to(secret)
    os.link(secret, d / "supervisor.json.hard")     # a hard link: protected_hardlinks may be off on a node
    (d / "supervisor.json").unlink()
    os.rename(d / "supervisor.json.hard", d / "supervisor.json")
    (d / "status.json").write_text(json.dumps({"pad": "x" * (2 << 20)}))
    res = _sup("tail", "--dir", str(d))
    assert res.returncode == 1 and "a symbolic link: not read" in res.stderr and "secret" not in res.stdout
    res = _sup("collect", "--dir", str(d), "--to", str(copy))
    assert res.stdout.splitlines() == ["node.log: a symbolic link: not taken", "status.json: over 1048576 bytes: "
                                       "not taken", "supervisor.json: a hard link: not taken"], res.stdout + res.stderr
    assert _collected(copy) == {}     # made afresh: the earlier archive went
    (d / "supervisor.json").unlink()

    (d / "node.log").unlink()
    os.mkfifo(d / "node.log")
    assert _sup("tail", "--dir", str(d), timeout=10).returncode == 1    # a FIFO opened for reading would block
    assert "node.log: not a regular file" in _sup("collect", "--dir", str(d), "--to", str(copy), timeout=10).stdout

    # what collect did not make is never emptied or written through: a link in place of its directory, a
    # directory of other files
    shutil.rmtree(copy)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "precious").write_text("keep\n")
    for there in (copy, elsewhere):
        if there == copy:
            copy.symlink_to(elsewhere)
        res = _sup("collect", "--dir", str(d), "--to", str(there))
        assert res.returncode == 2 and "not a directory of collect's" in res.stderr, res.stdout + res.stderr
        assert [p.name for p in elsewhere.iterdir()] == ["precious"]
    copy.unlink()
    (d / "node.log").unlink()
    with open(d / "node.log", "wb") as f:     # sparse, 10 MiB past what collect takes of a log
        f.truncate((64 << 20) + (10 << 20))
        f.seek(-len(b"\nthe end\n"), os.SEEK_END)
        f.write(b"\nthe end\n")
    res = _sup("collect", "--dir", str(d), "--to", str(copy), timeout=60)
    assert "node.log: its last 67108864 bytes taken, the first 10485760 left on the node" in res.stdout, res.stdout
    assert (copy / "collected.tar.gz").read_bytes()[:2] == b"\x1f\x8b"      # gzipped: the fetch holds it whole
    log = _collected(copy)["node.log"]
    assert log.startswith(b"[tfc-supervise collect: the first 10485760 bytes of this log are only on the node")
    assert log.endswith(b"\nthe end\n") and len(log) == (64 << 20) + log.index(b"\n") + 1
    res = _sup("tail", "--dir", str(d), "--lines", "1")
    assert res.returncode == 0 and res.stdout == "the end\n"


def test_finish_stops_the_task_removes_its_credentials_and_archives_its_log_in_one_command(tmp_path):
    """`finish` (a node's part of a run's end, tf_node tasks_from: finish): the stop, the env file's removal and
    the archive, each line of theirs after its part's name; without --stop a running task keeps running (a
    chief's, unless asked), without --to nothing is archived."""
    d, copy, env = tmp_path / "task", tmp_path / "copy", tmp_path / "task.env"
    env.write_text("AWS_SECRET_ACCESS_KEY=x\n")
    os.chmod(env, 0o600)
    _sup("start", "--dir", str(d), "--env-file", str(env), "--", "/bin/sh", "-c", "echo up; exec sleep 60")
    _wait_state(d, ("running",))
    res = _sup("finish", "--dir", str(d), "--env-file", str(env))
    assert res.returncode == 0 and res.stdout == f"credentials: removed {env}\n", res.stdout + res.stderr
    assert _state(d)["state"] == "running" and not copy.exists()
    res = _sup("finish", "--dir", str(d), "--stop", "--env-file", str(env), "--to", str(copy))
    assert res.returncode == 0 and res.stdout.splitlines() == ["stop: stopped (state stopped)"], res.stdout + res.stderr
    assert _state(d)["state"] == "stopped"
    assert b"up\n" in _collected(copy)["node.log"] and "supervisor.json" in _collected(copy)
    (d / "status.json").write_text(json.dumps({"pad": "x" * (2 << 20)}))
    res = _sup("finish", "--dir", str(d), "--stop", "--to", str(copy))
    assert res.stdout.splitlines() == ["stop: not running (state stopped)",
                                       "archive: status.json: over 1048576 bytes: not taken"], res.stdout


def test_finish_removes_the_credentials_even_when_the_stop_fails_and_then_archives_nothing(tmp_path, capsys):
    from tests.unit.supervise import supervise_module

    sup = supervise_module()
    env, copy = tmp_path / "task.env", tmp_path / "copy"
    env.write_text("AWS_SECRET_ACCESS_KEY=x\n")

    def no_pidfd(_args):
        raise OSError(38, "Function not implemented")

    sup.cmd_stop = no_pidfd
    args = sup.argparse.Namespace(dir=str(tmp_path / "task"), stop=True, grace=1.0, env_file=str(env), to=str(copy))
    with pytest.raises(OSError):      # main() says it in one line, exit status 1: the node drops out of the play
        sup.cmd_finish(args)
    assert not env.exists() and not copy.exists()
    assert capsys.readouterr().out == f"credentials: removed {env}\n"


def test_finish_removes_whatever_is_in_the_credentials_files_place_never_following_a_link(tmp_path):
    """A directory or a link where the env file goes is removed itself (as Ansible's `file: absent` did before
    `finish`); a link's target stays."""
    target = tmp_path / "elsewhere"
    target.write_text("not the node's\n")
    env = tmp_path / "task.env"
    for make in (lambda: (env.mkdir(), (env / "inside").write_text("x")), lambda: env.symlink_to(target)):
        make()
        res = _sup("finish", "--dir", str(tmp_path / "task"), "--env-file", str(env))
        assert res.returncode == 0 and res.stdout == f"credentials: removed {env}\n", res.stdout + res.stderr
        assert not os.path.lexists(env) and target.read_text() == "not the node's\n"
    res = _sup("finish", "--dir", str(tmp_path / "task"), "--env-file", str(env))
    assert res.returncode == 0 and res.stdout == "", res.stdout + res.stderr     # nothing there: nothing said


def test_tail_past_its_window_never_prints_a_cut_line(tmp_path):
    """`tail` reads the log's last 4 MiB: the first line there may be cut mid-character, and is never shown,
    even when the window holds fewer lines than asked for."""
    d = tmp_path / "task"
    d.mkdir()
    (d / "node.log").write_bytes("━".encode() * (2 << 20) + b"\nlast line\n")    # one 6 MiB line, then one
    res = subprocess.run([str(SUPERVISE), "tail", "--dir", str(d), "--lines", "5"], capture_output=True, timeout=30)
    assert res.returncode == 0 and res.stdout == b"last line\n", res.stdout[:100]


def test_collect_refuses_a_directory_others_may_write_to_and_says_so_in_one_line(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    res = _sup("collect", "--dir", str(tmp_path / "task"), "--to", str(shared / "copy"))
    assert res.returncode == 2 and "must be root's and writable by root only" in res.stderr, res.stderr
    assert not (shared / "copy").exists() and "Traceback" not in res.stderr
    res = _sup("collect", "--dir", str(tmp_path / "task"), "--to", str(tmp_path / "no" / "such" / "copy"))
    assert res.returncode == 1 and res.stderr.startswith("tfc-supervise collect:") and len(res.stderr.splitlines()) == 1
