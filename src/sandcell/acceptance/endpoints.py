"""Loopback HTTP endpoints the acceptance test starts itself: it counts what reaches them.

Loopback only: the deployment's egress proxy reaches them when its operator allows loopback
(`SANDCELL_EGRESS_ALLOWED_NETWORKS='["127.0.0.0/8"]'`, `SANDCELL_EGRESS_ANY_PORT=1`), which is
why the test runs on the deployment's host.
"""

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LoopbackEndpoint:
    def __init__(self, address: str) -> None:
        self.address = address
        self.hits: Counter[str] = Counter()
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((address, 0), self._handler())
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://{self.address}:{self.port}{path}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                with endpoint._lock:
                    endpoint.hits[self.path] += 1
                    endpoint.headers.append(dict(self.headers.items()))
                body = b"acceptance endpoint\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
