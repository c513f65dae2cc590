"""Helpers for the harness tests: paths, entry-script rendering, free ports, node processes.

Everything listens on 127.0.0.1 only; :class:`Processes` kills every process it started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN_DIR = REPO / "train"
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


class Processes:
    """Starts processes with their output in a log file and kills every one of them at the end."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(self, name: str, cmd: list[str], env: dict | None = None, cwd: str | None = None):
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    start_new_session=True)
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
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)

    def kill_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)


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
