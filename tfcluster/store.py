"""Object storage: the local S3-compatible store and boto3 clients.

The local store is a ``moto`` server on a host address of its own (``10.231.255.254`` on a port-less bridge ``tfcs3``,
by default) that every local node reaches through its cluster bridge. It is not part of any transient
cluster: ``up`` starts it when it is not running, ``down`` leaves it, ``make clean`` stops it. It keeps
objects in memory only, which is why verified models are also mirrored to ``artifacts/``.

Credentials for it are generated once into a 0600 file and passed to processes through the environment,
never on a command line or into a rendered file.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from .errors import TfclusterError
from .paths import state_root
from .poll import owned_pid, port_open, wait_until

STORE_IFACE = "tfcs3"


def store_addr() -> tuple[str, int]:
    ip = os.environ.get("TFCLUSTER_STORE_IP", "10.231.255.254")
    port = int(os.environ.get("TFCLUSTER_STORE_PORT", "9555"))
    return ip, port


def store_dir() -> Path:
    # cluster names start with a letter, so "_store" never clashes with a cluster's state
    return state_root() / "_store"


def pid_file() -> Path:
    """The pid of the store this state root started on the configured port (one a port: a checkout may run
    stores on several, as its tests do)."""
    return store_dir() / f"store-{store_addr()[1]}.pid"


def local_endpoint() -> str:
    ip, port = store_addr()
    return f"http://{ip}:{port}"


def credentials_path() -> Path:
    """The local store's keys in this state root (made by :func:`credentials` when first needed: the first
    ``up``, ``tfcluster store start``, or a check of the data's files)."""
    return store_dir() / "credentials.env"


def credentials() -> dict[str, str]:
    """The local store's key pair, created once (0600)."""
    path = credentials_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # written whole under a name of its own, then linked into place: a process making them at the same
        # moment (validate, plan, up and `store start` may) finds either no file or the complete one
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"AWS_ACCESS_KEY_ID=tfc{secrets.token_hex(8)}\n"
                    f"AWS_SECRET_ACCESS_KEY={secrets.token_urlsafe(30)}\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass            # the other process's keys: those
        finally:
            tmp.unlink()
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:   # someone widened it: the keys may have been read; refuse rather than go on using them
        raise TfclusterError(f"{path} holds the local store's keys but other users may read it (mode {oct(mode)}): "
                             f"chmod 600 it (or remove it, with the store stopped, for new keys)")
    return read_env_file(path)


def _ensure_address(ip: str) -> None:
    if subprocess.run(["ip", "link", "show", STORE_IFACE], capture_output=True).returncode != 0:
        added = subprocess.run(["ip", "link", "add", STORE_IFACE, "type", "bridge"], capture_output=True, text=True)
        # another store starting at the same moment (one on another port) may have added it first
        if added.returncode != 0 and subprocess.run(["ip", "link", "show", STORE_IFACE],
                                                    capture_output=True).returncode != 0:
            raise TfclusterError(f"could not add the local store's interface {STORE_IFACE}: {added.stderr.strip()}")
    subprocess.run(["ip", "addr", "replace", f"{ip}/32", "dev", STORE_IFACE], check=True, capture_output=True)
    subprocess.run(["ip", "link", "set", STORE_IFACE, "up"], check=True, capture_output=True)


def _address_present(ip: str) -> bool:
    """Whether this host holds the store's address: probing it otherwise would leave the machine."""
    if ip.startswith("127."):
        return True
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", STORE_IFACE], capture_output=True, text=True)
    return f" {ip}/" in out.stdout


def is_running() -> bool:
    ip, port = store_addr()
    return _address_present(ip) and port_open(ip, port)


def start(log=print) -> Callable[[], str] | None:
    """Start the local store unless it answers already (None), without waiting for it to answer: returns the
    wait, which returns the store's endpoint once it answers, or raises naming its log. ``up`` provisions the
    nodes meanwhile (the server's start is ~1 s of a core importing moto, beside Terraform's work)."""
    ip, port = store_addr()
    if ip != "127.0.0.1":
        _ensure_address(ip)
    if port_open(ip, port):
        return None
    d = store_dir()
    d.mkdir(parents=True, exist_ok=True)
    log(f"starting the local S3 store (moto) at {local_endpoint()}")
    with open(d / "store.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", ip, "-p", str(port)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                close_fds=True)
    pid_file().write_text(f"{proc.pid}\n")

    def answering() -> str:
        if wait_until(lambda: port_open(ip, port), 30, 0.1, give_up=lambda: proc.poll() is not None):
            return local_endpoint()
        if proc.poll() is not None:
            raise TfclusterError(f"the local S3 store exited (code {proc.returncode}); see {d / 'store.log'}")
        raise TfclusterError(f"the local S3 store did not answer at {local_endpoint()} within 30 s")

    return answering


def ensure_running(log=print) -> str:
    """Start the local store unless it answers already; return its endpoint once it answers."""
    starting = start(log)
    return starting() if starting else local_endpoint()


def stop(log=print) -> None:
    """Stop the local store (its objects are gone with it) and remove its address."""
    ip, port = store_addr()
    for path in (pid_file(), store_dir() / "store.pid"):    # the second: as checkouts up to 2e704d5 named it
        if not path.exists():
            continue
        # only if it is still our moto server on this address
        pid = owned_pid(path, f"moto.server\0-H\0{ip}\0-p\0{port}\0".encode())
        if pid:
            try:
                os.killpg(pid, signal.SIGTERM)
                log(f"stopped the local S3 store (pid {pid})")
            except (ProcessLookupError, PermissionError):
                pass
            wait_until(lambda: not is_running(), 5, 0.1)
            path.unlink()
        elif path == pid_file():
            path.unlink()           # its process is gone
    others = subprocess.run(["ss", "-Hltn", "src", ip], capture_output=True, text=True).stdout.strip()
    if not others and subprocess.run(["ip", "link", "show", STORE_IFACE], capture_output=True).returncode == 0:
        subprocess.run(["ip", "link", "del", STORE_IFACE], capture_output=True)  # no other store uses it


def endpoint_for(spec) -> str | None:
    """The S3 endpoint of a run: unless one is configured, the local store for local nodes, else AWS S3."""
    value = spec.storage.endpoint
    if value != "auto":
        return value
    return None if spec.uses_cloud_nodes else local_endpoint()


def is_local_store(spec) -> bool:
    """True when the run's storage is the local store. It is a moto server, which reads a whole object to
    serve any byte range of it: its clients get each object in one GET (``tfc_harness.s3io.WHOLE_OBJECT_CONFIG``)."""
    return endpoint_for(spec) == local_endpoint()


def process_env(spec) -> dict[str, str]:
    """Environment for processes that talk to the run's S3 (credentials only for the local store)."""
    from urllib.parse import urlsplit

    env = {"AWS_DEFAULT_REGION": spec.storage.region}
    endpoint = endpoint_for(spec)
    if spec.storage.credentials_file:  # a site's S3-compatible store: the user's keys
        env.update(read_env_file(Path(spec.storage.credentials_file)))
    elif endpoint and urlsplit(endpoint).hostname == store_addr()[0]:  # the local store, or a proxy beside it
        env.update(credentials())
    return env


def read_env_file(path: Path) -> dict[str, str]:
    """AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from a KEY=VALUE file (other lines ignored)."""
    out = {}
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TfclusterError(f"cannot read the S3 credentials file {path}: {exc.strerror}") from None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            out[key.strip()] = value.strip()
    if len(out) != 2:
        raise TfclusterError(f"the S3 credentials file {path} needs AWS_ACCESS_KEY_ID= and "
                             "AWS_SECRET_ACCESS_KEY= lines")
    return out


def client(spec):
    """The S3 client of the run's storage (credentials from the user's file or the local store): the
    harness's own factory, so controller and nodes talk to the store alike."""
    from tfc_harness import s3io

    env = process_env(spec)
    return s3io.make_client(endpoint_for(spec), env["AWS_DEFAULT_REGION"], credentials=env,
                            whole_objects=is_local_store(spec))


def ensure_bucket(s3, bucket: str, region: str) -> None:
    """Create the bucket unless it exists (a 404 on HEAD); any other answer is an error naming it."""
    from botocore.exceptions import ClientError
    from tfc_harness import s3io

    def head() -> bool:
        try:
            s3.head_bucket(Bucket=bucket)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in ("404", "NoSuchBucket", "NotFound"):
                return False
            raise

    try:
        if s3io.with_retries(head, f"look up bucket {bucket}"):
            return
        args = {"Bucket": bucket}
        if region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": region}
        s3io.with_retries(lambda: s3.create_bucket(**args), f"create bucket {bucket}")
    except s3io.TransferError as exc:
        raise TfclusterError(f"bucket {bucket}: {exc.__cause__ or exc}") from None
