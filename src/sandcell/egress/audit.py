"""One audit event per connection the sandbox opens to the proxy.

Byte counts are measured on the sandbox side of the proxy: everything the sandbox sent
(`bytes_up`) and received (`bytes_down`) on that connection, proxy protocol included; for
intercepted TLS they count the decrypted HTTP bytes. Events carry hosts, ports and reason codes,
never header values, so a secret cannot reach the job record through them.
"""

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

Decision = Literal["allowed", "denied"]

# Reasons on allowed events say how the connection was carried.
MODE_HTTP = "http"  # plain HTTP forwarded request
MODE_TUNNEL = "tunnel"  # CONNECT tunnel, TLS end to end between sandbox and upstream
MODE_INTERCEPT = "tls_intercept"  # CONNECT to a secret host, TLS terminated by the proxy

_MAX_HOST_CHARS = 255


@dataclass(frozen=True)
class EgressEvent:
    host: str  # normalised host, or the sanitised text the sandbox sent if it did not parse
    port: int  # 0 when no port was understood
    decision: Decision
    reason: str
    bytes_up: int
    bytes_down: int
    started_at: float  # Unix time
    duration_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


EventSink = Callable[[EgressEvent], None]


class Counter:
    """Bytes seen on one side of a connection."""

    def __init__(self) -> None:
        self.received = 0
        self.sent = 0


class ConnectionAudit:
    """Collects what happened on one sandbox connection; becomes exactly one `EgressEvent`."""

    def __init__(self, client: Counter) -> None:
        self.client = client
        self.host, self.port = "", 0
        self.decision: Decision = "denied"
        self.reason = "no_request"  # a connection closed before it asked for anything
        self._started_at, self._started = time.time(), time.monotonic()

    def target(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def attempted(self, raw: str) -> None:
        """Record what the sandbox asked for before (or without) it parsing as a host."""
        printable = "".join(c if c.isprintable() and c.isascii() else "?" for c in raw)
        self.host = printable[:_MAX_HOST_CHARS]

    def allow(self, mode: str) -> None:
        self.decision, self.reason = "allowed", mode

    def deny(self, reason: str) -> None:
        self.decision, self.reason = "denied", reason

    def event(self) -> EgressEvent:
        return EgressEvent(
            host=self.host,
            port=self.port,
            decision=self.decision,
            reason=self.reason,
            bytes_up=self.client.received,
            bytes_down=self.client.sent,
            started_at=self._started_at,
            duration_ms=round((time.monotonic() - self._started) * 1000, 3),
        )
