"""Static S3 keys (a site's store, the local one) reach only the nodes whose task uses object storage, when
their tasks start, and are removed when the run's tasks stop and before teardown (issue 14).

The tf_node role's own tasks run here for real, on this machine (Ansible's local connection), through the
inventory tfcluster renders; each node's env file is a file of its own under the test's directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile

import pytest
import yaml

from tests.conftest import REPO
from tests.unit.supervise import SUPERVISE
from tfcluster import ansible_run, inventory, training
from tfcluster.paths import PLAYBOOKS_DIR, ClusterState
from tfcluster.providers.base import Node

KEY_ID, SECRET = "AKIATFCTCANARY0001", "tfct-canary-secret-7c1d"
SHAPES = {"parameter_server": {"ps": 1, "worker": 2, "chief": 1},
          "multi_worker_mirrored": {"worker": 2, "chief": 1}}


@pytest.fixture(autouse=True)
def _no_control_dir_left(tmp_path):
    """ansible_run makes the cluster's SSH control directory, in the temp dir: remove it after the test."""
    yield
    shutil.rmtree(ClusterState("c", root=tmp_path).control_dir, ignore_errors=True)


def local_cluster(tmp_path, strategy: str) -> tuple[ClusterState, dict]:
    """The rendered inventory, its hosts reached with the local connection, each with a task directory of its
    own (no task ever started) and the repo's supervisor; each host's env file path."""
    nodes = [Node(f"c-{role}-{i}", role, i, f"10.0.0.{10 + n}", f"10.0.0.{10 + n}", "root", 22, 0)
             for n, (role, i) in enumerate((r, i) for r, count in SHAPES[strategy].items() for i in range(count))]
    state = ClusterState("c", root=tmp_path)
    state.dir.mkdir(parents=True)
    inv = inventory.render(state, nodes, 2222, strategy)
    env_files = {}
    for group in inv["all"]["children"].values():
        for name, hostvars in group["hosts"].items():
            env_files[name] = tmp_path / "nodes" / name / "task.env"
            env_files[name].parent.mkdir(parents=True)
            hostvars.update(ansible_connection="local", tf_node_env_file=str(env_files[name]),
                            tf_node_state_dir=str(env_files[name].parent / "task"),
                            tf_node_collect_dir=str(env_files[name].parent / "collect"),
                            tf_node_supervisor=str(SUPERVISE))
    state.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    return state, env_files


def start_credentials(state: ClusterState, keys: dict[str, str]) -> subprocess.CompletedProcess:
    """What the start tasks do first (tf_node tasks_from credentials), with the controller's keys in
    Ansible's environment as tfcluster passes them (training.s3_env)."""
    play = state.dir / "credentials.yml"
    play.write_text(yaml.safe_dump([{"name": "Credentials", "hosts": "all", "gather_facts": False, "tasks": [
        {"name": "Put the credentials in place", "ansible.builtin.include_role": {
            "name": "tf_node", "tasks_from": "credentials"}}]}]))
    return subprocess.run([str(ansible_run.BIN / "ansible-playbook"), "-i", str(state.inventory), str(play)],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env=ansible_run.environment(state, keys))


def finish(state: ClusterState, *extra: str) -> subprocess.CompletedProcess:
    """playbooks/finish.yml as a run's end runs it (verbose: each command's argv and output shown)."""
    return subprocess.run([str(ansible_run.BIN / "ansible-playbook"), "-v", "-i", str(state.inventory), *extra,
                           str(PLAYBOOKS_DIR / "finish.yml")],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env=ansible_run.environment(state))


@pytest.mark.skipif(os.geteuid() != 0, reason="the role writes a root-owned file")
@pytest.mark.parametrize("strategy", SHAPES)
def test_keys_only_on_storage_nodes_and_gone_after_the_run(tmp_path, strategy):
    state, env_files = local_cluster(tmp_path, strategy)
    keys = {"TFCLUSTER_S3_ACCESS_KEY_ID": KEY_ID, "TFCLUSTER_S3_SECRET_ACCESS_KEY": SECRET}
    res = start_credentials(state, keys)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert SECRET not in res.stdout + res.stderr  # no_log
    for name, path in env_files.items():
        if name.startswith("c-ps-"):  # a parameter server never touches object storage
            assert not path.exists(), name
        else:
            assert path.read_text() == f"AWS_ACCESS_KEY_ID={KEY_ID}\nAWS_SECRET_ACCESS_KEY={SECRET}\n", name
            assert oct(path.stat().st_mode & 0o777) == "0o600", name

    # the run's finish (playbooks/finish.yml, also before teardown) removes them everywhere
    res = finish(state)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert set(re.findall(r"^(\S+)\s+: ok=", res.stdout, re.M)) == set(env_files) | {"localhost"}
    assert [name for name, path in env_files.items() if path.exists()] == []
    assert SECRET not in res.stdout + res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the role writes a root-owned file")
def test_no_keys_no_file(tmp_path):
    """On clouds the controller has no static keys (instance roles): a start leaves no env file anywhere,
    also not one from before."""
    state, env_files = local_cluster(tmp_path, "parameter_server")
    stale = env_files["c-worker-0"]
    stale.write_text("AWS_ACCESS_KEY_ID=old\nAWS_SECRET_ACCESS_KEY=old\n")
    res = start_credentials(state, {"TFCLUSTER_S3_ACCESS_KEY_ID": "", "TFCLUSTER_S3_SECRET_ACCESS_KEY": ""})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [name for name, path in env_files.items() if path.exists()] == []


def test_inventory_marks_the_nodes_that_use_storage(tmp_path):
    for strategy in SHAPES:
        state, _ = local_cluster(tmp_path / strategy, strategy)
        hosts = {name: hv for group in yaml.safe_load(state.inventory.read_text())["all"]["children"].values()
                 for name, hv in group["hosts"].items()}
        assert {name: hv["tf_storage"] for name, hv in hosts.items()} == \
            {name: not name.startswith("c-ps-") for name in hosts}


def test_keys_reach_ansible_only_when_the_tasks_start():
    """configure passes no keys (site.yml writes none); the start tasks get them (training.s3_env)."""
    source = (REPO / "tfcluster" / "training.py").read_text()
    configure = source[source.index("def configure("):source.index("def run_settings(")]
    assert "s3_env" not in configure
    run_tasks = source[source.index("def _run_tasks("):source.index("def _conclude(")]
    assert re.search(r'playbook\(state, "train\.yml", [^\n]*\n[^\n]*env=s3_env\(spec\)\)', run_tasks), run_tasks
    fetch = source[source.index("def stop_serving_and_fetch_logs("):source.index("def train(")]
    assert "s3_env" not in fetch and "env=" not in fetch.replace("console=console", "")
    main = yaml.safe_load((REPO / "roles/tf_node/tasks/main.yml").read_text())
    assert [t for t in main if "ansible.builtin.copy" in t and "AWS_" in str(t)] == []


@pytest.mark.parametrize("fetched", [True, False])
def test_down_fetches_the_logs_again_only_when_the_runs_finish_did_not(tmp_path, monkeypatch, capsys, fetched):
    """A run whose finish fetched every log and removed the credentials (after its tasks stopped) is not
    fetched again before teardown; one whose finish failed or never ran is."""
    import time

    from tfcluster import runrecord, teardown
    from tfcluster.providers.base import write_nodes

    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    state = ClusterState("c")
    state.dir.mkdir(parents=True)
    state.spec.write_text("{}")    # the cluster's spec (read through the load_spec below)
    write_nodes(state.nodes, [Node("c-chief-0", "chief", 0, "10.0.0.10", "10.0.0.10", "debian", 22, 0)])
    time.sleep(0.01)
    runrecord.write(state, {"run_id": "r1", "state": "verified", "logs_fetched": fetched})
    monkeypatch.setattr(teardown, "load_spec", lambda _state: type("Spec", (), {"node_total": 1})())
    plays, over_ssh = [], []
    monkeypatch.setattr(ansible_run, "playbook", lambda _s, name, _e, **kw: plays.append(name))
    # the end over SSH (first) fails on the node: the playbook then does it there
    monkeypatch.setattr(training, "_finish_over_ssh", lambda _s, nodes, _d, own_session: over_ssh.append(
        [n.name for n in nodes]) or nodes)
    teardown.fetch_logs_before_down("c")
    assert (over_ssh, plays) == (([], []) if fetched else ([["c-chief-0"]], ["finish.yml"]))
    if fetched:
        assert "every node's log was fetched" in capsys.readouterr().out


def commands(output: str, play: str) -> dict[str, list[str] | None]:
    """What the finish's command did on each host in the play whose name starts with ``play`` (``-v``
    output): its argv, or None where it was skipped."""
    section = output.split(f"PLAY [{play}", 1)[1].split("\nPLAY ", 1)[0]
    task = section.split("TASK [tf_node : Stop the task, remove its credentials file and archive", 1)[1]
    task = task.split("\nTASK [", 1)[0]
    found = re.findall(r"^(?:ok|changed): \[(\S+)\] => (\{.*\})$", task, re.M)
    ran = {name: json.loads(js)["cmd"] for name, js in found}
    return ran | {name: None for name in re.findall(r"^skipping: \[(\S+)\]", task, re.M)}


@pytest.mark.skipif(os.geteuid() != 0, reason="the role's commands run as root")
@pytest.mark.parametrize("stop_chief", [False, True])
def test_the_finish_stops_the_chief_only_when_asked_and_fetches_every_log(tmp_path, stop_chief):
    """playbooks/finish.yml: ps and workers stopped at a run's end, the chief too, in a play before theirs,
    with tfcluster_stop_chief (after a Ctrl-C or a failure); each node's credentials removed and its archive
    fetched, in one command a node and the fetch."""
    state, env_files = local_cluster(tmp_path, "parameter_server")
    for path in env_files.values():
        (path.parent / "task").mkdir()
        (path.parent / "task" / "node.log").write_text(f"the log of {path.parent.name}\n")
        path.write_text("AWS_SECRET_ACCESS_KEY=x\n")
    dest = tmp_path / "logs"
    res = finish(state, "-e", f"tf_node_logs_dest={dest}", "-e", f"tfcluster_stop_chief={str(stop_chief).lower()}")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    first, then = commands(res.stdout, "Stop the chief first"), commands(res.stdout, "Stop parameter servers")
    chief = "c-chief-0"
    assert {n for n, cmd in first.items() if cmd} == ({chief} if stop_chief else set()), first
    assert {n for n, cmd in then.items() if cmd} == set(env_files) - ({chief} if stop_chief else set()), then
    ran = {n: cmd for play in (first, then) for n, cmd in play.items() if cmd}
    assert {n for n, cmd in ran.items() if "--stop" in cmd} == {n for n in env_files if stop_chief or n != chief}
    assert all(cmd[cmd.index("--env-file") + 1] == str(env_files[n]) for n, cmd in ran.items())
    assert [n for n, path in env_files.items() if path.exists()] == []
    for name in env_files:
        with tarfile.open(dest / name / "collected.tar.gz") as tar:
            assert tar.extractfile("node.log").read() == f"the log of {name}\n".encode()


@pytest.mark.skipif(os.geteuid() != 0, reason="the role's commands run as root")
@pytest.mark.parametrize("fails", [False, True])
def test_the_finish_limited_to_the_nodes_whose_end_over_ssh_failed_checks_only_those(tmp_path, fails):
    """What tfcluster runs after a usual end over SSH failed on some nodes: finish.yml with --limit those nodes
    and localhost; only they are finished, and its last play checks that each of them (only) reported."""
    state, env_files = local_cluster(tmp_path, "parameter_server")
    worker = "c-worker-1"
    if fails:
        inv = yaml.safe_load(state.inventory.read_text())
        inv["all"]["children"]["worker"]["hosts"][worker]["tf_node_supervisor"] = "/bin/false"
        state.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    for path in env_files.values():
        (path.parent / "task").mkdir()
        path.write_text("AWS_SECRET_ACCESS_KEY=x\n")
    dest = tmp_path / "logs"
    res = finish(state, "-e", f"tf_node_logs_dest={dest}", "--limit", f"{worker},localhost")
    assert (res.returncode != 0) == fails, res.stdout[-3000:] + res.stderr[-3000:]
    plays = res.stdout.split("PLAY [Stop the chief first", 1)[1].split("PLAY [Check every node reported]")[0]
    assert {n for n in env_files if f"[{n}]" in plays} == {worker}, plays[-3000:]     # no other node's part
    assert {n for n, path in env_files.items() if path.exists()} == set(env_files) - {worker}
    if fails:    # its rescue removed the credentials (above) and failed it: no host left for the check's play
        assert re.search(rf"^{worker}\s+: .*failed=1", res.stdout, re.M), res.stdout[-3000:]
    else:        # the check's play looked at the limited node only
        assert re.findall(r"^ok: \[localhost\] => \(item=(\S+)\)", res.stdout, re.M) == [worker], res.stdout[-3000:]
    assert sorted(p.parent.name for p in dest.glob("*/collected.tar.gz")) == ([] if fails else [worker])


@pytest.mark.skipif(os.geteuid() != 0, reason="the role's commands run as root")
@pytest.mark.parametrize("supervisor", ["/bin/false", "without finish"])
def test_a_chief_whose_end_fails_drops_out_and_every_node_loses_its_credentials(tmp_path, supervisor):
    """After a Ctrl-C (tfcluster_stop_chief), the chief's part of the run's end fails (its stop, or a supervisor
    from before `finish`): its credentials go all the same, it does not report, and the other nodes' part
    runs (their tasks stopped, credentials removed, logs fetched)."""
    state, env_files = local_cluster(tmp_path, "parameter_server")
    chief = "c-chief-0"
    if supervisor == "without finish":       # what a node configured before `finish` existed answers
        old = tmp_path / "old-tfc-supervise"
        old.write_text("#!/bin/sh\n[ \"$1\" = stop ] && { echo 'not running (state stopped)'; exit 0; }\n"
                       "echo \"tfc-supervise: error: argument cmd: invalid choice: '$1'\" >&2; exit 2\n")
        old.chmod(0o755)
        supervisor = str(old)
    inv = yaml.safe_load(state.inventory.read_text())
    inv["all"]["children"]["chief"]["hosts"][chief]["tf_node_supervisor"] = supervisor
    state.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    for path in env_files.values():
        (path.parent / "task").mkdir()
        path.write_text("AWS_SECRET_ACCESS_KEY=x\n")
    dest = tmp_path / "logs"
    res = finish(state, "-e", f"tf_node_logs_dest={dest}", "-e", "tfcluster_stop_chief=true")
    assert res.returncode != 0 and f"{chief} did not report" in res.stdout, res.stdout[-3000:]
    assert [n for n, path in env_files.items() if path.exists()] == []
    then = commands(res.stdout, "Stop parameter servers")
    assert set(then) == set(env_files) - {chief} and all("--stop" in cmd for cmd in then.values()), then
    assert sorted(p.parent.name for p in dest.glob("*/collected.tar.gz")) == sorted(set(env_files) - {chief})
