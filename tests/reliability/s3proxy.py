"""A fault-injecting HTTP proxy in front of the local S3 store (tests only).

It listens on the store's own address (reachable from local nodes) and forwards to the store, failing a
share of requests with S3's 503 SlowDown and delaying others; `fail_all` makes every request fail.
Deterministic (seeded) and bounded: it serves only while its `with` block runs.
"""

from __future__ import annotations

import http.client
import http.server
import random
import threading
import time

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>injected fault</Message></Error>")


class FaultProxy:
    def __init__(self, host: str, upstream: tuple[str, int], fail_rate: float = 0.0, delay_rate: float = 0.0,
                 delay_s: float = 0.3, seed: int = 7, fail_all_from: str = ""):
        self.upstream = upstream
        self.fail_rate, self.delay_rate, self.delay_s = fail_rate, delay_rate, delay_s
        self.fail_all = False
        #: from the first request whose path holds this text on (that one included), fail every request
        self.fail_all_from = fail_all_from
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"forwarded": 0, "failed": 0, "delayed": 0}
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    roll, roll2 = proxy.rng.random(), proxy.rng.random()
                    if proxy.fail_all_from and proxy.fail_all_from in self.path:
                        proxy.fail_all = True
                if proxy.fail_all or roll < proxy.fail_rate:
                    with proxy.lock:
                        proxy.counts["failed"] += 1
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                if roll2 < proxy.delay_rate:
                    with proxy.lock:
                        proxy.counts["delayed"] += 1
                    time.sleep(proxy.delay_s)
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()
                with proxy.lock:
                    proxy.counts["forwarded"] += 1

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
