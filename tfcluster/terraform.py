"""The one place that drives Terraform, through python-terraform.

Each cluster gets a small root configuration under ``.tfcluster/<cluster>/terraform/`` that calls the
provider's module in ``terraform/<provider>/`` with the run's inputs and re-exports its ``nodes`` output.
State stays beside it, so ``down`` needs nothing else. Terraform runs offline and quietly:
``CHECKPOINT_DISABLE=1``, ``-input=false`` and a project-owned CLI config file; a module's committed
provider lock file is copied into the root and used read-only (``-lockfile=readonly``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from python_terraform import IsFlagged, IsNotFlagged, Terraform

from .errors import ProvisionError

TERRAFORM_BIN = shutil.which("terraform") or "/usr/local/bin/terraform"
PLAN_FILE = "tfcluster.tfplan"
#: a resource block's head: its type, its name and, after any comment lines (checkov's skips), count or for_each
_RESOURCE_RE = re.compile(r'^resource "([\w-]+)" "([\w-]+)" \{\n(?:[ \t]*#.*\n)*(?:\s*((?:count|for_each)\s*=.*)\n)?',
                          re.M)
#: the provider lock file committed beside a module (terraform/aws/); Terraform reads only the root's
LOCK_FILE = ".terraform.lock.hcl"


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


class _Terraform(Terraform):
    """python-terraform that leaves the state file to Terraform. python-terraform parses terraform.tfstate when
    it is made and after each command, for a ``tfstate`` attribute nothing here reads; Terraform rewrites that
    file in place (truncate, then write), so a teardown after a Ctrl-C that caught an apply mid-write read an
    empty file and died with a JSONDecodeError instead of destroying (Terraform itself waits for the apply's
    state lock, then reads the state the apply ended with)."""

    def read_state_file(self, file_path=None):
        self.tfstate = None


class TerraformModule:
    """A provider module driven from a per-cluster working directory."""

    def __init__(self, module_dir: Path, work_dir: Path, stream=None):
        self.module_dir = Path(module_dir).resolve()
        self.work_dir = Path(work_dir)
        self.stream = stream or sys.stderr
        self._tf = _Terraform(working_dir=str(self.work_dir), terraform_bin_path=TERRAFORM_BIN)

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
        # var=None: python-terraform otherwise writes its (empty) variables to a /tmp/*.tfvars.json for every
        # command and removes it only when terraform returns, so each Ctrl-C left one behind
        with temporary_environment(self._env()):
            code, out, err = fn(*args, var=None, **kwargs)
        if code != 0:
            raise ProvisionError(f"terraform {what} failed in {self.work_dir} (exit {code}):\n"
                                 f"{(err or '').strip()}\n{(out or '').strip()[-2000:]}".rstrip())
        return out

    # -- commands ----------------------------------------------------------------------------
    def init(self) -> None:
        if (self.work_dir / ".terraform" / "modules" / "modules.json").exists():
            return
        options = {}
        lock = self.module_dir / LOCK_FILE
        if lock.is_file():
            # the module's committed provider checksums: the root gets a copy, which init may not change, so a
            # provider package whose checksum is not in it is refused (modules without one: see README)
            shutil.copyfile(lock, self.work_dir / LOCK_FILE)
            options["lockfile"] = "readonly"
        self._run("init", self._tf.init, reconfigure=IsNotFlagged, input=False, **options)

    def apply(self) -> None:
        self.init()
        self._run("apply", self._tf.apply, skip_plan=True, input=False, capture_output=True, lock_timeout="60s")

    def plan(self) -> dict:
        """Terraform's plan of this root, as ``terraform show -json`` gives it; nothing is applied. The state
        is not locked: run it in a working directory of its own (a copy of any state it should plan against)."""
        self.init()
        self._run("plan", self._tf.plan, detailed_exitcode=IsNotFlagged, input=False, lock=False,
                  out=PLAN_FILE, capture_output=True)
        return json.loads(self._run("show", self._tf.cmd, "show", PLAN_FILE, json=IsFlagged, no_color=IsFlagged))

    def declared_resources(self) -> list[tuple[str, str]]:
        """The module's resource blocks: ``(TYPE.NAME, its count or for_each expression or '')``, read from
        its ``.tf`` files (what a plan would create from, where no plan can run)."""
        found = []
        for path in sorted(self.module_dir.glob("*.tf")):
            for m in _RESOURCE_RE.finditer(path.read_text()):
                found.append((f"{m.group(1)}.{m.group(2)}", (m.group(3) or "").strip()))
        return found

    def variable_description(self, name: str) -> str:
        """The description of one of the module's variables ('' if it has none)."""
        for path in sorted(self.module_dir.glob("*.tf")):
            m = re.search(rf'^variable "{name}" {{\n\s*description\s*=\s*"((?:[^"\\]|\\.)*)"', path.read_text(), re.M)
            if m:
                return m.group(1)
        return ""

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


# -- reading a plan (``terraform show -json``) ----------------------------------------------------------
_MARKS = {("create",): "+", ("update",): "~", ("delete",): "-", ("delete", "create"): "-/+",
          ("create", "delete"): "+/-"}


def resource_changes(planned: dict) -> list[tuple[str, str, dict]]:
    """The planned changes of managed resources as ``(mark, address, attributes after)``; mark as Terraform
    prints it (``+`` create, ``~`` update, ``-`` destroy, ``-/+`` replace). Unchanged resources are left out."""
    changes = []
    for rc in planned.get("resource_changes", []):
        mark = _MARKS.get(tuple(rc["change"]["actions"]))
        if rc.get("mode") == "managed" and mark:
            changes.append((mark, rc["address"], rc["change"].get("after") or {}))
    return changes


def summary(changes: list[tuple[str, str, dict]]) -> str:
    """Terraform's own summary line: ``N to add, N to change, N to destroy``."""
    marks = [mark for mark, _, _ in changes]
    add = sum("+" in m for m in marks)
    destroy = sum("-" in m for m in marks)
    return f"{add} to add, {marks.count('~')} to change, {destroy} to destroy"


def planned_output(planned: dict, name: str):
    """An output's planned value, or None while Terraform knows it only after apply."""
    output = planned.get("planned_values", {}).get("outputs", {}).get(name, {})
    unknown = planned.get("output_changes", {}).get(name, {}).get("after_unknown")
    return None if unknown not in (None, False) else output.get("value")


def planned_attributes(planned: dict, key: str) -> dict:
    """The planned attributes of the first managed resource whose for_each key is ``key``."""
    for rc in planned.get("resource_changes", []):
        if rc.get("mode") == "managed" and rc.get("index") == key:
            return rc["change"].get("after") or {}
    return {}
