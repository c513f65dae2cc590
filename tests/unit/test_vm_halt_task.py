"""tf_node's start tasks halt a cloud VM after the run's deadline (issue 8, item 12); never a local node.

The task is not run here (it would halt this machine): its guard and its rendered command are checked.
"""

from __future__ import annotations

import jinja2
import yaml

from tests.conftest import REPO

START = REPO / "roles" / "tf_node" / "tasks" / "start.yml"


def _halt_task() -> dict:
    (task,) = [t for t in yaml.safe_load(START.read_text()) if "Halt this VM" in t["name"]]
    return task


def _when(task: dict, minutes) -> bool:
    env = jinja2.Environment()
    return env.compile_expression(task["when"])(tf_node_vm_halt_minutes=minutes)


def test_the_halt_is_armed_only_when_the_controller_asks():
    task = _halt_task()
    assert _when(task, 55) is True
    assert _when(task, 0) is False and _when(task, "0") is False
    defaults = yaml.safe_load((REPO / "roles/tf_node/defaults/main.yml").read_text())
    assert defaults["tf_node_vm_halt_minutes"] == 0  # local nodes: never (they share the host's kernel)


def test_the_halt_command_rearms_shutdown_and_records_the_time_for_a_reboot():
    cmd = jinja2.Environment().from_string(_halt_task()["ansible.builtin.shell"]["cmd"]).render(
        tf_node_vm_halt_minutes="55")
    assert "echo $(( $(date +%s) + 55 * 60 )) > /etc/tfcluster-deadline &&" in cmd
    assert "shutdown -h +55 " in cmd
    # the AWS boot unit reads the same file after a reboot
    user_data = (REPO / "terraform/aws/templates/user_data.sh.tftpl").read_text()
    assert "$(cat /etc/tfcluster-deadline)" in user_data


def test_the_halt_comes_after_the_task_started():
    names = [t["name"] for t in yaml.safe_load(START.read_text())]
    starts = [i for i, name in enumerate(names) if name.startswith(("Start the task under its supervisor",
                                                                     "Start the chief's task under its supervisor"))]
    assert len(starts) == 2 and max(starts) < names.index(_halt_task()["name"])
    # the chief's task starts in the task after the others' (every node runs the file in step: the chief last)
    tasks = yaml.safe_load(START.read_text())
    assert [tasks[i]["when"] for i in starts] == ["tf_role != 'chief'", "tf_role == 'chief'"]
