"""A run's usual end over the cluster's SSH masters (tfcluster.training._finish_over_ssh): the same supervisor
command as roles/tf_node/tasks/finish.yml, the archive read back, and the playbook wherever that fails."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import tarfile

from tests.unit import role_vars as role_vars_of
from tfcluster import ansible_run, remote, training
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node, write_nodes


def _role_finish_argv(role: str) -> list[str]:
    """``_tf_node_supervise_finish`` of roles/tf_node/vars/main.yml, rendered with the role's defaults for a
    run's usual end (the chief not asked to stop) whose logs the controller fetches."""
    role_vars = role_vars_of.load("vars")
    values = dict(role_vars_of.load("defaults"), tf_role=role, tf_node_stop_chief=False, tf_node_logs_dest="/logs")
    values["_tf_node_finish_stops"] = role_vars_of.evaluate(role_vars["_tf_node_finish_stops"], values)
    return role_vars_of.evaluate(role_vars["_tf_node_supervise_finish"], values)


def test_the_finish_over_ssh_runs_the_roles_own_command_with_its_defaults():
    defaults = role_vars_of.load("defaults")
    assert (remote.TASK_DIR, remote.SUPERVISE, remote.ENV_FILE, remote.COLLECT_DIR) == (
        defaults["tf_node_state_dir"], defaults["tf_node_supervisor"], defaults["tf_node_env_file"],
        defaults["tf_node_collect_dir"])
    for role, stop in (("worker", True), ("ps", True), ("chief", False)):
        assert shlex.split(remote.finish_command(stop)) == _role_finish_argv(role), role


def test_after_a_ctrl_c_only_the_chiefs_finish_saves_first_for_the_time_playbooks_finish_passes():
    """playbooks/finish.yml's chief play sets tf_node_stop_saves from tfcluster_stop_saves (a string once
    templated): the chief's finish gets ``--stop --save 60``; a worker's, or a stop without it, no ``--save``."""
    import yaml

    from tests.conftest import REPO

    plays = yaml.safe_load((REPO / "playbooks" / "finish.yml").read_text())
    chief_play = next(p for p in plays if "Stop the chief first" in p.get("name", ""))
    passed = chief_play["tasks"][0]["vars"]["tf_node_stop_saves"]
    role_vars = role_vars_of.load("vars")

    def argv(role: str, stop_chief: bool, extra: dict) -> list[str]:
        values = dict(role_vars_of.load("defaults"), tf_role=role, tf_node_stop_chief=stop_chief,
                      tf_node_logs_dest="/logs")
        values["tf_node_stop_saves"] = role_vars_of.render(passed, extra) if stop_chief else values[
            "tf_node_stop_saves"]
        values["_tf_node_finish_stops"] = role_vars_of.evaluate(role_vars["_tf_node_finish_stops"], values)
        return role_vars_of.evaluate(role_vars["_tf_node_supervise_finish"], values)

    saves = {"tfcluster_stop_saves": training.SAVE_BEFORE_STOP_S}
    chief = argv("chief", True, saves)
    assert chief[chief.index("--stop"):chief.index("--stop") + 3] == ["--stop", "--save", "60"], chief
    assert "--save" not in argv("chief", True, {"tfcluster_stop_saves": 0})
    assert "--save" not in argv("chief", True, {})          # a finish after a failure: no extra var
    assert "--save" not in argv("worker", False, saves)


def _archive(text: str) -> bytes:
    """A node's archive as the supervisor makes it: a gzipped tar holding node.log."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("node.log")
        info.size = len(text.encode())
        tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


ARCHIVE = _archive("x")


def _cluster(tmp_path, monkeypatch) -> tuple[ClusterState, list[Node]]:
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    state = ClusterState("c")
    state.dir.mkdir(parents=True)
    nodes = [Node(f"c-{role}-0", role, 0, f"10.9.9.{i}", f"10.9.9.{i}", "debian", 22, 0)
             for i, role in enumerate(("ps", "worker", "chief"), start=2)]
    write_nodes(state.nodes, nodes)
    return state, nodes


def test_a_usual_end_stops_all_but_the_chief_and_fetches_each_archive_without_the_playbook(tmp_path, monkeypatch):
    state, nodes = _cluster(tmp_path, monkeypatch)
    ran = []
    said = "credentials: removed /etc/x\n"
    monkeypatch.setattr(remote, "run", lambda _s, node, command, timeout=30, root=True, own_session=False: ran.append(
        (node.name, command, own_session)) or subprocess.CompletedProcess(command, 0, said, ""))
    monkeypatch.setattr(remote, "read_archive", lambda _s, node, own_session=False: ran.append(
        (node.name, "read", own_session)) or _archive(node.name))
    monkeypatch.setattr(training.collected, "unpack", lambda dest: [])
    monkeypatch.setattr(ansible_run, "playbook", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("playbook")))

    # beside the verification (console=False): each ssh in a session of its own, out of a Ctrl-C's reach
    assert training.stop_serving_and_fetch_logs(state, "r1", 3, console=False) is True
    assert sorted(ran) == sorted([*((n.name, remote.finish_command(stop=n.role != "chief"), True) for n in nodes),
                                  *((n.name, "read", True) for n in nodes)])
    for n in nodes:
        assert (state.logs / "r1" / n.name / "collected.tar.gz").read_bytes() == _archive(n.name)
    log = (state.logs / "train.log").read_text()
    assert all(f"finish over ssh: {n.name}: ok\n    credentials: removed /etc/x\n" in log for n in nodes), log


def test_the_playbook_finishes_the_nodes_where_the_end_over_ssh_failed_and_every_node_after_a_ctrl_c(
        tmp_path, monkeypatch):
    state, nodes = _cluster(tmp_path, monkeypatch)
    monkeypatch.setattr(training.collected, "unpack", lambda dest: [])
    plays = []
    monkeypatch.setattr(ansible_run, "playbook", lambda _s, name, extra, **kw: plays.append((name, kw)) or {})

    def finish_fails_on(role, answer, archive=ARCHIVE):
        plays.clear()
        monkeypatch.setattr(remote, "run", lambda _s, node, command, *a, **kw: answer if node.role == role else
                            subprocess.CompletedProcess(command, 0, "", ""))
        monkeypatch.setattr(remote, "read_archive", lambda *a, **kw: archive)
        assert training.stop_serving_and_fetch_logs(state, "r1", 3) is True      # the playbook did it
        assert [name for name, _ in plays] == ["finish.yml"], plays
        return plays[0][1]["limit"]

    # a supervisor from before `finish` (exit 2), a node that does not answer: the playbook on that node only
    # (and localhost, whose play checks the limited nodes reported)
    old = subprocess.CompletedProcess("", 2, "", "invalid choice: 'finish'")
    assert finish_fails_on("worker", old) == ["c-worker-0", "localhost"]
    assert "finish over ssh: c-worker-0: FAILED\n    finish failed (exit 2: invalid choice: 'finish')" in \
        (state.logs / "train.log").read_text()
    assert finish_fails_on("ps", None) == ["c-ps-0", "localhost"]
    # an archive that is not one (what a login shell printed, a cut read), or none: every node
    assert finish_fails_on("none", None, archive=b"motd\n" + _archive("x")) is None
    assert finish_fails_on("none", None, archive=None) is None
    # an error here (a full disk): the playbook, not an exception out of the run's end
    monkeypatch.setattr(training.collected, "ARCHIVE", "no-such-dir/collected.tar.gz")
    assert finish_fails_on("none", None) is None
    assert "FileNotFoundError" in (state.logs / "train.log").read_text()

    # after a Ctrl-C or a failure (the chief stopped first): only the playbook, on every node, no SSH
    plays.clear()
    monkeypatch.setattr(remote, "run", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("ssh")))
    training.stop_serving_and_fetch_logs(state, "r1", 3, stop_chief=True)
    assert [(name, kw["limit"]) for name, kw in plays] == [("finish.yml", None)]


def test_the_ctrl_c_finish_asks_the_playbook_for_the_save(tmp_path, monkeypatch):
    """stop_serving_and_fetch_logs(save_first=True) hands finish.yml tfcluster_stop_saves; without it, 0."""
    state, nodes = _cluster(tmp_path, monkeypatch)
    seen = []
    monkeypatch.setattr(ansible_run, "playbook", lambda _state, name, extra, **kw: seen.append(
        json.loads(extra.read_text())))
    for save_first in (True, False):
        training.stop_serving_and_fetch_logs(state, "r1", len(nodes), stop_chief=True, save_first=save_first)
    assert [v["tfcluster_stop_saves"] for v in seen] == [training.SAVE_BEFORE_STOP_S, 0]
    assert all(v["tfcluster_stop_chief"] for v in seen)


def test_after_a_ctrl_c_the_chiefs_save_goes_over_ssh_at_once_and_a_failure_is_left_to_the_playbook(
        tmp_path, monkeypatch):
    state, nodes = _cluster(tmp_path, monkeypatch)
    state.logs.mkdir(parents=True, exist_ok=True)
    chief = nodes[-1]
    ran = []
    monkeypatch.setattr(remote, "run", lambda _s, node, command, timeout=30, **kw: ran.append(
        (node.name, shlex.split(command), timeout)) or subprocess.CompletedProcess(command, 0, "stopped: ...", ""))
    training._save_and_stop_chief(state, chief)
    assert ran == [("c-chief-0", [remote.SUPERVISE, "stop", "--dir", remote.TASK_DIR, "--save", "60"],
                    training.SAVE_BEFORE_STOP_S + 30)]
    monkeypatch.setattr(remote, "run", lambda *a, **kw: (_ for _ in ()).throw(OSError("no route")))
    training._save_and_stop_chief(state, chief)       # not raised: the playbook's chief play does it then
    log = (state.logs / "train.log").read_text()
    assert "save and stop over ssh: c-chief-0: exit 0: stopped: ..." in log and "OSError: no route" in log
