"""The harness tests start a node's tasks as the node's supervisor does: each a fork of the warm interpreter
(tfc-warm), which imported TensorFlow once, with the packages the nodes lack unimportable."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from harness_support import WARM, WarmInterpreters, _remove_orphaned, node_env

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs tensorflow")

PROBE = """import os, sys
print("tensorflow loaded:", "tensorflow" in sys.modules, "sklearn loaded:", "sklearn" in sys.modules, flush=True)
print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("TFC_PROBE_VAR"), flush=True)
import sklearn
"""
SLEEPER = "import time\ntime.sleep(600)\n"


@pytest.mark.parametrize("warm, loaded", [(True, True), (False, False)])
def test_a_task_started_warm_finds_tensorflow_imported_and_sklearn_unimportable(processes, tmp_path, warm, loaded):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = node_env({"PYTHONPATH": str(WARM.blockers()), "TFC_PROBE_VAR": "seen"})
    proc = processes.start("probe", [sys.executable, str(script), "a", "b c"], env=env, cwd=str(tmp_path), warm=warm)
    assert (type(proc).__name__ == "WarmChild") is warm
    assert processes.wait("probe", 120) == 1, processes.log("probe")        # the sklearn import fails
    log = processes.log("probe")
    assert log.startswith(f"tensorflow loaded: {loaded} sklearn loaded: False\n"
                          f"argv ['a', 'b c'] cwd {tmp_path} var seen\n"), log
    assert "ImportError: sklearn is not on nodes" in log, log


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"    # ended, not yet reaped by its server
    except FileNotFoundError:
        return True


def test_a_warm_task_killed_right_after_its_start_is_gone(processes, tmp_path):
    """Killed before it has made itself a process group (its setsid comes after the fork), the task itself
    is signalled: none of them is left running."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    env = node_env({"PYTHONPATH": str(WARM.blockers())})
    pids = []
    for i in range(20):
        proc = processes.start(f"sleeper-{i}", [sys.executable, str(script)], env=env, cwd=str(tmp_path), warm=True)
        assert type(proc).__name__ == "WarmChild"
        pids.append(proc.pid)
        processes.kill(f"sleeper-{i}")      # waits for its end: 30 s at most, or it raises
        assert proc.returncode == -9
    assert [pid for pid in pids if not _gone(pid)] == []


def test_a_warm_interpreter_that_died_is_started_again(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    warm = WarmInterpreters()
    env = node_env()
    try:
        with open(tmp_path / "first.log", "wb") as out:
            first = warm.start([sys.executable, str(script)], env, str(tmp_path), out)
        assert first is not None and first.wait(timeout=60) == 0
        (server, _), = warm.servers.values()
        server.kill()
        server.wait(timeout=30)
        with open(tmp_path / "second.log", "wb") as out:
            second = warm.start([sys.executable, str(script)], env, str(tmp_path), out)
        assert type(second).__name__ == "WarmChild" and second.wait(timeout=60) == 0
        (restarted, _), = warm.servers.values()
        assert restarted.pid != server.pid and restarted.poll() is None
        assert (tmp_path / "second.log").read_text() == "ran\n"
    finally:
        warm.close()
    assert not any(p.poll() is None for p in (server, restarted))


def test_the_directories_of_pytest_processes_that_ended_are_removed(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    prefix = WarmInterpreters.PREFIX
    for pid in (ended.pid, os.getpid()):
        (tmp_path / f"{prefix}{pid}-x1" / "key").mkdir(parents=True)
    (tmp_path / f"{prefix}other").mkdir()     # not one of these: kept
    _remove_orphaned(tmp_path, prefix)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{prefix}{os.getpid()}-x1", f"{prefix}other"]


def test_a_warm_server_dies_with_the_process_that_started_it(tmp_path):
    """PR_SET_PDEATHSIG: a pytest process killed outright leaves no warm interpreter (nor its forks)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from harness_support import WARM, node_env\n"
            "with open(sys.argv[2], 'wb') as out:\n"
            "    child = WARM.start([sys.executable, sys.argv[3]], node_env(), sys.argv[4], out)\n"
            "print(WARM.servers and next(iter(WARM.servers.values()))[0].pid, child.pid, flush=True)\n"
            "import time; time.sleep(600)\n")
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    owner = subprocess.Popen([sys.executable, "-c", code, os.path.dirname(__file__), str(tmp_path / "out.log"),
                              str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        server_pid, child_pid = map(int, owner.stdout.readline().split())
    finally:
        owner.kill()
        owner.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (_gone(server_pid) and _gone(child_pid)):
        time.sleep(0.1)
    assert _gone(server_pid) and _gone(child_pid)
    _remove_orphaned(Path(tempfile.gettempdir()), WarmInterpreters.PREFIX)     # the killed process's directory
    assert not list(Path(tempfile.gettempdir()).glob(f"{WarmInterpreters.PREFIX}{owner.pid}-*"))
