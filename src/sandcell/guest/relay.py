"""The preview relay: one raw HTTP exchange with a server the session runs on its loopback.

The sandbox has no network the host could reach, so the host hands the kernel the request
bytes over the wire and gets the response bytes back. The host builds the request (with
`Connection: close`) and parses the response; the kernel only moves bytes, bounded in size
and time, in a thread of its own so that it works while a cell runs.
"""

import base64
import socket
import threading
import time
from typing import Any

MAX_RELAYS = 8  # concurrent exchanges; each holds a thread and up to max_bytes of memory
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_BYTES = 10 << 20
slots = threading.BoundedSemaphore(MAX_RELAYS)


def relay(request: dict[str, Any]) -> dict[str, Any]:
    """Answer an `http` request: {"port", "request" (base64), "timeout_s", "max_bytes"}."""
    try:
        port = int(request["port"])
        raw = base64.b64decode(request["request"], validate=True)
        timeout_s = float(request.get("timeout_s", DEFAULT_TIMEOUT_S))
        max_bytes = int(request.get("max_bytes", DEFAULT_MAX_BYTES))
    except (KeyError, TypeError, ValueError) as exc:
        return {"error": f"bad relay request: {exc}"}
    if not 0 < port < 65536:
        return {"error": f"bad port {port}"}
    if not slots.acquire(blocking=False):
        return {"error": "too many preview requests at once"}
    try:
        return exchange(port, raw, timeout_s, max_bytes)
    finally:
        slots.release()


def exchange(port: int, raw: bytes, timeout_s: float, max_bytes: int) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    received = bytearray()
    complete = False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
            conn.sendall(raw)
            while len(received) <= max_bytes:
                conn.settimeout(max(0.001, deadline - time.monotonic()))
                data = conn.recv(65536)
                if not data:
                    complete = True
                    break
                received += data
    except TimeoutError:
        if not received:
            return {"error": f"no response from port {port} within {timeout_s:g} s"}
    except OSError as exc:
        return {"error": f"port {port}: {exc.strerror or exc}"}
    return {
        "response": base64.b64encode(bytes(received[:max_bytes])).decode(),
        "complete": complete,  # the server closed the connection after its response
        "truncated": len(received) > max_bytes,
    }
