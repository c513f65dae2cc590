"""train/entry.py.j2: parses, renders with plain Jinja2 and with Ansible, compiles, embeds values safely."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from harness_support import ENTRY_TEMPLATE, TRAIN_DIR, example_settings, jinja_env, render_entry
from jinja2 import meta

TRICKY = {"cluster": "it's '''quoted''' \\ \" \\u0027", "run_id": "é✓😀\n\t", "n": None}


def test_template_parses_and_starts_with_ansible_managed():
    source = ENTRY_TEMPLATE.read_text()
    jinja2.Environment().parse(source)
    assert source.startswith("{{ ansible_managed | comment }}\n")


def test_template_uses_only_its_two_variables():
    ast = jinja_env().parse(ENTRY_TEMPLATE.read_text())
    assert meta.find_undeclared_variables(ast) == {"ansible_managed", "tf_node_harness_dir",
                                                    "tf_node_settings"}


def test_rendered_script_compiles_and_round_trips_settings(tmp_path):
    settings = example_settings()
    text = render_entry("/opt/tfcluster/harness", settings)
    assert text.startswith("#\n# Ansible managed")
    compile(text, "entry.py", "exec")
    script = tmp_path / "entry.py"
    script.write_text(text)
    namespace = runpy.run_path(str(script), run_name="not_main")
    assert namespace["SETTINGS"] == settings
    assert namespace["HARNESS_DIR"] == "/opt/tfcluster/harness"


def test_quotes_backslashes_and_unicode_cannot_break_out(tmp_path):
    settings = example_settings(**TRICKY)
    harness_dir = "/opt/it's here"
    text = render_entry(harness_dir, settings)
    compile(text, "entry.py", "exec")
    script = tmp_path / "entry.py"
    script.write_text(text, encoding="utf-8")
    namespace = runpy.run_path(str(script), run_name="not_main")
    assert namespace["SETTINGS"] == settings and namespace["HARNESS_DIR"] == harness_dir


def test_rendered_script_rejects_bad_settings_without_tensorflow(tmp_path):
    """Runs the real entry script; bad settings exit 2 before anything heavy is imported."""
    text = render_entry(TRAIN_DIR, example_settings(steps=0))
    script = tmp_path / "entry.py"
    script.write_text(text)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "settings['steps'] must be >= 1 (got 0)" in proc.stderr


ANSIBLE = Path(sys.executable).parent / "ansible"


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed next to this python")
def test_renders_with_ansible_template_module(tmp_path):
    """The real thing: Ansible's own to_json, comment and ansible_managed."""
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    variables = {"tf_node_harness_dir": "/opt/tfcluster/harness", "tf_node_settings": example_settings(**TRICKY)}
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    dest = tmp_path / "entry.py"
    env = {**os.environ, "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"), "ANSIBLE_HOME": str(tmp_path / "home"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_REMOTE_TMP": str(tmp_path / "rtmp")}
    proc = subprocess.run(
        [str(ANSIBLE), "localhost", "-c", "local", "-i", "localhost,", "-e",
         f"ansible_python_interpreter={sys.executable}", "-e", f"@{tmp_path / 'vars.json'}",
         "-m", "ansible.builtin.template", "-a", f"src={ENTRY_TEMPLATE} dest={dest}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = dest.read_text(encoding="utf-8")
    assert text.startswith("#\n# Ansible managed")
    namespace = runpy.run_path(str(dest), run_name="not_main")
    assert namespace["SETTINGS"] == variables["tf_node_settings"]
