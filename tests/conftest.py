"""Shared fixtures: the repository, a private state root, and the controller's python."""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# Every test's state root is its own, but the images, the apt cache and the wheelhouse are the machine's
# cache (tfcluster.paths.cache_root), built once as on a user's machine: a fresh clone bakes nothing another
# checkout baked.


#: a subnet nothing routes here (auto subnets are 10.231.<k>.0/24): for tests that validate a configuration
#: without bringing it up, which the local provider refuses while another cluster is on its subnet (the
#: default cluster's auto subnet is a developer's own cluster's, if one is up)
QUIET_SUBNET = "10.230.7.0/24"


def run_cli(*args: str, home: Path, env: dict | None = None, timeout: int = 600,
            cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run ``python -m tfcluster ARGS`` with state under ``home``."""
    full_env = dict(os.environ, TFCLUSTER_HOME=str(home), PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([PYTHON, "-m", "tfcluster", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)


@pytest.fixture
def plan_tmp(tmp_path_factory) -> Path:
    """A TMPDIR of the test's own for `tfcluster plan` (pass it as ``env={"TMPDIR": ...}``): plan works in a
    temporary directory and removes it, which a test can check only where no other test's plan runs."""
    return tmp_path_factory.mktemp("plantmp")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A state root deeper than a Unix socket path may be long (107 bytes), as a user's may be: nothing
    that tfcluster puts under it may be a socket."""
    h = tmp_path / ("state-" + "deep" * 20)
    h.mkdir()
    assert len(str(h)) > 108
    return h


def interruptible() -> None:
    """preexec_fn for a child a test will Ctrl-C: a job started in the background (`make test &`, nohup,
    some CI runners) inherits SIGINT ignored, and the child would never see the interrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def needs_root():
    return pytest.mark.skipif(os.geteuid() != 0, reason="the local provider needs root (namespaces)")


#: the first port of the tests' local S3 stores: each pytest-xdist worker (gw0, gw1, ...) has its own,
#: this port plus its number; a session without workers uses this one
STORE_PORT = 9556


def worker_number() -> int:
    """This pytest-xdist worker's number (0 without xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


@pytest.fixture(scope="session", autouse=True)
def test_store(tmp_path_factory):
    """The tests' own local S3 store on a port of their own, stopped when the session ends: each xdist
    worker's on its own port, the first port plus the worker's number (a worker that ends first must not stop
    a store another still uses). Two test sessions at once (a developer's and a helper's) must not share
    one: give each its own first port in TFCLUSTER_STORE_PORT (default 9556), ports apart by more than the
    number of workers."""
    os.environ["TFCLUSTER_STORE_PORT"] = str(int(os.environ.get("TFCLUSTER_STORE_PORT", STORE_PORT))
                                             + worker_number())
    if os.geteuid() != 0:
        yield
        return
    from tfcluster import store

    home = tmp_path_factory.mktemp("store-home")
    saved = os.environ.get("TFCLUSTER_HOME")
    os.environ["TFCLUSTER_HOME"] = str(home)
    try:
        started_here = not store.is_running()
        store.ensure_running(log=lambda msg: None)
    finally:
        _restore("TFCLUSTER_HOME", saved)
    yield
    if started_here:
        os.environ["TFCLUSTER_HOME"] = str(home)
        try:
            store.stop(log=lambda msg: None)
        finally:
            _restore("TFCLUSTER_HOME", saved)


@pytest.fixture(scope="session", autouse=True)
def test_artifacts(tmp_path_factory):
    """Verified models' local copies in a directory of the session's, not the checkout's ``artifacts/``, for a
    test that does not name its own (TFCLUSTER_ARTIFACTS): a CI simulation found the streaming e2e's there."""
    saved = os.environ.get("TFCLUSTER_ARTIFACTS")
    if saved is None:
        os.environ["TFCLUSTER_ARTIFACTS"] = str(tmp_path_factory.mktemp("artifacts-default"))
    yield
    _restore("TFCLUSTER_ARTIFACTS", saved)


@pytest.fixture(scope="session", autouse=True)
def autograph_files():
    """Remove the files AutoGraph wrote for the functions this test process converted when the session ends.
    TensorFlow removes them only at the interpreter's exit (atexit), which a pytest-xdist worker can skip:
    a CI simulation found 17 of them in /tmp after a green run. TensorFlow never removes their bytecode
    (``/tmp/__pycache__``)."""
    yield
    caches = set()
    for name, module in list(sys.modules.items()):
        if name.startswith("__autograph_generated_file") and getattr(module, "__file__", None):
            Path(module.__file__).unlink(missing_ok=True)
            # and its bytecode, which the import wrote beside it unless PYTHONDONTWRITEBYTECODE is set
            cached = Path(importlib.util.cache_from_source(module.__file__))
            cached.unlink(missing_ok=True)
            caches.add(cached.parent)
    for cache in caches:     # the __pycache__ directory the import made, once empty (another worker's may not be)
        try:
            cache.rmdir()
        except OSError:
            pass


#: the builder node of the tests' image: a cluster name and a subnet of its own (outside the other tests' networks)
IMAGE_CLUSTER = "tfct-image"
IMAGE_SUBNET = "10.231.249.0/24"
#: the tests whose local clusters mount the baked image (a module marked bare_image keeps the bare base image:
#: test_base_image, the cloud-like path). tests/harness's end-to-end tests run their tasks as processes on
#: loopback with the controller's TensorFlow, on no node: they need no image.
IMAGED = ("tests/integration/", "tests/e2e/", "tests/reliability/")


@pytest.fixture(scope="session")
def node_image() -> dict | None:
    """The node image (tfcluster.baked) every imaged cluster test's nodes mount: baked once per content key in
    the shared cache, so only a session after a change to the roles, locks or versions bakes it (one builder
    node), and every cluster after it only checks in configure."""
    if os.geteuid() != 0:
        return None
    from tfcluster import baked
    from tfcluster.config import resolve

    spec = resolve({}, {"cluster": IMAGE_CLUSTER, "network.subnet": IMAGE_SUBNET})
    return baked.ensure_local(spec, log=lambda msg: print(msg, flush=True))


def pytest_collection_modifyitems(config, items):
    """Cluster tests get the node image first (a session fixture), unless marked ``bare_image``. The slow
    files come first (``e2e``, then ``integration``, then the rest; `make test` keeps this order with
    ``--no-loadscope-reorder``): the workers each take a whole file at a time (``--dist loadfile``), and
    the quick files fill in at the end instead of one long file running alone. IM's end-to-end goes second:
    its nodes need no node image, so where the image must be baked (a new machine, or a changed content key)
    the second worker runs it while the first bakes, instead of waiting for the bake (~2 min). The AWS files
    follow it on that worker (:data:`WAITING`), beside the first worker's second file (an e2e: several
    processes training), with the 2 workers `make test` starts (see the comment below for what that takes)."""
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(REPO).as_posix()
        if rel.startswith(IMAGED) and not item.get_closest_marker("bare_image"):
            item.fixturenames.insert(0, "node_image")
    items.sort(key=_tier)   # stable: a file's tests stay together and in order
    im = [item for item in items if Path(str(item.fspath)).resolve() == IM_E2E]
    waiting = [item for item in items if Path(str(item.fspath)).resolve() in WAITING]
    if im:
        rest = [item for item in items if item not in im and item not in waiting]
        # xdist (3.8, loadfile) hands each of 2 workers two files at its start: the first to be ready gets first
        # and second, the other IM's e2e and the first waiting file; the next goes to the worker that asks first.
        # It gives a worker its second file only while at most 2 of its tests are pending: this holds while the
        # first file and IM's e2e have 1 test each (more, and the second and waiting files go to whichever
        # worker drains first). With 3 workers the third gets the second file, and the waiting files the first
        # two workers, beside the e2e of the third
        first = _first_file(rest)
        second = _first_file(rest[len(first):])
        items[:] = first + im + second + waiting + rest[len(first) + len(second):]


def _first_file(items: list) -> list:
    return list(itertools.takewhile(lambda item: item.fspath == items[0].fspath, items)) if items else []


#: IM's end-to-end: a long file whose nodes need no node image
IM_E2E = REPO / "tests" / "im" / "test_im_e2e.py"
#: files that mostly wait, not compute: Terraform's AWS provider polls moto every 10 s for each VPC, subnet and
#: instance it creates or destroys (tests/cloud/test_aws.py's up and down: ~45 s of its ~60 s). Their CPU use
#: is low, so they run beside the e2e files, whose tasks can use every core, not beside other waiting or
#: one-process files (a CI-like run of c014a64: test_aws.py's 94 s beside tests/harness' unit files, the
#: machine 41-46 % busy)
WAITING = (REPO / "tests" / "cloud" / "test_aws.py", REPO / "tests" / "cloud" / "test_aws_image.py")


def _tier(item) -> int:
    for tier, marker in enumerate(("e2e", "integration")):
        if item.get_closest_marker(marker):
            return tier
    return 2


def _restore(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
