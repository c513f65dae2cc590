"""Helpers for the harness tests: paths, entry-script rendering, free ports, node processes.

Everything listens on 127.0.0.1 only; :class:`Processes` kills every process it started, and the warm
interpreters :class:`WarmInterpreters` starts end with the pytest process that started them.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN_DIR = REPO / "train"
NODE_FILES = REPO / "roles" / "tf_node" / "files"
ENTRY_TEMPLATE = TRAIN_DIR / "entry.py.j2"
if str(TRAIN_DIR) not in sys.path:
    sys.path.insert(0, str(TRAIN_DIR))

S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1"}
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY",
               "ALL_PROXY")


def run_probe(tmp_path: Path, source: str, timeout: float = 120, env: dict | None = None) -> str:
    """Run ``source`` as a file (AutoGraph converts a traced loop from its source) in a fresh Python with
    TensorFlow's logs quiet and ``TMPDIR`` in ``tmp_path`` (AutoGraph's files, and their bytecode, which
    TensorFlow's exit leaves, stay out of /tmp); asserts it succeeded and returns its stdout."""
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    res = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=timeout,
                         env={"TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path),
                              **(env or {})})
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s}s")


def comment_filter(text: str) -> str:
    """Ansible's ``comment`` filter in its default (plain) style."""
    return "\n".join(["#", *[f"# {line}" if line else "#" for line in str(text).splitlines()], "#"])


def jinja_env():
    """Plain Jinja2 with the two Ansible filters the entry template uses."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["comment"] = comment_filter
    env.filters["to_json"] = lambda value: json.dumps(value)
    return env


def render_entry(harness_dir: str | os.PathLike, settings: dict,
                 ansible_managed: str = "Ansible managed: do not edit") -> str:
    """Render train/entry.py.j2 with plain Jinja2, the way Ansible's template module would."""
    template = jinja_env().from_string(ENTRY_TEMPLATE.read_text())
    return template.render(ansible_managed=ansible_managed, tf_node_harness_dir=str(harness_dir),
                           tf_node_settings=settings)


def node_env(extra: dict | None = None) -> dict:
    """Environment for a node process: credentials as env vars, no proxies, nothing from TF_CONFIG."""
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS and k != "TF_CONFIG"}
    env.update(S3_CREDENTIALS)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _script_module(name: str):
    """roles/tf_node/files/``name`` as a module (it has no .py name to import it by)."""
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(NODE_FILES / name))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


class WarmInterpreters:
    """The node's warm interpreter (tfc-warm) for this pytest process's tasks, as a node starts them: each
    task a fork of an interpreter that imported TensorFlow once (a plain start imports it again: ~2 s of CPU
    per task, four at a time on 2 cores). One interpreter per import environment (tfc-supervise's
    ``warm_key``: the variables read at import, PYTHONPATH among them), started by the first task that needs
    it, and again by the next one if it has died. Each dies with this process (PR_SET_PDEATHSIG, as its
    forks die with it); :meth:`close` ends them at exit, and the first use removes the directories of
    pytest processes killed before theirs could.
    """

    READY_S = 120.0
    PREFIX = "tfc-harness-warm-"

    def __init__(self):
        self.root: Path | None = None
        self.servers: dict[str, tuple[subprocess.Popen, object] | None] = {}
        self._supervise = None

    def blockers(self) -> Path:
        """A directory for PYTHONPATH that makes the packages the nodes lack unimportable: one per pytest
        process, so that its tasks share one import environment and so one warm interpreter."""
        path = self._root() / "not-on-nodes"
        for package in NOT_ON_NODES:
            if not (path / package).exists():
                (path / package).mkdir(parents=True)
                (path / package / "__init__.py").write_text(f"raise ImportError('{package} is not on nodes')\n")
        return path

    def _supervisor(self):
        """tfc-supervise's code (loaded once): the node's own warm_key, WarmInterpreter and task signals."""
        if self._supervise is None:
            self._supervise = _script_module("tfc-supervise")
        return self._supervise

    def _root(self) -> Path:
        if self.root is None:
            _remove_orphaned(Path(tempfile.gettempdir()), self.PREFIX)
            self.root = Path(tempfile.mkdtemp(prefix=f"{self.PREFIX}{os.getpid()}-"))
            atexit.register(self.close)
        return self.root

    def start(self, cmd: list[str], env: dict, cwd: str | None, out):
        """``cmd`` (``python script args``) forked by the warm interpreter of ``env``'s import environment,
        with ``out`` as its stdout and stderr: a WarmChild (pid, poll, wait, returncode, as a Popen). None where
        that interpreter could not load or be reached (the caller starts the task the plain way, as a node's
        supervisor does)."""
        key = self._supervisor().warm_key(cmd[0], env)
        tried, server = key in self.servers, self.servers.get(key)
        if server is not None and server[0].poll() is not None:
            print(f"warm interpreter {key} exited {server[0].returncode}: starting it again", file=sys.stderr)
            tried = False
        if not tried:       # one that could not load is not tried again: its tasks start the plain way
            server = self.servers[key] = self._launch(cmd[0], key, env)
        if server is None:
            return None
        try:
            return server[1].start(cmd, env, cwd or os.getcwd(), out)
        except OSError as exc:
            print(f"warm interpreter {key} unreachable ({exc}): the task starts the plain way", file=sys.stderr)
            return None

    def _launch(self, python: str, key: str, env: dict):
        directory = self._root() / key
        shutil.rmtree(directory, ignore_errors=True)      # a server that died left its socket and record
        directory.mkdir(mode=0o700)
        # PR_SET_PDEATHSIG by setpriv (util-linux), kept across its exec: a preexec_fn would run Python
        # between fork and exec in a process that may have TensorFlow's or boto's threads
        proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", python, str(NODE_FILES / "tfc-warm"), "serve",
                                 "--dir", str(directory), "--key", key], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=directory,
                                start_new_session=True)
        record, deadline = directory / "warm.json", time.monotonic() + self.READY_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if json.loads(record.read_text()).get("ready") is True:
                    return proc, self._supervisor().WarmInterpreter(str(directory), python, env, {}, print)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        log = directory / "warm.log"
        print(f"warm interpreter not ready (exit {proc.returncode}): tasks start the plain way; "
              f"{log.read_text(errors='replace')[-2000:] if log.exists() else ''}", file=sys.stderr)
        return None

    def signal(self, pid: int, sig: int) -> None:
        """``sig`` to a task and the process group it leads, or to the task alone while it leads none (a
        fork of the warm interpreter before its setsid), as the node's supervisor sends it."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            self._supervisor()._signal_task(pid, fd, sig)
        finally:
            os.close(fd)

    def close(self) -> None:
        for server in self.servers.values():
            if server is not None and server[0].poll() is None:
                server[0].kill()        # its forks die with it (PR_SET_PDEATHSIG)
                server[0].wait(timeout=30)
        self.servers.clear()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def _remove_orphaned(tmp: Path, prefix: str) -> None:
    """The directories ``prefix``PID-* of pytest processes no longer running (killed before their exit
    could remove them)."""
    for path in tmp.glob(f"{prefix}*"):
        pid = path.name.removeprefix(prefix).partition("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


#: packages the controller has and the nodes lack
NOT_ON_NODES = ("sklearn", "tensorboard")
WARM = WarmInterpreters()


class Processes:
    """Starts processes with their output in a log file and kills every one of them at the end."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(self, name: str, cmd: list[str], env: dict | None = None, cwd: str | None = None,
              warm: bool = False):
        """Start ``cmd`` with its stdin from /dev/null, as a node's task; with ``warm`` (``cmd`` is ``python
        script args``) as a fork of this pytest process's warm interpreter for ``env``, as a node's supervisor
        starts a task (:class:`WarmInterpreters`), or the plain way where that interpreter could not load."""
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as fh:
            proc = WARM.start(cmd, env if env is not None else dict(os.environ), cwd, fh) if warm else None
            if proc is None:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                        env=env, cwd=cwd, start_new_session=True)
        self.procs[name] = (proc, log)
        return proc

    def log(self, name: str) -> str:
        return self.procs[name][1].read_text(errors="replace")

    def wait(self, name: str, timeout_s: float) -> int:
        proc = self.procs[name][0]
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{name} still running after {timeout_s}s; log:\n{self.log(name)[-4000:]}") from None

    def kill(self, name: str) -> None:
        proc = self.procs[name][0]
        if proc.poll() is None:
            WARM.signal(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def kill_all(self) -> None:
        """Kill every process, each even where killing one before it failed; then raise the first failure."""
        failures = []
        for name in list(self.procs):
            try:
                self.kill(name)
            except Exception as exc:    # noqa: BLE001 - the rest must still be killed
                failures.append(exc)
        if failures:
            raise failures[0]


def example_settings(**overrides) -> dict:
    """A valid settings dict for a chief (unit tests change single keys)."""
    settings = {
        "cluster": "demo",
        "run_id": "20261122-0415-ab12",
        "role": "chief",
        "index": 0,
        "tf_config": {"cluster": {"ps": ["10.0.0.2:2222"], "worker": ["10.0.0.3:2222", "10.0.0.4:2222"],
                                  "chief": ["10.0.0.5:2222"]},
                      "task": {"type": "chief", "index": 0}},
        "model_module": "digits",
        "steps": 300,
        "batch_size": 64,
        "learning_rate": 0.005,
        "checkpoint_every": 100,
        "s3": {"endpoint": "http://10.0.0.1:5000", "region": "us-east-1", "bucket": "tfcluster",
               "run_prefix": "runs/demo/20261122-0415-ab12", "checkpoint_prefix": "runs/demo/checkpoints",
               "dataset_prefix": "datasets/digits"},
        "state_dir": "/opt/tfcluster/state",
        "max_runtime_s": 1800,
    }
    settings.update(overrides)
    if "tf_config" not in overrides:   # only the jobs the strategy has (multi_worker_mirrored: no ps)
        from tfc_harness import strategies

        shape = strategies.shape_for(settings.get("strategy", strategies.DEFAULT_STRATEGY))
        cluster = settings["tf_config"]["cluster"]
        settings["tf_config"]["cluster"] = {job: addrs for job, addrs in cluster.items() if job in shape}
    return settings


def read_scalars(directory: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every scalar summary in the TensorBoard event files under
    ``directory``, in the order written (files by name)."""
    import tensorflow as tf

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(directory).rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                scalars.setdefault(value.tag, []).append((event.step, number))
    return scalars


def s3_scalars(client, bucket: str, run_prefix: str, dest: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """:func:`read_scalars` of the event files a run copied to ``<run_prefix>/tensorboard/`` (downloaded to
    ``dest``); an AssertionError when there are none."""
    from tfc_harness import s3io

    keys = list(s3io.list_keys(client, bucket, f"{run_prefix}/tensorboard"))
    assert keys, f"no TensorBoard events in s3://{bucket}/{run_prefix}/tensorboard/"
    for key in keys:
        s3io.download_file(client, bucket, key, Path(dest) / key.rsplit("/", 1)[-1])
    return read_scalars(dest)
