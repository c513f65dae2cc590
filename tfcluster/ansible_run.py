"""Running Ansible for a cluster: the project's ansible.cfg, the cluster's inventory, live output.

The full output of each playbook goes to a log file; the console gets a condensed view (plays, tasks,
failures, the recap) unless TFCLUSTER_VERBOSE=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .errors import TfclusterError
from .paths import ANSIBLE_CFG, PLAYBOOKS_DIR, ClusterState

BIN = Path(sys.executable).parent
_SHOWN = re.compile(r"^(PLAY \[|TASK \[|PLAY RECAP|fatal:|failed:|ERROR!|\[ERROR\]|\S+\s+: ok=\d+)")
_NOISE = re.compile(r"^(TASK \[.*(Validating arguments|Gathering Facts)|TASK \[(Check|Record) )")


_RECAP = re.compile(r"^(\S+)\s+: (ok=\d+.*)$")


def _show(line: str) -> bool:
    if os.environ.get("TFCLUSTER_VERBOSE") == "1":
        return True
    return bool(_SHOWN.match(line)) and not _NOISE.match(line)


def environment(state: ClusterState, extra: dict[str, str] | None = None) -> dict[str, str]:
    cp = state.ensure_control_dir()
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
    return subprocess.run(cmd, capture_output=True, text=True, env=environment(state), stdin=subprocess.DEVNULL)


def playbook(state: ClusterState, name: str, extra_vars_file: Path | None = None,
             forks: int = 32, log_file: Path | None = None, env: dict[str, str] | None = None,
             tags: str | None = None) -> dict[str, dict[str, int]]:
    """Run ``playbooks/<name>``, streaming its output (and teeing it to log_file).

    Returns the recap, ``{host: {"ok": n, "changed": n, "failed": n, ...}}``; raises on failure.
    """
    cmd = [str(BIN / "ansible-playbook"), "-i", str(state.inventory), str(PLAYBOOKS_DIR / name),
           "--forks", str(max(forks, 5))]
    if extra_vars_file:
        cmd += ["-e", f"@{extra_vars_file}"]
    if tags:
        cmd += ["--tags", tags]
    log = open(log_file, "a") if log_file else None
    try:
        # stdin: Ansible needs none, and refuses to start on a non-blocking one (a background job's)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=environment(state, env), bufsize=1)
        assert proc.stdout is not None
        in_failure, recap = False, {}
        for line in proc.stdout:
            m = _RECAP.match(line)
            if m:
                recap[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            if log:
                log.write(line)
            if line.startswith(("fatal:", "failed:")):
                in_failure = True
            elif not line.startswith((" ", "\t", "{", "}")) and line.strip():
                in_failure = False
            if _show(line) or in_failure:
                sys.stdout.write("    " + line.rstrip("*\n ").rstrip() + "\n" if line.startswith(("PLAY", "TASK"))
                                 else "    " + line)
        code = proc.wait()
    finally:
        if log:
            log.close()
    if code != 0:
        raise TfclusterError(f"ansible-playbook {name} failed (exit {code})"
                             + (f"; full log: {log_file}" if log_file else ""))
    return recap


def check_reported(recap: dict[str, dict[str, int]], hosts: list[str], what: str) -> None:
    """Success is every node in the recap with nothing failed or unreachable, not only exit code 0."""
    missing = [h for h in hosts if h not in recap]
    bad = [h for h in hosts if h in recap and (recap[h].get("failed") or recap[h].get("unreachable"))]
    if missing or bad:
        raise TfclusterError(f"{what}: nodes that did not report: {missing or 'none'}; failed: {bad or 'none'}")
