"""Which Ansible strategy tfcluster runs each playbook with (tfcluster/ansible_run.py): mitogen's for the long
ones, Ansible's own for the short playbooks, and whatever the user's ANSIBLE_STRATEGY says when it is set; and
the first contact with new nodes, plain ssh with Ansible's options before any of them."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tfcluster import ansible_run, training
from tfcluster.paths import ClusterState


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    monkeypatch.delenv("ANSIBLE_STRATEGY", raising=False)
    monkeypatch.delenv("ANSIBLE_SSH_ARGS", raising=False)
    st = ClusterState("c")
    st.dir.mkdir(parents=True)
    yield st
    shutil.rmtree(st.control_dir, ignore_errors=True)    # ansible_run.environment made it (in the temp dir)


def test_nodes_that_never_answer_over_ssh_fail_the_wait_naming_each_with_what_ssh_said(state):
    import socket

    from tfcluster import cluster
    from tfcluster.errors import ProvisionError
    from tfcluster.providers.base import Node

    with socket.socket() as s:       # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [Node(f"c-worker-{i}", "worker", i, "127.0.0.1", "127.0.0.1", "debian", port, 0) for i in range(2)]
    with pytest.raises(ProvisionError) as err:
        cluster.wait_for_ssh(state, nodes, timeout=1)
    first, *detail = str(err.value).splitlines()
    assert first == "nodes not reachable over SSH after 1s: c-worker-0, c-worker-1"
    assert [line.split(": ", 1)[0] for line in detail] == ["c-worker-0", "c-worker-1"], detail
    assert all("Connection refused" in line for line in detail), detail


def test_the_wait_asks_again_only_the_nodes_that_did_not_answer_until_each_has(state, monkeypatch):
    from tfcluster import cluster
    from tfcluster.providers.base import Node

    nodes = [Node(f"c-worker-{i}", "worker", i, f"10.9.9.{i + 2}", f"10.9.9.{i + 2}", "root", 22, 0) for i in range(2)]
    asked = []

    def run(cmd, **kw):     # the second node refuses the first time, then answers
        asked.append(cmd[-2])
        refused = cmd[-2] == "root@10.9.9.3" and asked.count(cmd[-2]) == 1
        return subprocess.CompletedProcess(cmd, 255 if refused else 0, "", "Connection refused\n" if refused else "")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(cluster.poll.time, "sleep", lambda s: None)
    cluster.wait_for_ssh(state, nodes, timeout=30)
    assert sorted(asked) == ["root@10.9.9.2", "root@10.9.9.3", "root@10.9.9.3"]


def test_mitogen_is_installed_and_its_strategy_plugin_is_where_ansible_is_told(state):
    env = ansible_run.environment(state)
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert (Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_linear.py").is_file()
    plain = ansible_run.environment(state, mitogen=False)
    assert "ANSIBLE_STRATEGY" not in plain and "ANSIBLE_STRATEGY_PLUGINS" not in plain


@pytest.mark.parametrize("mine", ["linear", "mitogen_free"])
def test_a_strategy_the_user_set_is_kept_and_finds_mitogens_plugins(state, monkeypatch, mine):
    monkeypatch.setenv("ANSIBLE_STRATEGY", mine)
    env = ansible_run.environment(state)
    assert env["ANSIBLE_STRATEGY"] == mine
    assert (Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_free.py").is_file()


def test_a_playbook_beside_other_work_runs_in_a_session_of_its_own(state, monkeypatch):
    """console=False: a Ctrl-C meant for the work beside it does not reach it."""
    seen = []

    class Proc:
        stdout = iter(["PLAY RECAP ***\n"])

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", lambda cmd, **kw: seen.append(kw) or Proc())
    ansible_run.playbook(state, "train.yml", console=False)
    ansible_run.playbook(state, "train.yml")
    assert [kw["start_new_session"] for kw in seen] == [True, False]


def test_the_inventory_gives_mitogen_ansible_cfgs_keepalives(state):
    import yaml

    from tfcluster import inventory, remote
    from tfcluster.providers.base import Node

    assert remote.keepalive() == (10, 3)     # ServerAliveInterval=10, ServerAliveCountMax=3 in ansible.cfg
    nodes = [Node("c-chief-0", "chief", 0, "10.0.0.10", "10.0.0.10", "debian", 22, 0)]
    inv = yaml.safe_load(yaml.safe_dump(inventory.render(state, nodes, 2222, "parameter_server")))
    assert (inv["all"]["vars"]["mitogen_ssh_keepalive_interval"],
            inv["all"]["vars"]["mitogen_ssh_keepalive_count"]) == (10, 3)


PARENT_PLAY = """\
- name: Show what runs the modules
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Read the command line of the process that ran this command
      ansible.builtin.shell: "tr '\\\\0' ' ' < /proc/$PPID/cmdline"
      register: parent
      changed_when: false
    - name: Show it
      ansible.builtin.debug:
        msg: "PARENT={{ parent.stdout }}"
"""


@pytest.mark.parametrize("mitogen", [True, False])
def test_ansible_runs_the_modules_in_mitogens_interpreter_only_when_asked(state, tmp_path, mitogen):
    """The plugin loads in this venv's Ansible and runs a play on the controller itself: a command's parent is
    mitogen's persistent interpreter (named ``python3(mitogen:...)``), or Ansible's per-task module wrapper."""
    play = tmp_path / "play.yml"
    play.write_text(PARENT_PLAY)
    res = subprocess.run([str(ansible_run.BIN / "ansible-playbook"), "-i", "localhost,", str(play)],
                         capture_output=True, text=True, env=ansible_run.environment(state, mitogen=mitogen),
                         timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    parent = re.search(r'"PARENT=(.*)"', res.stdout)
    assert parent, res.stdout[-2000:]
    assert ("(mitogen:" in parent.group(1)) is mitogen, parent.group(1)


def test_the_first_contact_is_plain_ssh_that_accepts_new_host_keys_then_the_short_playbooks_run_without_mitogen(
        state, monkeypatch):
    from tfcluster import cluster
    from tfcluster.providers.base import Node

    nodes = [Node("c-worker-0", "worker", 0, "10.9.9.2", "10.9.9.2", "debian", 22, 0),
             Node("c-worker-1", "worker", 1, "10.9.9.3", "10.9.9.3", "root", 2222, 0)]
    seen = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: seen.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0, "", ""))
    cluster.wait_for_ssh(state, nodes, timeout=5)
    # mitogen, which checks host keys strictly, comes later: the first contact records them (accept-new) and
    # leaves control masters for Ansible's own strategy; Python runs as Ansible runs it, through sudo for a
    # non-root login (the inventory's ansible_become)
    by_dest = {cmd[-2]: cmd for cmd in seen}
    assert sorted(by_dest) == ["debian@10.9.9.2", "root@10.9.9.3"] and len(seen) == 2
    assert by_dest["debian@10.9.9.2"][-1] == "sudo -n /usr/bin/python3 -c ''"
    assert by_dest["root@10.9.9.3"][-1] == "/usr/bin/python3 -c ''"
    for dest, cmd in by_dest.items():
        options = cmd[1:-2]          # every option before the destination
        assert cmd[0] == "ssh" and options[options.index("-i") + 1] == str(state.ssh_key), cmd
        assert options[options.index("-p") + 1] == ("22" if dest.startswith("debian") else "2222"), cmd
        assert "StrictHostKeyChecking=accept-new" in options and f"UserKnownHostsFile={state.known_hosts}" in options
        assert f"ControlPath={state.control_dir}/%C" in options and "ControlMaster=auto" in options
        assert "BatchMode=yes" in options

    # a run's end where a node does not answer over SSH (ssh's own exit status 255) falls back to the playbook
    from tfcluster.providers.base import write_nodes

    write_nodes(state.nodes, nodes)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 255, "", ""))
    calls = []
    monkeypatch.setattr(ansible_run, "playbook", lambda _s, name, _e, **kw: calls.append((name, kw)) or {})
    training.stop_serving_and_fetch_logs(state, "r1", 4)
    assert calls[-1][0] == "finish.yml" and calls[-1][1]["mitogen"] is False
    monkeypatch.setattr(training.runrecord, "write", lambda *a: None)
    training._finish(None, state, [], {"run_id": "r1"}, stop_chief=True)
    assert calls[-1][0] == "finish.yml" and calls[-1][1]["mitogen"] is False
    assert json.loads((state.dir / "vars" / "finish-vars.json").read_text())["tfcluster_stop_chief"] is True


def test_every_play_that_applies_an_image_role_runs_with_ansibles_own_linear_strategy():
    """The apt module installs python3-apt on a bare node and runs again under it, which mitogen's persistent
    interpreter cannot: plays applying common, gpu_driver or tensorflow name Ansible's linear strategy."""
    import yaml

    from tfcluster import baked
    from tfcluster.paths import PLAYBOOKS_DIR, REPO

    seen = 0
    for path in [*PLAYBOOKS_DIR.glob("*.yml"), *(REPO / "tests" / "integration").glob("*.yml")]:
        for play in yaml.safe_load(path.read_text()) or []:
            roles = {r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])}
            if roles & set(baked.IMAGE_ROLES):
                seen += 1
                assert play.get("strategy") == "linear", f"{path.name}: play {play.get('name')!r}"
    assert seen >= 4    # site.yml, image.yml and the two role test playbooks


def test_ansibles_ssh_and_tfclusters_node_commands_share_one_control_socket_per_node(state):
    """Ansible's own ssh (the short playbooks, an ad-hoc command) names its control socket as tfcluster/remote.py does,
    so a status poll or the configure check reuses a master a play left (and a play one a poll left). Seen
    in the ssh command Ansible runs against a closed port of this machine's loopback."""
    from tfcluster import remote
    from tfcluster.providers.base import Node

    node = Node("c-worker-0", "worker", 0, "127.0.0.1", "127.0.0.1", "debian", 1, 0)
    ours = next(o for o in remote.ssh_command(state, node, "true") if o.startswith("ControlPath="))
    res = subprocess.run([str(ansible_run.BIN / "ansible"), "all", "-i", "127.0.0.1,", "-m", "ansible.builtin.ping",
                          "-e", "ansible_port=1", "-e", "ansible_user=debian", "-vvv"],
                         capture_output=True, text=True, env=ansible_run.environment(state, mitogen=False),
                         timeout=120, stdin=subprocess.DEVNULL)
    execs = [line for line in res.stdout.splitlines() if "SSH: EXEC" in line]
    assert execs, res.stdout[-2000:]
    assert all([f"ControlPath={path}" for path in re.findall(r'ControlPath="?([^"\s]+)"?', line)] == [ours]
               for line in execs), execs     # once each: ours, and no other of Ansible's


def test_mitogens_ssh_uses_the_same_control_socket_as_tfclusters_node_commands(state):
    """A play through mitogen (train.yml's start) reaches each node through the master up's first contact or a
    status poll left, instead of an SSH handshake of its own: Ansible's environment (ANSIBLE_SSH_ARGS, which
    mitogen reads) names the cluster's control sockets, once. Seen in the ssh command line mitogen logs, against
    a closed port of this machine's loopback."""
    from tfcluster import inventory, remote
    from tfcluster.providers.base import Node

    node = Node("c-worker-0", "worker", 0, "127.0.0.1", "127.0.0.1", "debian", 1, 0)
    inventory.write(state, [node], 2222, "parameter_server")
    ours = next(o for o in remote.ssh_command(state, node, "true") if o.startswith("ControlPath="))
    env = dict(ansible_run.environment(state, mitogen=True), MITOGEN_LOG_LEVEL="DEBUG")
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    res = subprocess.run([str(ansible_run.BIN / "ansible"), "all", "-i", str(state.inventory), "-m",
                          "ansible.builtin.ping", "-e", "ansible_port=1", "-vvv"],
                         capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    lines = [line for line in (res.stdout + res.stderr).splitlines() if "command line for" in line]
    assert lines and all(" ssh " in line for line in lines), (res.stdout + res.stderr)[-2000:]
    assert all([f"ControlPath={path}" for path in re.findall(r"ControlPath=(\S+)", line)] == [ours]
               for line in lines), lines


def test_ansibles_ssh_args_name_the_clusters_control_sockets_first_then_ansible_cfgs_or_the_users(state, monkeypatch):
    from tfcluster import remote
    from tfcluster.errors import TfclusterError

    ours = remote.control_options(state)
    assert shlex.split(ansible_run.environment(state)["ANSIBLE_SSH_ARGS"]) == [*ours, *remote.general_options()]
    # the user's own (even one naming another control path: ssh keeps the first, the cluster's)
    monkeypatch.setenv("ANSIBLE_SSH_ARGS", "-o ControlPath=/elsewhere/%C -o 'ProxyCommand=nc %h %p'")
    assert shlex.split(ansible_run.environment(state)["ANSIBLE_SSH_ARGS"]) == [
        *ours, "-o", "ControlPath=/elsewhere/%C", "-o", "ProxyCommand=nc %h %p"]
    monkeypatch.setenv("ANSIBLE_SSH_ARGS", "-o 'ProxyCommand=nc")
    with pytest.raises(TfclusterError, match=r"ANSIBLE_SSH_ARGS=.*not shell words"):
        ansible_run.environment(state)
