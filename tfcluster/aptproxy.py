"""The local cluster's apt proxy: what a cloud VM downloads from Debian's archive, served on the bridge.

Local nodes have no route beyond their bridge, like an air-gapped site. Their image points apt at this
proxy (``Acquire::http::Proxy``, as cloud-init's ``apt: proxy`` does), so the roles run the same
``apt-get update`` and installs they run on a cloud VM. The proxy:

- listens on the cluster bridge's address, bound to the bridge device (a connection that arrives on any
  other interface is not accepted) and answers only clients of the cluster's subnet; it lives as long as
  the cluster (``terraform/local`` starts it with the bridge and stops it before the bridge goes);
- forwards plain-HTTP GET requests for the Debian archive hosts only (anything else: 403; no CONNECT),
  so a node reaches nothing beyond the bridge but Debian packages;
- keeps what it fetched in a cache shared by every cluster (``<cache>/_aptcache``): package files and
  by-hash indexes never change under their names and are served from the cache; release files are
  fetched again each time and served from the cache only when the archive does not answer.

Called as ``python -m tfcluster.aptproxy {start,stop,serve} JSON`` (JSON: listen_ip, port, bridge, clients
(a CIDR), cache_dir, state_dir, allowed_hosts).
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from .poll import owned_pid, port_open, terminate, wait_until

PORT = 3142
ALLOWED_HOSTS = ("deb.debian.org",)
CHUNK = 1 << 16
UPSTREAM_TIMEOUT = 60


def cache_path(cache_dir: Path, url: str) -> Path | None:
    """Where a URL is cached, or None for a URL that must not become a path."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if not segments or any(s in (".", "..") or "\0" in s for s in segments) or parts.query:
        return None
    return cache_dir.joinpath(parts.hostname or "_", *segments)


def immutable(url: str) -> bool:
    """Files that never change under their name: packages (pool/) and indexes fetched by hash."""
    path = urlsplit(url).path
    return "/pool/" in path or "/by-hash/" in path


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # apt keeps its connection and pipelines requests
    server_version = "tfcluster-aptproxy"
    cache_dir: Path
    allowed: tuple[str, ...]
    clients: ipaddress.IPv4Network | ipaddress.IPv6Network
    log_lock = threading.Lock()

    def _client_allowed(self) -> bool:
        if ipaddress.ip_address(self.client_address[0]) in self.clients:
            return True
        self.close_connection = True
        self._plain(403, "tfcluster apt proxy: this proxy serves its cluster's nodes only")
        return False

    def log_message(self, fmt, *args):  # one line per request, in the proxy's own log
        with self.log_lock:
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.client_address[0]} {fmt % args}\n")

    def _plain(self, code: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_CONNECT(self):  # noqa: N802  no tunnels: nodes reach nothing but the archive
        if not self._client_allowed():
            return
        self.close_connection = True
        self._plain(403, "tfcluster apt proxy: CONNECT is not allowed")

    def do_HEAD(self):  # noqa: N802
        self.do_GET()

    def do_GET(self):  # noqa: N802
        if not self._client_allowed():
            return
        url = self.path
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname not in self.allowed:
            self._plain(403, f"tfcluster apt proxy: only http://{{{','.join(self.allowed)}}}/ is served, "
                             f"not {url[:200]}")
            return
        path = cache_path(self.cache_dir, url)
        if path is None:
            self._plain(400, "tfcluster apt proxy: bad path")
            return
        if immutable(url) and path.is_file():
            self._send_file(path, "hit")
            return
        try:
            self._fetch(url, path)
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            code = getattr(exc, "code", None)
            if code == 404:
                self._plain(404, f"not found upstream: {url}")
            elif path.is_file():
                self._send_file(path, f"stale ({exc})")  # the archive is unreachable: last known copy
            else:
                self._plain(502, f"tfcluster apt proxy: upstream failed: {exc}")

    def _send_file(self, path: Path, how: str) -> None:
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.send_header("X-Cache", how)
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(path, "rb") as f:
            shutil.copyfileobj(f, self.wfile, CHUNK)

    def _fetch(self, url: str, path: Path) -> None:
        """Stream the upstream answer to the node and into the cache (renamed into place when whole)."""
        request = urllib.request.Request(url, headers={"User-Agent": "tfcluster-aptproxy"})
        with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT) as up:
            length = up.headers.get("Content-Length")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
            self.send_response(200)
            if length:
                self.send_header("Content-Length", length)
            else:
                self.close_connection = True
            self.send_header("X-Cache", "miss")
            self.end_headers()
            got = 0
            try:
                with open(tmp, "wb") as out:
                    while chunk := up.read(CHUNK):
                        out.write(chunk)
                        got += len(chunk)
                        if self.command != "HEAD":
                            self.wfile.write(chunk)
                if length is None or got == int(length):
                    tmp.replace(path)
            except (OSError, TimeoutError) as exc:  # the answer has begun: all that is left is to hang up
                self.close_connection = True
                self.log_message("%s broken after %d bytes: %s", url, got, exc)
            finally:
                tmp.unlink(missing_ok=True)


class BridgeServer(http.server.ThreadingHTTPServer):
    """A server whose socket takes connections from one network device only (SO_BINDTODEVICE)."""

    daemon_threads = True
    device = ""

    def server_bind(self):
        if self.device:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.device.encode())
        super().server_bind()


def make_server(p: dict) -> BridgeServer:
    cache_dir = Path(p["cache_dir"])
    cache_dir.mkdir(parents=True, exist_ok=True)
    handler = type("Handler", (ProxyHandler,), {
        "cache_dir": cache_dir, "allowed": tuple(p.get("allowed_hosts") or ALLOWED_HOSTS),
        "clients": ipaddress.ip_network(p["clients"], strict=False)})
    server_class = type("Server", (BridgeServer,), {"device": p.get("bridge", "")})
    return server_class((p["listen_ip"], int(p.get("port", PORT))), handler)


def serve(p: dict) -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})   # start() held them
    server = make_server(p)
    cache_dir = server.RequestHandlerClass.cache_dir
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    sys.stderr.write(f"apt proxy on {p['listen_ip']}:{p.get('port', PORT)} (device {p.get('bridge') or 'any'}, "
                     f"clients {p['clients']}), cache {cache_dir}\n")
    sys.stderr.flush()
    server.serve_forever()
    server.server_close()


# -- the daemon, for terraform/local ---------------------------------------------------------------
def _pid_file(p: dict) -> Path:
    return Path(p["state_dir"]) / "aptproxy.pid"


def running_pid(state_dir: Path) -> int | None:
    """The proxy's pid when it runs for the cluster whose state is in state_dir: the pid file's, or a proxy
    whose arguments name that state directory (one whose starter was killed before it wrote the file)."""
    pid = owned_pid(state_dir / "aptproxy.pid", b"tfcluster.aptproxy")
    if pid:
        return pid
    mine = f'"state_dir": {json.dumps(str(state_dir))}'.encode()
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        if args[1:4] == [b"-m", b"tfcluster.aptproxy", b"serve"] and len(args) > 4 and mine in args[4]:
            return int(proc.name)
    return None


def _holder(ip: str, port: int) -> str:
    """Who listens on ip:port (ss's words), for an error message."""
    out = subprocess.run(["ss", "-Hltnp", "src", f"{ip}:{port}"], capture_output=True, text=True).stdout.strip()
    return out.split("users:", 1)[-1] if out else "an unknown process"


def start(p: dict) -> None:
    ip, port = p["listen_ip"], int(p.get("port", PORT))
    if running_pid(Path(p["state_dir"])) and port_open(ip, port):
        print(f"apt proxy: already running on {ip}:{port}")
        return
    if port_open(ip, port):  # not ours: another state directory's cluster of the same name and subnet
        raise SystemExit(f"tfcluster.aptproxy: {ip}:{port} is already taken by {_holder(ip, port)}; a cluster "
                         f"with this subnet is up from another state directory (make down there first)")
    logs = Path(p["state_dir"]) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # the proxy runs in a session of its own, out of reach of a Ctrl-C: its pid file is written before one
    # can stop this starter (a proxy without one is still found by its arguments: running_pid)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        with open(logs / "aptproxy.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tfcluster.aptproxy", "serve", json.dumps(p)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                    close_fds=True, cwd="/")
        _pid_file(p).write_text(f"{proc.pid}\n")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    if wait_until(lambda: port_open(ip, port), 10, 0.05, give_up=lambda: proc.poll() is not None):
        print(f"apt proxy: serving the Debian archive on {ip}:{port} (cache {p['cache_dir']})")
        return
    if proc.poll() is not None:
        tail = (logs / "aptproxy.log").read_text(errors="replace")[-1500:]
        raise SystemExit(f"tfcluster.aptproxy: the proxy exited at start (code {proc.returncode}):\n{tail}")
    proc.kill()
    raise SystemExit(f"tfcluster.aptproxy: no answer on {ip}:{port} within 10s")


def stop(p: dict) -> None:
    state_dir = Path(p["state_dir"])
    pid = running_pid(state_dir)
    # SIGKILL after 5 s; through a pidfd: never a process that took the pid of a proxy which exited meanwhile
    if pid and terminate(pid, 5, lambda: running_pid(state_dir) == pid):
        print(f"apt proxy: stopped (pid {pid})")
    _pid_file(p).unlink(missing_ok=True)


ACTIONS = {"start": start, "stop": stop, "serve": serve}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ACTIONS:
        print(f"usage: python -m tfcluster.aptproxy {{{','.join(ACTIONS)}}} JSON", file=sys.stderr)
        return 2
    ACTIONS[argv[0]](json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
