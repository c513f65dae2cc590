"""The supervisor's warm start (tfc-supervise --warm, tfc-warm): a Python task forked by a warm interpreter
that stays up between runs, and what happens when it cannot be used or goes away.

The interpreter here is this test's own Python, preloading only ``json`` (TFC_WARM_PRELOAD): what is tested is
the fork and its bookkeeping; every cluster run of the e2e tests forks its tasks from the real one (TensorFlow
preloaded), and tests/e2e/test_train.py checks a later run's tasks came from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.supervise import SUPERVISE, supervise_module

#: a task that reports what it was given, then ends with the code in its first argument (or waits for SIGINT)
TASK = r"""
import json, os, sys, time
print("task", json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "secret": os.environ.get("SECRET_FOR_TASK"),
      "pid": os.getpid(), "ppid": os.getppid(), "session": os.getsid(0) == os.getpid(),
      "json_preloaded": "json" in sys.modules}), flush=True)
if sys.argv[1] == "wait":
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("task got SIGINT", flush=True)
        sys.exit(0)
if sys.argv[1] == "interrupt":
    raise KeyboardInterrupt
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def setup(tmp_path):
    script = tmp_path / "task.py"
    script.write_text(TASK)
    secrets = tmp_path / "task.env"
    secrets.write_text("SECRET_FOR_TASK=s3cr3t\n")
    warm = tmp_path / "warm"
    env = dict(os.environ, TFC_WARM_PRELOAD="json")
    yield tmp_path, script, secrets, warm, env
    record = warm / "warm.json"
    if record.exists():    # the warm interpreter stays up between runs: this test's must not outlive it
        try:
            os.kill(json.loads(record.read_text())["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def sup(env, *args, timeout=30):
    return subprocess.run([str(SUPERVISE), *args], capture_output=True, text=True, timeout=timeout, env=env)


def wait_state(env, d: Path, states, timeout=60.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = json.loads(sup(env, "status", "--dir", str(d)).stdout)["supervisor"]
        if st.get("state") in states:
            return st
        time.sleep(0.05)
    raise AssertionError(f"never {states}: {st}\n{(d / 'node.log').read_text()}")


def start(env, d: Path, warm: Path, *command, secrets: Path | None = None, restarts: int = 0):
    res = sup(env, "start", "--fresh", "--dir", str(d), "--warm", str(warm), "--max-restarts", str(restarts),
              *(["--env-file", str(secrets)] if secrets else []), "--", *command)
    assert res.stdout.startswith("started"), res.stdout + res.stderr


def log_with(d: Path, text: str, timeout: float = 15.0) -> str:
    """The task directory's node.log once it holds ``text`` (the supervisor writes its line about a start after
    it recorded the task's pid, and the task may print first), or as it is after ``timeout``."""
    end = time.monotonic() + timeout
    while text not in (log := (d / "node.log").read_text()) and time.monotonic() < end:
        time.sleep(0.05)
    return log


def reports(d: Path) -> list[dict]:
    return [json.loads(line[5:]) for line in (d / "node.log").read_text().splitlines() if line.startswith("task {")]


def gone(pid: int, timeout: float = 10.0) -> bool:
    """The process ended (a zombie that its parent has not reaped yet counts as ended)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def warm_pid(warm: Path) -> int:
    return json.loads((warm / "warm.json").read_text())["pid"]


def test_a_task_is_forked_by_the_warm_interpreter_which_serves_restarts_and_the_next_run(setup):
    tmp_path, script, secrets, warm, env = setup
    d = tmp_path / "task"
    start(env, d, warm, sys.executable, str(script), "3", secrets=secrets, restarts=1)
    st = wait_state(env, d, ("failed",))
    assert (st["exit_code"], st["restarts"]) == (3, 1)          # the task's exit code, through the interpreter
    server = warm_pid(warm)
    log = (d / "node.log").read_text()
    assert log.count("warm interpreter: starting") == 1 and "warm interpreter: ready in" in log, log
    assert log.count(f"forked from the warm interpreter, pid {server}") == 2, log   # the restart too
    first, again = reports(d)
    for seen in (first, again):
        assert seen["argv"] == [str(script), "3"] and seen["cwd"] == str(d) and seen["secret"] == "s3cr3t"
        assert seen["ppid"] == server and seen["session"] and seen["json_preloaded"], seen
    assert first["pid"] != again["pid"]
    # the credentials reach each task, never the interpreter that stays up between runs
    assert b"s3cr3t" not in Path(f"/proc/{server}/environ").read_bytes() + (warm / "warm.log").read_bytes()
    assert oct(warm.stat().st_mode & 0o777) == "0o700"

    start(env, d, warm, sys.executable, str(script), "0")       # the next run: the same interpreter, no wait
    assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
    log = (d / "node.log").read_text()
    assert "warm interpreter: starting" not in log and f"forked from the warm interpreter, pid {server}" in log, log


def said_pid(stdout: str) -> int:
    """The pid in `warm`'s "warm interpreter starting (pid N): ..." line."""
    return int(stdout.split("(pid ")[1].split(")")[0])


def slow_preload(tmp_path: Path, env: dict, seconds: float) -> dict:
    """``env`` with a preload that takes ``seconds`` (a module that sleeps as it is imported)."""
    (tmp_path / "slowload.py").write_text(f"import time\ntime.sleep({seconds})\n")
    return dict(env, TFC_WARM_PRELOAD="json,slowload", PYTHONPATH=str(tmp_path))


def test_warm_starts_the_interpreter_ahead_and_the_task_s_start_waits_for_its_imports(setup):
    tmp_path, script, secrets, warm, env = setup
    env = slow_preload(tmp_path, env, 6.0)
    d = tmp_path / "task"
    args = ["--dir", str(d), "--warm", str(warm), "--env-file", str(tmp_path / "not-written-yet.env"), "--",
            sys.executable, str(script), "0"]
    t0 = time.monotonic()
    res = sup(env, "warm", *args)
    took = time.monotonic() - t0
    assert res.returncode == 0 and res.stdout.startswith("warm interpreter starting (pid "), res.stdout + res.stderr
    ahead = said_pid(res.stdout)
    record = json.loads((warm / "warm.json").read_text())
    assert record["pid"] == ahead and record["ready"] is False, record     # returned while it loads
    assert took < 6.0, took
    again = sup(env, "warm", *args)                  # a second `warm` finds it: no other interpreter
    assert again.stdout.strip() in (f"warm interpreter loading (pid {ahead})",
                                    f"warm interpreter ready (pid {ahead})"), again.stdout
    start(env, d, warm, sys.executable, str(script), "0", secrets=secrets)
    assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
    log = (d / "node.log").read_text()
    assert f"waiting for the one started ahead (pid {ahead})" in log, log
    assert "warm interpreter: starting" not in log and f"forked from the warm interpreter, pid {ahead}" in log, log
    assert reports(d)[0]["ppid"] == ahead and reports(d)[0]["secret"] == "s3cr3t"
    assert sup(env, "warm", *args).stdout.strip() == f"warm interpreter ready (pid {ahead})"


def test_a_task_whose_interpreter_started_ahead_died_loading_starts_the_plain_way(setup):
    tmp_path, script, _, warm, env = setup
    env = slow_preload(tmp_path, env, 30.0)
    d = tmp_path / "task"
    res = sup(env, "warm", "--dir", str(d), "--warm", str(warm), "--", sys.executable, str(script), "0")
    ahead = said_pid(res.stdout)
    start(env, d, warm, sys.executable, str(script), "0")
    end = time.monotonic() + 20
    while "waiting for the one started ahead" not in (d / "node.log").read_text() and time.monotonic() < end:
        time.sleep(0.05)
    os.kill(ahead, signal.SIGKILL)
    assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
    log = (d / "node.log").read_text()
    assert f"the one started ahead (pid {ahead}) ended while loading" in log, log
    assert "starting the task the plain way" in log and "forked" not in log, log


def test_warm_clears_whatever_the_task_user_put_in_place_of_the_record(setup):
    tmp_path, script, _, warm, env = setup
    d = tmp_path / "task"
    (warm / "warm.json").mkdir(parents=True)
    (warm / "warm.json" / "inside").write_text("x")
    res = sup(env, "warm", "--dir", str(d), "--warm", str(warm), "--", sys.executable, str(script), "0")
    assert res.returncode == 0 and res.stdout.startswith("warm interpreter starting (pid "), res.stdout + res.stderr
    ahead = said_pid(res.stdout)
    start(env, d, warm, sys.executable, str(script), "0")
    assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
    assert f"forked from the warm interpreter, pid {ahead}" in (d / "node.log").read_text()


def test_warm_leaves_a_node_whose_supervisor_runs_alone(setup):
    tmp_path, script, _, warm, env = setup
    d = tmp_path / "task"
    start(env, d, warm, sys.executable, str(script), "wait")
    wait_state(env, d, ("running",))
    server = warm_pid(warm)
    changed = dict(env, TF_ENABLE_ONEDNN_OPTS="0")     # another key: a new interpreter would stop this one
    res = sup(changed, "warm", "--dir", str(d), "--warm", str(warm), "--", sys.executable, str(script), "0")
    assert res.returncode == 0 and "nothing started ahead" in res.stdout, res.stdout + res.stderr
    assert warm_pid(warm) == server and not gone(server, timeout=0.5)
    sup(env, "stop", "--dir", str(d))


def test_warm_starts_nothing_without_a_warm_directory_or_for_a_command_it_cannot_fork(setup):
    tmp_path, script, secrets, warm, env = setup
    d = tmp_path / "task"
    res = sup(env, "warm", "--dir", str(d), "--", sys.executable, str(script), "0")
    assert res.returncode == 0 and res.stdout.startswith("no --warm directory"), res.stdout
    res = sup(env, "warm", "--dir", str(d), "--warm", str(warm), "--", "/bin/sh", "-c", "true")
    assert res.stdout.strip() == "warm interpreter not started: /bin/sh is not a Python interpreter", res.stdout
    secrets.write_text("TF_CPP_MIN_LOG_LEVEL=0\n")
    res = sup(env, "warm", "--dir", str(d), "--warm", str(warm), "--env-file", str(secrets), "--",
              sys.executable, str(script), "0")
    assert res.stdout.strip() == f"warm interpreter not started: {secrets} sets TF_CPP_MIN_LOG_LEVEL, read at " \
        "import", res.stdout
    assert not warm.exists()


def test_a_forked_task_s_exit_6_reaches_the_supervisor_which_does_not_restart_it(setup):
    tmp_path, script, secrets, warm, env = setup
    d = tmp_path / "final"
    start(env, d, warm, sys.executable, str(script), "6", secrets=secrets, restarts=2)
    st = wait_state(env, d, ("failed",))
    assert (st["exit_code"], st["restarts"], st["why"]) == (6, 0, "a restart would fail the same way"), st
    assert len(reports(d)) == 1 and "forked from the warm interpreter" in (d / "node.log").read_text()


def test_stop_reaches_a_forked_task(setup):
    tmp_path, script, _, warm, env = setup
    d = tmp_path / "task"
    start(env, d, warm, sys.executable, str(script), "wait")
    wait_state(env, d, ("running",))
    end = time.monotonic() + 30
    while not reports(d) and time.monotonic() < end:
        time.sleep(0.05)
    assert sup(env, "stop", "--dir", str(d)).stdout.startswith("stopped")
    assert wait_state(env, d, ("stopped",))["exit_code"] == 0
    assert "task got SIGINT" in (d / "node.log").read_text()


def test_a_lost_warm_interpreter_ends_its_task_which_restarts_from_a_new_one(setup):
    tmp_path, script, _, warm, env = setup
    d = tmp_path / "task"
    start(env, d, warm, sys.executable, str(script), "wait", restarts=1)
    first = wait_state(env, d, ("running",))
    old = warm_pid(warm)
    os.kill(old, signal.SIGKILL)
    st = wait_state(env, d, ("running",), timeout=60)
    end = time.monotonic() + 30
    while st.get("child_pid") in (None, first["child_pid"]) and time.monotonic() < end:
        st = wait_state(env, d, ("running",))
        time.sleep(0.05)
    assert gone(first["child_pid"])                              # it died with its interpreter
    log = log_with(d, f"forked from the warm interpreter, pid {warm_pid(warm)}")
    assert "task exited -9; restarting" in log and warm_pid(warm) != old, log
    assert f"forked from the warm interpreter, pid {warm_pid(warm)}" in log, log
    sup(env, "stop", "--dir", str(d))


def test_a_changed_import_environment_gets_a_new_warm_interpreter(setup):
    tmp_path, script, _, warm, env = setup
    d = tmp_path / "task"
    start(env, d, warm, sys.executable, str(script), "0")
    wait_state(env, d, ("succeeded",))
    old = warm_pid(warm)
    env = dict(env, TF_ENABLE_ONEDNN_OPTS="0")      # read when TensorFlow loads: the old imports do not fit
    start(env, d, warm, sys.executable, str(script), "0")
    wait_state(env, d, ("succeeded",))
    assert warm_pid(warm) != old and "warm interpreter: starting" in (d / "node.log").read_text()
    assert gone(old)                                             # the stale one is stopped


def test_a_command_that_is_not_python_or_an_env_file_read_at_import_starts_the_plain_way(setup):
    tmp_path, script, secrets, warm, env = setup
    d = tmp_path / "shell"
    start(env, d, warm, "/bin/sh", "-c", "echo plain; exit 0")
    assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
    log = (d / "node.log").read_text()
    assert "warm interpreter not used: /bin/sh is not a Python interpreter" in log and "plain" in log, log
    secrets.write_text("SECRET_FOR_TASK=s3cr3t\nTF_CPP_MIN_LOG_LEVEL=0\n")
    d = tmp_path / "import-env"
    start(env, d, warm, sys.executable, str(script), "0", secrets=secrets)
    assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
    log = (d / "node.log").read_text()
    assert f"{secrets} sets TF_CPP_MIN_LOG_LEVEL, read at import" in log and "forked" not in log, log
    assert reports(d)[0]["secret"] == "s3cr3t" and not warm.exists()


def test_an_interpreter_that_cannot_load_leaves_the_task_to_start_the_plain_way(setup):
    tmp_path, script, _, warm, env = setup
    d = tmp_path / "task"
    bad = tmp_path / "python-broken"        # named like an interpreter, exits at once
    bad.write_text(f"#!/bin/sh\ncase \"$1\" in */tfc-warm) exit 7;; esac\nexec {sys.executable} \"$@\"\n")
    bad.chmod(0o755)
    start(env, d, warm, str(bad), str(script), "0")
    assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
    log = (d / "node.log").read_text()
    assert "warm interpreter not used: it exited 7 while loading" in log and reports(d), log


@pytest.mark.skipif(os.geteuid() != 0, reason="running the warm interpreter as another user needs root")
def test_a_record_naming_another_users_process_does_not_make_root_kill_it():
    """warm.json is the task user's to write: a stale record naming a process that is not that user's warm
    interpreter (here a root process whose command line looks like one) is not killed; a new interpreter,
    the task user's, starts instead."""
    import pwd
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="tfct-warm-"))   # not under pytest's root-only directory
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "tfc-warm", "serve"])
    try:
        top.chmod(0o755)
        script = top / "task.py"
        script.write_text(TASK)
        d, warm = top / "task", top / "warm"
        d.mkdir()
        warm.mkdir()
        nobody = pwd.getpwnam("nobody").pw_uid
        os.chown(d, nobody, -1)
        (warm / "warm.json").write_text(json.dumps({"pid": decoy.pid, "key": "stale", "ready": True}))
        env = dict(os.environ, TFC_WARM_PRELOAD="json")
        res = sup(env, "start", "--dir", str(d), "--warm", str(warm), "--user", "nobody", "--max-restarts", "0",
                  "--", sys.executable, str(script), "0")
        assert res.stdout.startswith("started"), res.stdout + res.stderr
        assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
        assert decoy.poll() is None, "root's process was killed on the record's word"
        server = warm_pid(warm)
        assert server != decoy.pid and Path(f"/proc/{server}").stat().st_uid == nobody
        os.kill(server, signal.SIGKILL)
    finally:
        decoy.kill()
        decoy.wait()
        shutil.rmtree(top, ignore_errors=True)


def test_a_record_naming_a_pid_out_of_range_starts_a_new_interpreter(setup):
    """warm.json is the task user's: a pid no process can have (it made os.pidfd_open overflow) is a stale
    record like any other."""
    tmp_path, script, _, warm, env = setup
    warm.mkdir(mode=0o700)
    (warm / "warm.json").write_text(json.dumps({"pid": 2 ** 70, "key": "stale", "ready": True}))
    d = tmp_path / "task"
    start(env, d, warm, sys.executable, str(script), "0")
    assert wait_state(env, d, ("succeeded",))["exit_code"] == 0
    assert "forked from the warm interpreter" in (d / "node.log").read_text()


def test_sigterm_to_the_warm_interpreter_leaves_its_task_running(setup):
    """A VM shutting down sends SIGTERM to every process: the warm interpreter stays, so its tasks (which die
    with it) get to save their step on their own SIGTERM."""
    tmp_path, script, _, warm, env = setup
    d = tmp_path / "task"
    start(env, d, warm, sys.executable, str(script), "wait")
    st = wait_state(env, d, ("running",))
    os.kill(warm_pid(warm), signal.SIGTERM)
    time.sleep(1)
    assert not gone(warm_pid(warm), timeout=0) and not gone(st["child_pid"], timeout=0)
    assert sup(env, "stop", "--dir", str(d)).stdout.startswith("stopped")
    assert wait_state(env, d, ("stopped",))["exit_code"] == 0


def _answered(module, tmp_path, reply: bytes, as_user: dict, held: list | None = None):
    """The WarmChild a task's start makes when the warm interpreter's socket answers ``reply``; the
    connection is closed after it, or added to ``held`` (an interpreter that stays up)."""
    import socket
    import threading

    warm = tmp_path / "warm"
    warm.mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(warm / "warm.sock"))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        _, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        for fd in fds:
            os.close(fd)
        conn.sendall(reply)
        if held is None:
            conn.close()
        else:
            held.append(conn)

    server = threading.Thread(target=answer)
    server.start()
    interpreter = module.WarmInterpreter(str(warm), sys.executable, {}, as_user, lambda msg: None)
    with open(tmp_path / "out.log", "ab") as out:
        child = interpreter.start([sys.executable, "task.py"], {}, str(tmp_path), out)
    server.join(10)
    listener.close()
    return child


def test_a_warm_answer_that_is_not_a_process_id_fails_the_start_in_one_line(tmp_path):
    """An answer naming a pid out of Linux's range (or not a number) is refused as an OSError, which the
    supervisor logs before it starts the task the plain way, never a crash of root's supervisor."""
    module = supervise_module()
    for i, pid in enumerate(("2147483648", "-1", '"12"', "true")):
        with pytest.raises(OSError, match="not a process id"):
            _answered(module, tmp_path / str(i), f'{{"pid": {pid}}}\n'.encode(), {})


def test_a_malformed_warm_answer_never_crashes_root_s_supervisor(tmp_path):
    """The interpreter is the task user's: a first answer nested past Python's limit or endless fails the start
    (an OSError, logged before the plain start); a malformed later line ends the task it named, through its
    pidfd, as killed."""
    module = supervise_module()
    for i, reply in enumerate((b"[" * 200_000 + b"\n", b"x" * (200 << 10))):
        with pytest.raises(OSError, match="warm interpreter"):
            _answered(module, tmp_path / f"first{i}", reply, {})
    held = []
    for i, later in enumerate((b'{"exit": null}\n', b'{"exit": true}\n', b"[" * 200_000 + b"\n", b"y" * (200 << 10))):
        task = subprocess.Popen(["sleep", "120"], start_new_session=True)
        try:
            child = _answered(module, tmp_path / f"later{i}", f'{{"pid": {task.pid}}}\n'.encode() + later, {}, held)
            end = time.monotonic() + 10
            while child.poll() is None and time.monotonic() < end:
                time.sleep(0.05)
            assert child.returncode == -signal.SIGKILL and task.wait(timeout=10) == -signal.SIGKILL, later[:20]
        finally:
            task.kill()
            task.wait()
    for conn in held:
        conn.close()


def test_a_signal_to_a_forked_task_reaches_its_process_group(tmp_path):
    """A task that leads its group (the warm interpreter's fork calls setsid) is signalled with its group: a
    process it started gets the signal too."""
    module = supervise_module()
    supervisor = module.Supervisor.__new__(module.Supervisor)
    task = subprocess.Popen(["sh", "-c", "sleep 120 & wait"], start_new_session=True)
    held = []
    try:
        end = time.monotonic() + 10
        members = []
        while len(members) < 2 and time.monotonic() < end:
            members = subprocess.run(["pgrep", "-g", str(task.pid)], capture_output=True, text=True).stdout.split()
            time.sleep(0.05)
        assert len(members) == 2, members
        sleeper = int(next(m for m in members if int(m) != task.pid))
        supervisor.child = _answered(module, tmp_path, f'{{"pid": {task.pid}}}\n'.encode(), {}, held)
        supervisor._kill_child(signal.SIGTERM)
        assert task.wait(timeout=10) == -signal.SIGTERM and gone(sleeper)
    finally:
        os.killpg(task.pid, signal.SIGKILL) if task.poll() is None else None
        task.wait()
        for conn in held:
            conn.close()


def test_an_end_that_comes_in_the_same_read_as_the_pid_is_taken(tmp_path):
    """A task that ends at once: its pid and its end can reach the supervisor in one read."""
    child = _answered(supervise_module(), tmp_path, b'{"pid": 4242}\n{"exit": 3}\n', {})
    assert (child.pid, child.poll(), child.wait(timeout=1)) == (4242, 3, 3)


def test_a_warm_answer_naming_another_users_process_never_makes_root_signal_it(tmp_path):
    """The warm interpreter is the task user's: its answer may name any pid. The supervisor signals the task
    only through a pidfd it opened while that pid was a process of the task's user: a process of another user
    is neither signalled nor recorded; the task's user's own is, until it ends."""
    module = supervise_module()
    supervisor = module.Supervisor.__new__(module.Supervisor)    # only its child's signalling is used here
    decoy = subprocess.Popen(["sleep", "120"], start_new_session=True)     # this test's user's, a session leader
    held = []
    try:
        other = {"user": 65534, "group": 65534} if os.getuid() != 65534 else {"user": 0, "group": 0}
        supervisor.child = _answered(module, tmp_path / "a", f'{{"pid": {decoy.pid}}}\n'.encode(), other, held)
        assert supervisor.child.fd is None and module.Supervisor._identity_of(supervisor.child) is None
        supervisor._kill_child(signal.SIGKILL)
        assert decoy.poll() is None, "a process of another user was signalled on the warm interpreter's word"

        supervisor.child = _answered(module, tmp_path / "b", f'{{"pid": {decoy.pid}}}\n'.encode(), {}, held)
        assert supervisor.child.fd is not None
        assert module.Supervisor._identity_of(supervisor.child)["pid"] == decoy.pid
        supervisor._kill_child(signal.SIGTERM)
        assert decoy.wait(timeout=10) == -signal.SIGTERM
        # ended (and reaped, so its pid is free for another process): it is not recorded
        assert module.Supervisor._identity_of(supervisor.child) is None
    finally:
        decoy.kill()
        decoy.wait()
        for conn in held:
            conn.close()


def test_an_uncaught_keyboard_interrupt_or_a_negative_exit_ends_a_forked_task_as_it_ends_a_plain_one(setup):
    """An interpreter killed by an uncaught KeyboardInterrupt exits by SIGINT (-2), and sys.exit(-1) is 255:
    a forked task's too."""
    tmp_path, script, _, warm, env = setup
    codes = {}
    for arg in ("interrupt", "-1"):
        for how in ("plain", "warm"):
            d = tmp_path / f"task-{how}-{arg}"
            res = sup(env, "start", "--dir", str(d), *(["--warm", str(warm)] if how == "warm" else []),
                      "--max-restarts", "0", "--", sys.executable, str(script), arg)
            assert res.stdout.startswith("started"), res.stdout + res.stderr
            codes[how, arg] = wait_state(env, d, ("failed",))["exit_code"]
            assert ("forked from the warm interpreter" in (d / "node.log").read_text()) == (how == "warm")
        assert "KeyboardInterrupt" in (tmp_path / "task-warm-interrupt" / "node.log").read_text()
    assert codes == {("plain", "interrupt"): -signal.SIGINT, ("warm", "interrupt"): -signal.SIGINT,
                     ("plain", "-1"): 255, ("warm", "-1"): 255}


def test_the_role_starts_the_warm_interpreter_ahead_with_the_start_s_own_arguments_first_thing():
    """tf_node's start tasks run `warm` before the bundle's copy (the imports overlap the tasks after it), with
    the arguments of the task's `start` (the same environment: the same interpreter's key)."""
    import yaml

    from tests.conftest import REPO
    from tests.unit import role_vars as role_vars_of

    tasks = yaml.safe_load((REPO / "roles/tf_node/tasks/start.yml").read_text())
    names = [t["name"] for t in tasks]
    warm_at = names.index("Start the node's warm interpreter ahead of its task")
    assert warm_at < names.index("The harness bundle with the user's model (copied once per content id)")
    assert warm_at < min(i for i, n in enumerate(names) if n.startswith(("Start the task", "Start the chief's task")))
    assert tasks[warm_at]["ansible.builtin.command"]["argv"] == "{{ _tf_node_supervise_warm }}"

    role_vars = role_vars_of.load("vars")
    values = {"tf_node_supervisor": "/usr/local/bin/tfc-supervise", "tf_node_state_dir": "/s", "tf_node_env_file": "/e",
              "_tf_node_has_keys": True, "tf_node_task_user": "u", "tf_node_max_restarts": 3, "tf_node_deadline": 9,
              "tf_node_preemption_notice": "", "tf_node_metadata_url": "", "tf_node_warm_dir": "/w",
              "tf_node_warm_start": True, "tf_node_python": "/py", "tf_node_run_dir": "/r"}
    task = [role_vars_of.render(a, values) for a in role_vars["_tf_node_supervise_task"]]
    values["_tf_node_supervise_task"] = task

    def argv(name):
        return role_vars_of.evaluate(role_vars[name], values)

    assert argv("_tf_node_supervise_start") == ["/usr/local/bin/tfc-supervise", "start", "--fresh", *task]
    assert argv("_tf_node_supervise_warm") == ["/usr/local/bin/tfc-supervise", "warm", *task]
    assert task[task.index("--warm") + 1] == "/w" and task[-3:] == ["--", "/py", "/r/entry.py"]
