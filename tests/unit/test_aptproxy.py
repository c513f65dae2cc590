"""The local nodes' apt proxy against a stand-in archive on loopback: caching, freshness, refusals."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.harness.harness_support import free_port
from tfcluster import aptproxy
from tfcluster.poll import wait_until


class Archive(http.server.BaseHTTPRequestHandler):
    """A tiny stand-in for the Debian archive that counts requests per path."""

    files: dict[str, bytes] = {}
    hits: dict[str, int] = {}
    down = False

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802
        Archive.hits[self.path] = Archive.hits.get(self.path, 0) + 1
        if Archive.down:
            self.send_error(503)
            return
        body = Archive.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(server):
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


@pytest.fixture
def setup(tmp_path: Path):
    Archive.files = {"/debian/pool/main/h/hello/hello_1.deb": b"package-bytes" * 1000,
                     "/debian/dists/bookworm/InRelease": b"release-1"}
    Archive.hits, Archive.down = {}, False
    archive = _serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Archive))
    proxy = _serve(aptproxy.make_server({"listen_ip": "127.0.0.1", "port": 0, "clients": "127.0.0.0/8",
                                         "cache_dir": str(tmp_path / "cache"), "allowed_hosts": ["127.0.0.1"]}))
    base = f"http://127.0.0.1:{archive.server_address[1]}"
    yield base, proxy.server_address[1], tmp_path / "cache"
    for server in (proxy, archive):
        server.shutdown()
        server.server_close()


def get(port: int, url: str, method: str = "GET") -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, url)
        res = conn.getresponse()
        return res.status, res.read(), res.getheader("X-Cache") or ""
    finally:
        conn.close()


def test_packages_are_fetched_once_then_served_from_the_cache(setup):
    base, port, cache = setup
    url = f"{base}/debian/pool/main/h/hello/hello_1.deb"
    cached = cache / "127.0.0.1" / "debian" / "pool" / "main" / "h" / "hello" / "hello_1.deb"
    assert get(port, url) == (200, Archive.files["/debian/pool/main/h/hello/hello_1.deb"], "miss")
    # the proxy renames the file into the cache once the answer is sent: a request in between fetches again
    assert wait_until(cached.is_file, 5, 0.01)
    assert get(port, url) == (200, Archive.files["/debian/pool/main/h/hello/hello_1.deb"], "hit")
    assert Archive.hits["/debian/pool/main/h/hello/hello_1.deb"] == 1


def test_release_files_are_fetched_fresh_and_the_cached_copy_serves_when_the_archive_fails(setup):
    base, port, _ = setup
    url = f"{base}/debian/dists/bookworm/InRelease"
    assert get(port, url)[:2] == (200, b"release-1")
    Archive.files["/debian/dists/bookworm/InRelease"] = b"release-2"
    assert get(port, url)[:2] == (200, b"release-2")          # not a stale cached copy
    assert Archive.hits["/debian/dists/bookworm/InRelease"] == 2
    Archive.down = True
    status, body, how = get(port, url)
    assert (status, body) == (200, b"release-2") and how.startswith("stale")


def test_missing_upstream_file_is_404_and_nothing_is_cached(setup):
    base, port, cache = setup
    assert get(port, f"{base}/debian/dists/bookworm/main/i18n/Translation-xx")[0] == 404
    assert not (cache / "127.0.0.1" / "debian" / "dists" / "bookworm" / "main").exists()


def test_only_the_archive_hosts_are_served(setup):
    _, port, _ = setup
    status, body, _ = get(port, "http://example.org/debian/dists/bookworm/InRelease")
    assert status == 403 and b"only http://{127.0.0.1}/" in body
    assert get(port, "https://127.0.0.1/x")[0] == 403
    assert get(port, "example.org:443", method="CONNECT")[0] == 403


def test_paths_that_would_escape_the_cache_are_refused(setup):
    base, port, _ = setup
    assert get(port, f"{base}/debian/../../etc/passwd")[0] == 400
    assert get(port, f"{base}/debian/pool/x.deb?a=b")[0] == 400


def test_clients_outside_the_cluster_subnet_are_refused(tmp_path):
    proxy = _serve(aptproxy.make_server({"listen_ip": "127.0.0.1", "port": 0, "clients": "10.231.7.0/24",
                                         "cache_dir": str(tmp_path / "c"), "allowed_hosts": ["127.0.0.1"]}))
    try:
        status, body, _ = get(proxy.server_address[1], "http://127.0.0.1/debian/dists/bookworm/InRelease")
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert status == 403 and b"its cluster's nodes only" in body


def test_cache_path_rejects_dot_segments(tmp_path):
    assert aptproxy.cache_path(tmp_path, "http://h/a/../b") is None
    assert aptproxy.cache_path(tmp_path, "http://h/a/b") == tmp_path / "h" / "a" / "b"
    assert aptproxy.immutable("http://h/debian/pool/main/p.deb")
    assert aptproxy.immutable("http://h/debian/dists/bookworm/main/binary-amd64/by-hash/SHA256/ab")
    assert not aptproxy.immutable("http://h/debian/dists/bookworm/InRelease")


def test_a_proxy_whose_pid_file_is_missing_is_still_found_and_stopped(tmp_path):
    """The daemon as terraform/local starts it; a starter killed before it wrote the pid file left a proxy
    that `down` must still find (by its arguments) and stop with SIGTERM, which the proxy does not block."""
    state = tmp_path / "state"
    state.mkdir()
    p = {"listen_ip": "127.0.0.1", "port": free_port(), "clients": "127.0.0.0/8", "cache_dir": str(tmp_path / "c"),
         "state_dir": str(state), "allowed_hosts": ["127.0.0.1"]}
    res = subprocess.run([sys.executable, "-m", "tfcluster.aptproxy", "start", json.dumps(p)], capture_output=True,
                         text=True, timeout=30)
    pid = aptproxy.running_pid(state)
    try:
        assert res.returncode == 0 and pid, res.stdout + res.stderr
        (state / "aptproxy.pid").unlink()
        assert aptproxy.running_pid(state) == pid
        assert aptproxy.running_pid(tmp_path) is None          # another state directory's proxy is not this one
        blocked = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if line.startswith("SigBlk:")), 16)
        assert not blocked & (1 << (signal.SIGTERM - 1) | 1 << (signal.SIGINT - 1)), hex(blocked)
        aptproxy.stop(p)
        assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), 5, 0.05)
        assert aptproxy.running_pid(state) is None
    finally:
        if pid and Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
