"""Static checks run by `make test` and `make lint`: ruff, Terraform fmt/validate, ansible-lint, Jinja."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2

from tests.conftest import REPO

BIN = Path(sys.executable).parent
TF_ENV = dict(os.environ, CHECKPOINT_DISABLE="1", TF_IN_AUTOMATION="1")


def _tf_env(tmp_path: Path) -> dict:
    rc = tmp_path / "terraform.rc"
    rc.write_text("disable_checkpoint = true\n")
    return dict(TF_ENV, TF_CLI_CONFIG_FILE=str(rc))


def test_ruff():
    res = subprocess.run([str(BIN / "ruff"), "check", "tfcluster", "tests", "train", "scripts"], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_terraform_fmt(tmp_path):
    res = subprocess.run(["terraform", "fmt", "-check", "-recursive", "-diff", "terraform"], cwd=REPO,
                         capture_output=True, text=True, env=_tf_env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_terraform_validate_local(tmp_path):
    work = tmp_path / "local"
    shutil.copytree(REPO / "terraform" / "local", work)
    env = _tf_env(tmp_path)
    init = subprocess.run(["terraform", "init", "-backend=false", "-input=false"], cwd=work,
                          capture_output=True, text=True, env=env)
    assert init.returncode == 0, init.stdout + init.stderr
    res = subprocess.run(["terraform", "validate", "-no-color"], cwd=work, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ansible_lint_production_offline():
    res = subprocess.run([str(BIN / "ansible-lint"), "--offline", "--profile", "production", "roles", "playbooks"],
                         cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), NO_COLOR="1"))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


def test_every_jinja_template_parses():
    env = jinja2.Environment()
    templates = [p for p in REPO.rglob("*.j2") if ".venv" not in p.parts and ".tfcluster" not in p.parts]
    assert templates, "no templates found"
    for path in templates:
        env.parse(path.read_text(), name=str(path))
