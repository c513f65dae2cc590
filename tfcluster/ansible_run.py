"""Running Ansible for a cluster: the project's ansible.cfg, the cluster's inventory, live output.

The full output of each playbook goes to a log file; the console gets a condensed view (plays, tasks,
failures, the recap) unless TFCLUSTER_VERBOSE=1.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from . import remote
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


def mitogen_strategy() -> dict[str, str]:
    """Ansible's settings for mitogen's ``mitogen_linear`` strategy (the ``mitogen`` package of the controller's
    venv, whose path only this venv knows, so it is set here rather than in ansible.cfg): one Python
    interpreter per node kept for the whole playbook, instead of a module upload and a Python start per task
    (configure of 4 imaged nodes: 11.4 s → 8.5 s measured here). Empty where mitogen is not installed:
    Ansible's own ``linear`` strategy then runs the same plays. An ``ANSIBLE_STRATEGY`` of the user's wins
    (``ANSIBLE_STRATEGY=linear`` to compare or to debug without mitogen); the plugin path is set anyway."""
    found = importlib.util.find_spec("ansible_mitogen")
    if found is None or not found.origin:
        return {}
    plugins = {"ANSIBLE_STRATEGY_PLUGINS": str(Path(found.origin).parent / "plugins" / "strategy")}
    return plugins if os.environ.get("ANSIBLE_STRATEGY") else dict(plugins, ANSIBLE_STRATEGY="mitogen_linear")


def environment(state: ClusterState, extra: dict[str, str] | None = None, mitogen: bool = True) -> dict[str, str]:
    """Ansible's environment for this cluster; ``mitogen=False``: Ansible's own strategy (see :func:`playbook`)."""
    env = dict(os.environ)
    env.update(mitogen_strategy() if mitogen else {})
    # the cluster's control sockets, as tfcluster/remote.py names them (first: ssh keeps an option's first
    # value), then ansible.cfg's ssh_args or the user's own ANSIBLE_SSH_ARGS: Ansible's own ssh, mitogen's
    # (which reads ssh_args too, but no control path setting) and the commands tfcluster runs on nodes (status
    # polls, the configure check, a run's end) share one master per node
    try:
        ssh_args = shlex.split(os.environ["ANSIBLE_SSH_ARGS"]) if os.environ.get("ANSIBLE_SSH_ARGS") \
            else list(remote.general_options())
    except ValueError as exc:
        raise TfclusterError(f"ANSIBLE_SSH_ARGS={os.environ['ANSIBLE_SSH_ARGS']!r}: not shell words ({exc}); "
                             "unset it or quote it as a shell would") from None
    env.update({
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "ANSIBLE_SSH_ARGS": shlex.join([*remote.control_options(state), *ssh_args]),
        "ANSIBLE_LOCAL_TEMP": str(state.dir / "ansible-tmp"),
        "ANSIBLE_FORCE_COLOR": "0",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


def playbook(state: ClusterState, name: str, extra_vars_file: Path | None = None,
             forks: int = 32, log_file: Path | None = None, env: dict[str, str] | None = None,
             console: bool = True, mitogen: bool = True,
             limit: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Run ``playbooks/<name>`` (on ``limit``'s hosts of the inventory only, when given), streaming its
    output (and teeing it to log_file); ``console=False`` shows only failures and runs it in a session of
    its own (a playbook run beside other work that has the console and takes Ctrl-C).

    ``mitogen=False`` for a playbook of a few tasks a node: mitogen's start (an interpreter per node) then
    costs more than it saves, and Ansible's own strategy reuses the SSH control sockets that the status polls
    keep open (4 nodes, measured here: stopping the tasks and fetching the logs 3.0 s against 3.7 s with
    mitogen; configure 9.4 s against 5.4 s; starting the tasks 5.7 s against 4.8 s).

    Returns the recap, ``{host: {"ok": n, "changed": n, "failed": n, ...}}``; raises on failure.
    """
    cmd = [str(BIN / "ansible-playbook"), "-i", str(state.inventory), str(PLAYBOOKS_DIR / name),
           "--forks", str(max(forks, 5))]
    if extra_vars_file:
        cmd += ["-e", f"@{extra_vars_file}"]
    if limit:
        cmd += ["--limit", ",".join(limit)]
    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)   # the cluster's logs/ (a skipped configure made none)
    log = open(log_file, "a") if log_file else None
    try:
        # stdin: Ansible needs none, and refuses to start on a non-blocking one (a background job's)
        # console=False runs beside other work: in a session of its own, so that a Ctrl-C meant for that work
        # does not end it halfway (the caller waits for it either way)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=environment(state, env, mitogen), bufsize=1,
                                start_new_session=not console)
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
            if in_failure or (console and _show(line)):
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
