"""Running Ansible for a cluster: the project's ansible.cfg, the cluster's inventory, live output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .errors import TfclusterError
from .paths import ANSIBLE_CFG, PLAYBOOKS_DIR, ClusterState

BIN = Path(sys.executable).parent


def environment(state: ClusterState, extra: dict[str, str] | None = None) -> dict[str, str]:
    cp = state.dir / "cp"
    cp.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp),
        "ANSIBLE_LOCAL_TEMP": str(state.dir / "ansible-tmp"),
        "ANSIBLE_FORCE_COLOR": "0",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


def ping(state: ClusterState, timeout: int = 10) -> subprocess.CompletedProcess:
    """``ansible all -m ping`` through the cluster's inventory."""
    cmd = [str(BIN / "ansible"), "all", "-i", str(state.inventory), "-m", "ansible.builtin.ping", "-o",
           "-T", str(timeout)]
    return subprocess.run(cmd, capture_output=True, text=True, env=environment(state))


def playbook(state: ClusterState, name: str, extra_vars_file: Path | None = None,
             forks: int = 32, log_file: Path | None = None, env: dict[str, str] | None = None,
             limit: str | None = None, tags: str | None = None) -> None:
    """Run ``playbooks/<name>``, streaming its output (and teeing it to log_file)."""
    cmd = [str(BIN / "ansible-playbook"), "-i", str(state.inventory), str(PLAYBOOKS_DIR / name),
           "--forks", str(max(forks, 5))]
    if extra_vars_file:
        cmd += ["-e", f"@{extra_vars_file}"]
    if limit:
        cmd += ["--limit", limit]
    if tags:
        cmd += ["--tags", tags]
    log = open(log_file, "a") if log_file else None
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=environment(state, env), bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if log:
                log.write(line)
        code = proc.wait()
    finally:
        if log:
            log.close()
    if code != 0:
        raise TfclusterError(f"ansible-playbook {name} failed (exit {code})"
                             + (f"; full log: {log_file}" if log_file else ""))
