"""A stand-in for AWS's instance metadata service (IMDSv2), to inject a spot interruption notice the way a
node's supervisor reads it on EC2."""

from __future__ import annotations

import http.server
import threading


class FakeImds:
    """AWS's instance metadata (IMDSv2): a token, then 404 until a spot interruption is set (``action``), for
    every client or, with ``only``, for the clients at those addresses (one VM's notice)."""

    def __init__(self, host: str = "127.0.0.1"):
        imds = self
        self.action, self.requests, self.only = None, [], None

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                imds.requests.append(("PUT", self.path))
                self._send(200, "tok3n" if self.path == "/latest/api/token" else "")

            def do_GET(self):
                imds.requests.append(("GET", self.path, self.headers.get("X-aws-ec2-metadata-token")))
                ok = self.path == "/latest/meta-data/spot/instance-action" and imds.action and \
                    self.headers.get("X-aws-ec2-metadata-token") == "tok3n" and \
                    (imds.only is None or self.client_address[0] in imds.only)
                self._send(200 if ok else 404, imds.action if ok else "")

            def _send(self, code, body):
                self.send_response(code)
                self.end_headers()
                self.wfile.write(body.encode())

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
