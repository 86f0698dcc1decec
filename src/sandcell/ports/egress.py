"""The egress port: a per-job path from a sandbox to the trusted proxy, and what it saw.

A sandbox has no network of its own. When a job may reach hosts, the worker opens an egress
session; the runtime exposes the session's unix socket inside the sandbox (bridged to a
loopback port there) and the job's CA bundle, and nothing else.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

PROXY_PORT = 3128  # the loopback port the sandbox's HTTP(S)_PROXY points at
SOCKET_NAME = "proxy.sock"
GUEST_SOCKET_DIR = "/run/sandcell/egress"
GUEST_CA_BUNDLE = "/etc/sandcell/ca-bundle.pem"


@dataclass(frozen=True)
class EgressAttachment:
    """What the runtime mounts: the socket's directory (read-write, socket only) and CA file."""

    socket_dir: Path  # holds SOCKET_NAME; bind-mounted at GUEST_SOCKET_DIR
    ca_bundle: Path  # the image's CA bundle plus the job's CA; mounted at GUEST_CA_BUNDLE


@dataclass(frozen=True)
class SecretBinding:
    """A secret rule of the job with its value, which only the trusted side ever holds."""

    spec: dict[str, Any]  # {"name", "hosts", "header", "format"}
    value: str


class EgressSession(Protocol):
    attachment: EgressAttachment

    def env(self) -> dict[str, str]:
        """Proxy and CA variables for the sandbox (HTTP_PROXY, SSL_CERT_FILE, …)."""

    def events(self) -> list[dict[str, Any]]:
        """Every connection attempt so far: host, port, decision, reason, bytes, time."""

    def close(self) -> None:
        """Stop the proxy for this job; every event is final after this returns."""


class Egress(Protocol):
    def open(
        self, session_id: str, allow: list[str], secrets: list[SecretBinding], image_ca: Path
    ) -> EgressSession: ...

    def reap(self) -> list[str]:
        """At start-up: remove what an earlier, crashed run left behind."""
