"""``tfcluster tensorboard`` against a bucket holding two runs' event files (written by the chief's own
:class:`tfc_harness.summaries.Summaries`) in a moto S3 server on loopback: it fetches them, serves
TensorBoard on 127.0.0.1, both runs are listed and their scalars read back through TensorBoard's HTTP API,
headless Chromium renders the page with both runs, and Ctrl-C ends it cleanly. An unknown run is refused
with exit status 2, naming the runs there are.

Every process a test starts (moto, tfcluster, Chromium) is ended at its end; everything listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, interruptible
from tests.harness.harness_support import S3_CREDENTIALS, Processes, free_port, node_env, wait_for_port

BUCKET = "tb-runs"
CLUSTER = "tbc"
RUNS = {"20261122-041500-ab12": [0.9, 0.5, 0.25], "20261123-093000-cd34": [0.8, 0.4, 0.2]}
NO_EVENTS_RUN = "20261121-120000-ef56"     # a run folder with a checkpoint only: not a TensorBoard run
SERVE_TIMEOUT_S = 120
URL_LINE = re.compile(r"TensorBoard at (http://127\.0\.0\.1:\d+/) ")
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    procs = Processes(tmp_path_factory.mktemp("procs"))
    try:
        yield procs
    finally:
        procs.kill_all()


@pytest.fixture(scope="module")
def store(processes, tmp_path_factory):
    """A moto S3 server holding two runs' TensorBoard events, each written as the chief writes them; yields
    the ``--set`` options that point tfcluster at it."""
    port = free_port()
    proc = processes.start("moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                           env=node_env())
    wait_for_port(port, 30, proc)
    endpoint = f"http://127.0.0.1:{port}"
    from tfc_harness import s3io
    from tfc_harness.summaries import Summaries

    client = s3io.make_client(endpoint, "us-east-1", credentials=S3_CREDENTIALS)
    client.create_bucket(Bucket=BUCKET)
    work = tmp_path_factory.mktemp("chiefs")
    for run, losses in RUNS.items():
        summaries = Summaries(work / run, lambda: client, BUCKET, f"runs/{CLUSTER}/{run}")
        summaries.watch_learning_rate(lambda: 0.005)
        for step, loss in enumerate(losses, 1):
            summaries.training(step * 10, loss, 1000.0 * step)
        summaries.evaluation(len(losses) * 10, {"test_loss": losses[-1], "test_accuracy": 0.9})
        summaries.upload()
    s3io.upload_bytes(client, b"x", BUCKET, f"runs/{CLUSTER}/{NO_EVENTS_RUN}/checkpoints/ckpt-1.index")
    credentials = work / "s3.env"
    credentials.write_text("".join(f"{k}={v}\n" for k, v in S3_CREDENTIALS.items()))
    credentials.chmod(0o600)
    return ["--cluster", CLUSTER, "--set", f"storage.endpoint={endpoint}", "--set", f"storage.bucket={BUCKET}",
            "--set", f"storage.credentials_file={credentials}"]


def tfcluster_env(tmp_path: Path) -> dict:
    return dict(node_env(), TFCLUSTER_HOME=str(tmp_path / "home"), TFCLUSTER_ARTIFACTS=str(tmp_path / "artifacts"),
                PYTHONPATH=str(REPO / "train"))


class Board:
    """``tfcluster tensorboard`` running in the background: its URL once it printed one, its output."""

    def __init__(self, args: list[str], env: dict, stderr: Path):
        self.stderr = stderr
        with open(stderr, "w") as err:      # a file: TensorBoard's warnings must never fill a pipe
            self.proc = subprocess.Popen([PYTHON, "-m", "tfcluster", "tensorboard", *args], stdout=subprocess.PIPE,
                                         stderr=err, text=True, env=env, cwd=REPO, preexec_fn=interruptible,
                                         start_new_session=True)
        self.lines: list[str] = []
        self.url: str | None = None
        self.printed_url = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            match = URL_LINE.search(line)
            if match:
                self.url = match.group(1)
                self.printed_url.set()

    def get(self, path: str, **query) -> object:
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        with DIRECT.open(url, timeout=10) as response:
            return json.loads(response.read())

    def stop(self) -> tuple[int, str]:
        """Ctrl-C; the exit status and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        return self.proc.returncode, self.stderr.read_text()


@pytest.fixture
def board(store, tmp_path):
    boards: list[Board] = []

    def start(*args: str) -> Board:
        boards.append(Board([*store, *args], tfcluster_env(tmp_path), tmp_path / f"tensorboard-{len(boards)}.err"))
        started = boards[-1]
        if not started.printed_url.wait(SERVE_TIMEOUT_S):
            started.stop()
            raise AssertionError(f"no URL after {SERVE_TIMEOUT_S}s: {''.join(started.lines)}")
        return started

    try:
        yield start
    finally:
        for started in boards:
            started.stop()


def wait_for_runs(board: Board, expected: list[str], timeout_s: float = 60) -> list[str]:
    """TensorBoard loads the log folder in the background: wait until it lists ``expected``."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = board.get("data/runs")
        if sorted(runs) == sorted(expected) or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def test_serves_every_run_of_the_cluster_side_by_side(board, tmp_path):
    served = board("--port", "0")
    assert wait_for_runs(served, list(RUNS)) == sorted(RUNS)
    output = "".join(served.lines)
    assert f"TensorBoard events of 2 run(s) of cluster {CLUSTER} from s3://{BUCKET}/runs/{CLUSTER}/" in output
    tags = served.get("data/plugin/scalars/tags")
    for run, losses in RUNS.items():
        assert set(tags[run]) == {"train/loss", "train/learning_rate", "train/examples_per_sec", "test/loss",
                                  "test/accuracy"}
        points = served.get("data/plugin/scalars/scalars", run=run, tag="train/loss")
        assert [(step, value) for _, step, value in points] == [
            (10 * i, pytest.approx(loss)) for i, loss in enumerate(losses, 1)]
        assert [p[1:] for p in served.get("data/plugin/scalars/scalars", run=run, tag="test/accuracy")] == [
            [30, pytest.approx(0.9)]]
        assert (tmp_path / "artifacts" / CLUSTER / "_tensorboard" / run).is_dir()   # the local copy

    if shutil.which("chromium"):
        dom = headless_dom(served.url, tmp_path)
        assert "TensorBoard" in dom and 'title="train/loss"' in dom and 'title="test/accuracy"' in dom
        for run in RUNS:
            assert run in dom, f"run {run} not on the page"
    status, stderr = served.stop()
    assert status == 0 and "TensorBoard stopped" in stderr and "Traceback" not in stderr, stderr
    # TensorFlow's C++ start lines, which TF_CPP_MIN_LOG_LEVEL does not stop, are held back
    assert "oneDNN custom operations" not in output + stderr and "absl::InitializeLog" not in output + stderr, stderr
    if not shutil.which("chromium"):
        pytest.skip("chromium is not installed, so the page was not loaded (scripts/bootstrap.sh --test, run by "
                    "'make test', installs it)")


def headless_dom(url: str, tmp_path: Path) -> str:
    """The page's DOM once headless Chromium has rendered it (the scalar cards load after the page, and only
    those in the window: a tall one holds them all). Chromium and all its children are ended in any case."""
    command = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-proxy-server",
               f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1400,2400", "--virtual-time-budget=15000",
               "--dump-dom", url]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        dom, stderr = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    assert proc.returncode == 0, stderr[-2000:]
    (tmp_path / "page.html").write_text(dom)      # kept beside the test's other files, to look at
    return dom


def test_one_run_and_a_fixed_port(board, tmp_path):
    port = free_port()
    run = list(RUNS)[1]
    served = board("--run", run, "--port", str(port))
    assert served.url == f"http://127.0.0.1:{port}/"
    assert wait_for_runs(served, [run]) == [run]
    assert served.get("data/plugin/scalars/scalars", run=run, tag="train/learning_rate")[0][2] == pytest.approx(0.005)
    assert served.stop()[0] == 0


def test_an_unknown_run_is_refused_naming_the_runs_there_are(store, tmp_path):
    result = subprocess.run([PYTHON, "-m", "tfcluster", "tensorboard", *store, "--run", "nope"],
                            capture_output=True, text=True, env=tfcluster_env(tmp_path), cwd=REPO, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"tfcluster: error: invalid configuration: run: got 'nope'; allowed: a run with TensorBoard events in "
        f"s3://{BUCKET}/runs/{CLUSTER}/: {', '.join(sorted(RUNS))}")


def test_a_port_in_use_is_named(store, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([PYTHON, "-m", "tfcluster", "tensorboard", *store, "--port", str(port)],
                                capture_output=True, text=True, env=tfcluster_env(tmp_path), cwd=REPO, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"tfcluster: error: TensorBoard could not listen on 127.0.0.1:{port}: " in result.stderr


def test_a_sweeps_trials_are_fetched_and_counted_together(store, tmp_path, monkeypatch):
    """Each trial's events under its group's prefix, linked by trial name; one count for all of them."""
    from tfc_harness import s3io

    from tfcluster import config, tensorboard

    endpoint = next(o.split("=", 1)[1] for o in store if o.startswith("storage.endpoint="))
    spec = config.resolve({"cluster": CLUSTER, "storage": {"bucket": BUCKET}})
    trials = [(CLUSTER, run, f"t0{i}-lr={i}") for i, run in enumerate(RUNS)]
    monkeypatch.setattr(tensorboard, "sweep_runs", lambda *a: trials)
    client = s3io.make_client(endpoint, "us-east-1", credentials=S3_CREDENTIALS)
    names, done, links = tensorboard._fetch_sweep(spec, "sweep.yml", client, tmp_path / "events")
    assert names == ["t00-lr=0", "t01-lr=1"] and done.unchanged == 0 and done.files >= 2, done
    assert re.fullmatch(rf"{done.files} file\(s\) fetched \([0-9.]+ kB\), 0 unchanged", str(done)), str(done)
    assert sorted(p.name for p in links.iterdir()) == names
    assert all(any((links / name).rglob("events.out.tfevents.*")) for name in names)
    _, again, _ = tensorboard._fetch_sweep(spec, "sweep.yml", client, tmp_path / "events")
    assert (again.files, again.unchanged) == (0, done.files), again
