#!/usr/bin/env python3
"""A private Infrastructure Manager (IM 2.x) server on loopback: install, start, stop, status.

IM's server pulls its own Ansible and web stack, so it lives in a virtual environment of its own
(default ``_im/im-<version>-client-<version>/venv`` in the machine's cache, ``~/.cache/tfcluster``),
never in the project's ``.venv``. Each server instance has a directory with its configuration
(``im.cfg``), its SQLite database, its log and its pid file:

    scripts/im_server.py install [--venv DIR]                        # also installs im_client
    scripts/im_server.py start --dir DIR --port PORT [--venv DIR]   # prints the REST URL
    scripts/im_server.py status --dir DIR
    scripts/im_server.py stop --dir DIR

IM reads ``[im]`` from ``<site-packages>/im.cfg`` and then from ``/etc/im/im.cfg`` (the later file
wins). So that one venv can serve several instances, and so that a machine-wide ``/etc/im/im.cfg``
cannot move the server off loopback, ``start`` writes the instance's ``im.cfg`` into its directory and
launches IM through a small wrapper that applies that file last, before IM's REST server is created.
The settings keep it offline and local: REST on 127.0.0.1 only, SQLite state (``DATA_DB`` a plain
path), a log file in the directory, no SSL, no OIDC, no VMRC, no Vault, no stats. IM's own
contextualization (which downloads micromamba and Ansible from the internet) is only run for RADL
documents that ask for it; tfcluster always sends ``contextualize ()``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tfcluster.paths import cache_root, made_once  # noqa: E402  (the machine's cache: every checkout shares IM's venv)

IM_VERSION = "2.0.0"
#: the operator's client (the command is im_client since 2.0), installed beside the server
IM_CLIENT_VERSION = "1.8.4"
#: one venv per IM and im_client release (the cache is shared by every checkout on the machine)
DEFAULT_VENV = cache_root() / "_im" / f"im-{IM_VERSION}-client-{IM_CLIENT_VERSION}" / "venv"
BASE_PYTHON = "/usr/bin/python3"  # Debian's python with venv (pyenv shims are not on every machine)

# Runs inside IM's venv: apply the instance's im.cfg (last, so it wins over /etc/im/im.cfg), then start
# IM exactly as its im_service entry point does.
LAUNCHER = """
import configparser, sys
from IM.config import Config, parse_options
cfg = configparser.ConfigParser()
if not cfg.read(sys.argv[1]):
    sys.exit("cannot read " + sys.argv[1])
parse_options(cfg, "im", Config)
sys.argv = ["im_service"]
from IM import im_service
im_service.main()
"""


def im_cfg(directory: Path, port: int) -> str:
    return "\n".join([
        "# written by scripts/im_server.py: a private IM server on loopback with SQLite state",
        "[im]",
        "ACTIVATE_REST = True",
        "REST_ADDRESS = 127.0.0.1",
        f"REST_PORT = {port}",
        "REST_SSL = False",
        f"DATA_DB = {directory / 'inf.dat'}",
        f"LOG_FILE = {directory / 'im.log'}",
        "LOG_LEVEL = INFO",
        # no user list: any IM username/password in the auth data is accepted (a private server)
        "USER_DB =",
        "MAX_SIMULTANEOUS_LAUNCHES = 4",
        "VM_INFO_UPDATE_FREQUENCY = 5",
        "VM_INFO_UPDATE_ERROR_GRACE_PERIOD = 60",
        "WAIT_PUBLIC_IP_TIMEOUT = 30",
        "INF_CACHE_TIME = 0",
        f"REMOTE_CONF_DIR = {directory / 'remote'}",
        "",
    ])


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def install(venv: Path, log=print) -> Path:
    """Create IM's own venv and install the pinned IM and im_client into it (idempotent); return its python."""
    python = venv / "bin" / "python"
    marker = venv / f".im-{IM_VERSION}-client-{IM_CLIENT_VERSION}-installed"
    # another checkout or test worker may be installing it
    return made_once(venv.parent / ".install.lock", lambda: python if marker.exists() else None,
                     lambda: _install(venv, python, marker, log))


def _install(venv: Path, python: Path, marker: Path, log) -> Path:
    """IM's venv created (if need be) and the pinned IM and im_client installed into it; its python."""
    if not python.exists():
        subprocess.run([BASE_PYTHON, "-m", "venv", str(venv)], check=True)
    wanted = [f"im=={IM_VERSION}", f"im-client=={IM_CLIENT_VERSION}"]
    log(f"installing {' '.join(wanted)} into {venv} (its own venv: IM pins its own Ansible)")
    res = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *wanted],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"pip install {' '.join(wanted)} failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    marker.write_text(IM_VERSION + "\n")
    return python


def _pid(directory: Path) -> int | None:
    try:
        return int((directory / "im.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start(directory: Path, port: int, venv: Path, timeout: float = 60.0, log=print) -> str:
    """Start an IM server for directory on 127.0.0.1:port; return its REST URL."""
    url = f"http://127.0.0.1:{port}"
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    pid = _pid(directory)
    if pid and _alive(pid) and _answers(port):
        return url
    if not _port_free(port):
        raise SystemExit(f"127.0.0.1:{port} is in use by another process")
    python = install(venv, log=log)
    cfg = directory / "im.cfg"
    cfg.write_text(im_cfg(directory, port))
    env = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(directory),
           "LANG": "C.UTF-8", "IM_DATA_DB": str(directory / "inf.dat"),
           # nothing in the server may phone home
           "ANSIBLE_GALAXY_DISABLE_GPG_VERIFY": "1", "DO_NOT_TRACK": "1"}
    with open(directory / "server.out", "ab") as out:
        proc = subprocess.Popen([str(python), "-c", LAUNCHER, str(cfg)], cwd=directory, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                close_fds=True)
    (directory / "im.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (directory / "server.out").read_text(errors="replace")[-2000:]
            raise SystemExit(f"IM exited with code {proc.returncode}:\n{tail}")
        if _answers(port):
            log(f"IM {IM_VERSION} answers at {url} (pid {proc.pid}, state in {directory})")
            return url
        time.sleep(0.2)
    stop(directory, log=log)
    raise SystemExit(f"IM did not answer at {url} within {timeout:.0f}s; see {directory / 'im.log'}")


def stop(directory: Path, log=print) -> None:
    """Stop the server of directory (SIGTERM to its process group, then SIGKILL); idempotent."""
    directory = directory.resolve()
    pid = _pid(directory)
    if not pid:
        return
    if _alive(pid):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(pid):
            try:  # reap it when it is our own child (tests import this module)
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.2)
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log(f"stopped IM (pid {pid})")
    (directory / "im.pid").unlink(missing_ok=True)


def status(directory: Path) -> bool:
    directory = directory.resolve()
    pid = _pid(directory)
    cfg = directory / "im.cfg"
    port = None
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            if line.startswith("REST_PORT"):
                port = int(line.split("=", 1)[1])
    running = bool(pid and _alive(pid) and port and _answers(port))
    print(f"IM in {directory}: " + (f"running at http://127.0.0.1:{port} (pid {pid})" if running else "stopped"))
    return running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("install", help="create IM's own venv and install im")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p = sub.add_parser("start", help="start a server (prints its URL)")
    p.add_argument("--dir", type=Path, required=True, help="the instance's directory (config, SQLite, log)")
    p.add_argument("--port", type=int, required=True, help="REST port on 127.0.0.1")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--timeout", type=float, default=60.0)
    for name in ("stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.action == "install":
        print(install(args.venv))
    elif args.action == "start":
        print(start(args.dir, args.port, args.venv, args.timeout, log=lambda m: print(m, file=sys.stderr)))
    elif args.action == "stop":
        stop(args.dir)
    else:
        return 0 if status(args.dir) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
