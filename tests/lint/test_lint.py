"""Static checks run by `make test` and `make lint`: ruff, Terraform fmt/validate, ansible-lint, checkov, Jinja."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent
TF_ENV = dict(os.environ, CHECKPOINT_DISABLE="1", TF_IN_AUTOMATION="1")
#: checkov lives in a venv of its own inside the controller's (scripts/bootstrap.sh, requirements-checkov.lock)
CHECKOV = Path(os.environ.get("TFCLUSTER_CHECKOV") or BIN.parent / "checkov" / "bin" / "checkov")


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


@pytest.mark.parametrize("directory, framework", [("terraform", "terraform"), ("roles", "ansible")])
def test_checkov_offline_is_clean_and_every_skip_gives_its_reason(directory, framework, tmp_path):
    """checkov over the modules and the roles, offline: --skip-download (no external modules, no policy
    metadata), no API key, and a proxy nobody listens on, so an attempt to reach the network fails at once
    instead of waiting. A finding is fixed or skipped inline (# checkov:skip=ID:reason) with its reason.
    Its temporary files go to the test's own directory: its HCL parser caches its grammar in TMPDIR (a
    ``.lark_cache_*.tmp`` that a CI simulation found left in /tmp)."""
    assert CHECKOV.exists(), f"{CHECKOV} is missing: scripts/bootstrap.sh installs it from requirements-checkov.lock"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "PRISMA_", "CKV_"))}
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="", NO_COLOR="1",
               TMPDIR=str(tmp_path))
    res = subprocess.run([str(CHECKOV), "-d", directory, "--framework", framework, "--skip-download", "--compact",
                          "--output", "json"], cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    report = json.loads(res.stdout)
    summary = report["summary"]
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0 and summary["passed"] > 0, summary
    for skipped in report["results"].get("skipped_checks", []):
        reason = skipped["check_result"].get("suppress_comment", "")
        assert len(reason) > 40 and reason != "No comment provided", \
            f"{skipped['check_id']} on {skipped['resource']} ({skipped['file_path']}) is skipped without its reason"


def test_every_jinja_template_parses():
    env = jinja2.Environment()
    templates = [p for p in REPO.rglob("*.j2") if ".venv" not in p.parts and ".tfcluster" not in p.parts]
    assert templates, "no templates found"
    for path in templates:
        env.parse(path.read_text(), name=str(path))
