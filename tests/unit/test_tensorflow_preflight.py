"""The tensorflow role's first tasks (issue 8, items 1 and 13): a node whose Python the pinned TensorFlow has
no wheels for fails naming the node, its Python and what the release supports; the package follows the CPU.

Runs the role's preflight.yml on this machine (connection local; it only reads /usr/bin/python3's version).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Run the preflight of the tensorflow role
      ansible.builtin.include_role:
        name: tensorflow
        tasks_from: preflight
    - name: Show the package chosen
      ansible.builtin.debug:
        msg: "PACKAGE={{ __tensorflow_package }}"
"""
HOST_PYTHON = subprocess.run(["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()


def _play(tmp_path: Path, **extra) -> subprocess.CompletedProcess:
    book = tmp_path / "preflight.yml"
    book.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               ANSIBLE_PYTHON_INTERPRETER="/usr/bin/python3")
    ansible = Path(sys.executable).parent / "ansible-playbook"
    return subprocess.run([str(ansible), "-i", "localhost,", str(book), "-e", json.dumps(extra)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def test_the_default_release_passes_on_this_python_and_picks_the_cpu_package(tmp_path):
    res = _play(tmp_path, tensorflow_version="2.21.0")
    assert res.returncode == 0, res.stdout + res.stderr
    expected = {"x86_64": "tensorflow-cpu", "aarch64": "tensorflow"}[platform.machine()]
    assert f"PACKAGE={expected}" in res.stdout


def test_gpu_nodes_get_the_cuda_package(tmp_path):
    res = _play(tmp_path, tensorflow_version="2.21.0", tf_gpus=1)
    assert res.returncode == 0 and "PACKAGE=tensorflow[and-cuda]" in res.stdout, res.stdout


def test_a_python_the_release_has_no_wheels_for_fails_naming_node_python_and_support(tmp_path):
    others = ["3.0", "3.1"]
    assert HOST_PYTHON not in others
    res = _play(tmp_path, tensorflow_version="2.21.0", _tensorflow_python_support={"2.21": others})
    assert res.returncode != 0
    out = " ".join(res.stdout.split())
    assert (f"localhost: its Python {HOST_PYTHON} (/usr/bin/python3) cannot install TensorFlow 2.21.0, which "
            "publishes wheels for Python 3.0, 3.1") in out, out
    assert "PACKAGE=" not in res.stdout


def test_a_release_not_in_the_table_fails(tmp_path):
    res = _play(tmp_path, tensorflow_version="2.5.0")
    assert res.returncode != 0
    out = " ".join(res.stdout.split())
    assert "cannot install TensorFlow 2.5.0, which is not in the table of releases tfcluster knows (2.16," in out


def test_a_cpu_without_tensorflow_wheels_fails(tmp_path):
    res = _play(tmp_path, tensorflow_version="2.21.0", _tensorflow_packages_by_arch={"riscv64": "tensorflow"})
    assert res.returncode != 0
    assert f"TensorFlow publishes Linux wheels for riscv64, this node is {platform.machine()}" in \
        " ".join(res.stdout.split())


def test_arm_nodes_get_the_package_that_has_aarch64_wheels():
    data = yaml.safe_load((REPO / "roles/tensorflow/vars/main.yml").read_text())
    assert data["_tensorflow_packages_by_arch"] == {"x86_64": "tensorflow-cpu", "aarch64": "tensorflow"}


def test_preflight_is_the_first_task():
    tasks = yaml.safe_load((REPO / "roles/tensorflow/tasks/main.yml").read_text())
    assert tasks[0]["ansible.builtin.include_tasks"] == "preflight.yml"


def test_a_release_in_the_table_without_a_lock_file_fails_naming_it(tmp_path):
    """Nodes install only hash-pinned packages (issue 14, item 5): no lock, no install."""
    res = _play(tmp_path, tensorflow_version="2.21.1", tf_gpus=1)
    assert res.returncode != 0
    out = " ".join(res.stdout.split())
    assert "localhost: no lock file tensorflow-and-cuda-2.21.1.txt in" in out, out
    assert "scripts/lock.py --release 2.21.1" in out
