"""A run's usual end over the cluster's SSH masters (tfcluster.training._finish_over_ssh): the same supervisor
command as roles/tf_node/tasks/finish.yml, the archive read back, and the playbook wherever that fails."""

from __future__ import annotations

import shlex
import subprocess

import jinja2
import yaml

from tests.conftest import REPO
from tfcluster import ansible_run, remote, training
from tfcluster.paths import ClusterState
from tfcluster.providers.base import Node, write_nodes


def _role_finish_argv(role: str) -> list[str]:
    """``_tf_node_supervise_finish`` of roles/tf_node/vars/main.yml, rendered with the role's defaults for a
    run's usual end (the chief not asked to stop) whose logs the controller fetches."""
    defaults = yaml.safe_load((REPO / "roles/tf_node/defaults/main.yml").read_text())
    role_vars = yaml.safe_load((REPO / "roles/tf_node/vars/main.yml").read_text())
    env = jinja2.Environment()
    env.filters["bool"] = bool
    values = dict(defaults, tf_role=role, tf_node_stop_chief=False, tf_node_logs_dest="/logs")
    values["_tf_node_finish_stops"] = env.from_string(role_vars["_tf_node_finish_stops"]).render(values) == "True"
    return env.compile_expression(role_vars["_tf_node_supervise_finish"].strip().removeprefix("{{")
                                  .removesuffix("}}"))(values)


def test_the_finish_over_ssh_runs_the_roles_own_command_with_its_defaults():
    defaults = yaml.safe_load((REPO / "roles/tf_node/defaults/main.yml").read_text())
    assert (remote.TASK_DIR, remote.SUPERVISE, remote.ENV_FILE, remote.COLLECT_DIR) == (
        defaults["tf_node_state_dir"], defaults["tf_node_supervisor"], defaults["tf_node_env_file"],
        defaults["tf_node_collect_dir"])
    for role, stop in (("worker", True), ("ps", True), ("chief", False)):
        assert shlex.split(remote.finish_command(stop)) == _role_finish_argv(role), role


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
    monkeypatch.setattr(remote, "run", lambda _s, node, command, timeout=30, root=True: ran.append(
        (node.name, command)) or subprocess.CompletedProcess(command, 0, "credentials: removed /etc/x\n", ""))
    monkeypatch.setattr(remote, "read_archive", lambda _s, node, timeout=60: f"archive of {node.name}".encode())
    monkeypatch.setattr(training.collected, "unpack", lambda dest: [])
    monkeypatch.setattr(ansible_run, "playbook", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("playbook")))

    assert training.stop_serving_and_fetch_logs(state, "r1", 3) is True
    assert sorted(ran) == sorted((n.name, remote.finish_command(stop=n.role != "chief")) for n in nodes)
    for n in nodes:
        assert (state.logs / "r1" / n.name / "collected.tar.gz").read_bytes() == f"archive of {n.name}".encode()
    log = (state.logs / "train.log").read_text()
    assert all(f"finish over ssh: {n.name}: ok\n    credentials: removed /etc/x\n" in log for n in nodes), log


def test_where_a_node_fails_or_a_stop_of_the_chief_is_asked_the_playbook_finishes_every_node(tmp_path, monkeypatch):
    state, nodes = _cluster(tmp_path, monkeypatch)
    monkeypatch.setattr(remote, "read_archive", lambda _s, node, timeout=60: b"a")
    monkeypatch.setattr(training.collected, "unpack", lambda dest: [])
    plays = []
    monkeypatch.setattr(ansible_run, "playbook", lambda _s, name, extra, **kw: plays.append((name, kw)) or {})

    # the supervisor's finish fails on the worker (one from before `finish`: exit 2), the others answer
    def run(_s, node, command, timeout=30, root=True):
        code = 2 if node.role == "worker" else 0
        return subprocess.CompletedProcess(command, code, "", "invalid choice: 'finish'" if code else "")
    monkeypatch.setattr(remote, "run", run)
    assert training.stop_serving_and_fetch_logs(state, "r1", 3) is True      # the playbook did it
    assert [name for name, _ in plays] == ["finish.yml"] and "limit" not in plays[0][1]
    assert "finish over ssh: c-worker-0: FAILED\n    finish failed (exit 2: invalid choice: 'finish')" in \
        (state.logs / "train.log").read_text()

    # a node that does not answer, or whose archive cannot be read: the playbook too
    for answer, archive in ((None, b"a"), (subprocess.CompletedProcess("", 0, "", ""), None)):
        plays.clear()
        monkeypatch.setattr(remote, "run", lambda *a, answer=answer, **kw: answer)
        monkeypatch.setattr(remote, "read_archive", lambda *a, archive=archive, **kw: archive)
        training.stop_serving_and_fetch_logs(state, "r1", 3)
        assert [name for name, _ in plays] == ["finish.yml"]

    # after a Ctrl-C or a failure (the chief stopped first): only the playbook, no command over SSH
    plays.clear()
    monkeypatch.setattr(remote, "run", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("ssh")))
    training.stop_serving_and_fetch_logs(state, "r1", 3, stop_chief=True)
    assert [name for name, _ in plays] == ["finish.yml"]
