"""The one place that drives Terraform, through python-terraform.

Each cluster gets a small root configuration under ``.tfcluster/<cluster>/terraform/`` that calls the
provider's module in ``terraform/<provider>/`` with the run's inputs and re-exports its ``nodes`` output.
State stays beside it, so ``down`` needs nothing else. Terraform runs offline and quietly:
``CHECKPOINT_DISABLE=1``, ``-input=false`` and a project-owned CLI config file.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from python_terraform import IsFlagged, IsNotFlagged, Terraform

from .errors import ProvisionError

TERRAFORM_BIN = shutil.which("terraform") or "/usr/local/bin/terraform"


@contextmanager
def temporary_environment(extra: dict[str, str], remove: tuple[str, ...] = ()):
    """Set (and remove) process environment variables for the block only: python-terraform copies
    os.environ into each command, so our variables are set for the call and restored after it."""
    saved = {k: os.environ.get(k) for k in (*extra, *remove)}
    os.environ.update(extra)
    for k in remove:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def literal(value):
    """``value`` as Terraform reads it literally from a ``.tf.json`` file, whose strings are templates:
    ``${`` and ``%{`` in a string (a user's data key, say) are escaped as ``$${`` and ``%%{``."""
    if isinstance(value, str):
        return value.replace("${", "$${").replace("%{", "%%{")
    if isinstance(value, dict):
        return {k: literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [literal(v) for v in value]
    return value


class TerraformModule:
    """A provider module driven from a per-cluster working directory."""

    def __init__(self, module_dir: Path, work_dir: Path, stream=None):
        self.module_dir = Path(module_dir).resolve()
        self.work_dir = Path(work_dir)
        self.stream = stream or sys.stderr
        self._tf = Terraform(working_dir=str(self.work_dir), terraform_bin_path=TERRAFORM_BIN)

    # -- environment -------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        cli_config = self.work_dir / "terraform.rc"
        if not cli_config.exists():
            # No plugin installation from the network; a mirror dir is used where one exists.
            mirror = os.environ.get("TFCLUSTER_TF_PLUGIN_MIRROR", "/opt/tf-plugins")
            body = "disable_checkpoint = true\n"
            if Path(mirror).is_dir():
                body += (f'provider_installation {{\n  filesystem_mirror {{\n    path = "{mirror}"\n  }}\n'
                         f'  direct {{\n    exclude = ["*/*/*"]\n  }}\n}}\n')
            cli_config.write_text(body)
        return {
            "CHECKPOINT_DISABLE": "1",
            "TF_CLI_CONFIG_FILE": str(cli_config),
            "TF_IN_AUTOMATION": "1",
            "TF_INPUT": "0",
        }

    def write_root(self, inputs: dict) -> None:
        """Write the root configuration that calls the module with these inputs."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        root = {
            "module": {"cluster": {"source": str(self.module_dir), **literal(inputs)}},
            "output": {"nodes": {"value": "${module.cluster.nodes}"}},
        }
        (self.work_dir / "main.tf.json").write_text(json.dumps(root, indent=2) + "\n")

    def _run(self, what: str, fn, *args, **kwargs):
        with temporary_environment(self._env()):
            code, out, err = fn(*args, **kwargs)
        if code != 0:
            raise ProvisionError(f"terraform {what} failed in {self.work_dir} (exit {code}):\n"
                                 f"{(err or '').strip()}\n{(out or '').strip()[-2000:]}".rstrip())
        return out

    # -- commands ----------------------------------------------------------------------------
    def init(self) -> None:
        if (self.work_dir / ".terraform" / "modules" / "modules.json").exists():
            return
        self._run("init", self._tf.init, reconfigure=IsNotFlagged, input=False)

    def apply(self) -> None:
        self.init()
        self._run("apply", self._tf.apply, skip_plan=True, input=False, capture_output=True, lock_timeout="60s")

    def destroy(self) -> None:
        if not (self.work_dir / "main.tf.json").exists():
            return
        self.init()
        # an interrupted apply may still be shutting down: wait for its state lock instead of failing
        self._run("destroy", self._tf.destroy, force=IsNotFlagged, auto_approve=True, input=False,
                  lock_timeout="60s")

    def output(self, name: str):
        out = self._run("output", self._tf.output_cmd, name, json=IsFlagged)
        return json.loads(out)

    def has_resources(self) -> bool:
        """Whether the state still records any resource."""
        state = self.work_dir / "terraform.tfstate"
        if not state.exists():
            return False
        try:
            return bool(json.loads(state.read_text()).get("resources"))
        except ValueError:
            return True
