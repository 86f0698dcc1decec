"""`ProxyEgress`: the Egress port over one `EgressProxy` per job, listening on a unix socket.

    <state_dir>/                      0700: no other host user can reach a job's proxy
        <session_id>/                 0700
            sock/                     0711, bind-mounted (read-only) at GUEST_SOCKET_DIR
                proxy.sock            0666: the guest's uid must be able to connect(2)
            ca-bundle.pem             0644, bind-mounted read-only at GUEST_CA_BUNDLE

The socket is the job's only way out (see runtime/network.py): whoever connects to it is that
job, so the proxy needs no per-request credential. Only the directories above it keep other host
users away, which is why state_dir must stay private to the worker.
"""

import re
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path
from secrets import token_hex
from typing import Any

from sandcell.domain.redaction import REDACTOR
from sandcell.egress.audit import EgressEvent
from sandcell.egress.config import EgressConfig, ProxyLimits
from sandcell.egress.env import ca_bundle, sandbox_env
from sandcell.egress.policy import DEFAULT_PORTS, EgressPolicy
from sandcell.egress.resolve import Resolver
from sandcell.egress.secrets import SecretRule
from sandcell.egress.server import EgressProxy
from sandcell.ports.egress import (
    GUEST_CA_BUNDLE,
    PROXY_PORT,
    SOCKET_NAME,
    EgressAttachment,
    SecretBinding,
)

SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # names a directory
SUN_PATH_MAX = 107  # bytes of a unix socket path, without the terminating NUL
GUEST_PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"  # the bridge inside the sandbox


class ProxySession:
    """One job's proxy: its directory, its listener, and every event it produced.

    While it is open, its secret values are masked in everything sandcell logs or records,
    whoever opened it (a job or a session).
    """

    def __init__(self, directory: Path, config: EgressConfig, resolver: Resolver | None) -> None:
        self.directory = directory
        self._secrets = [(rule.value, rule.name) for rule in config.secrets]
        socket_dir = directory / "sock"
        self.attachment = EgressAttachment(socket_dir, directory / "ca-bundle.pem")
        self._events: list[EgressEvent] = []
        self._lock = threading.Lock()  # events arrive on the proxy's thread
        self._proxy = EgressProxy(config, self._record, resolver)
        self._created = self._closed = False

    def start(self, image_ca: bytes) -> None:
        for value, name in self._secrets:
            REDACTOR.add(value, name)
        self.directory.mkdir(mode=0o700)  # never shared: an existing one is another session's
        self._created = True
        socket_dir = self.attachment.socket_dir
        socket_dir.mkdir(mode=0o700)
        socket_dir.chmod(0o711)  # the guest's uid walks through it to the socket
        bundle = ca_bundle(image_ca, self._proxy.ca_pem) if self._proxy.ca_pem else image_ca
        self.attachment.ca_bundle.write_bytes(bundle)
        self.attachment.ca_bundle.chmod(0o644)
        self._proxy.start_unix(socket_dir / SOCKET_NAME)

    def env(self) -> dict[str, str]:
        return sandbox_env(GUEST_PROXY_URL, GUEST_CA_BUNDLE)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [event.to_dict() for event in self._events]

    def close(self) -> None:
        """Stop the proxy (open connections get their events), then remove the directory."""
        if self._closed:
            return
        self._closed = True
        try:
            self._proxy.stop()
        finally:
            if self._created:
                shutil.rmtree(self.directory, ignore_errors=True)
            for value, _ in self._secrets:
                REDACTOR.discard(value)

    def _record(self, event: EgressEvent) -> None:
        with self._lock:
            self._events.append(event)


class ProxyEgress:
    """Opens one proxy per job under `state_dir`; the keyword settings are the operator's.

    `allowed_networks` / `allow_private` open address ranges the proxy refuses by default (tests
    allow 127.0.0.0/8); `ports` are the upstream ports a job may reach (None: any).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        allow_private: bool = False,
        allowed_networks: Iterable[str] = (),
        ports: Iterable[int] | None = DEFAULT_PORTS,
        upstream_ca_file: str | None = None,
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
    ) -> None:
        self.state_dir = state_dir.absolute()  # runsc bind-mounts need absolute sources
        self.allow_private = allow_private
        self.allowed_networks = tuple(allowed_networks)
        self.ports = None if ports is None else tuple(ports)
        self.upstream_ca_file = upstream_ca_file
        self.resolver = resolver
        self.limits = limits or ProxyLimits()

    def open(
        self, session_id: str, allow: list[str], secrets: list[SecretBinding], image_ca: Path
    ) -> ProxySession:
        """Start the job's proxy; raise EgressConfigError for a policy that cannot apply."""
        directory = self._session_dir(session_id)
        session = ProxySession(directory, self._config(session_id, allow, secrets), self.resolver)
        try:
            session.start(image_ca.read_bytes())
        except BaseException:
            session.close()
            raise
        return session

    def reap(self) -> list[str]:
        """Remove proxy directories a crashed run of this worker left (none is served now)."""
        if not self.state_dir.is_dir():
            return []
        removed = []
        for leftover in sorted(self.state_dir.iterdir()):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(f"egress {leftover.name}")
        return removed

    def _session_dir(self, session_id: str) -> Path:
        if not SESSION_ID.match(session_id):
            raise ValueError(f"invalid egress session id {session_id!r}")
        # A short random name, not the session id: a unix socket path has at most 107 bytes,
        # and a long data dir plus a job id would overflow it.
        directory = self.state_dir / token_hex(8)
        socket_path = directory / "sock" / SOCKET_NAME
        if len(bytes(socket_path)) > SUN_PATH_MAX:
            raise ValueError(f"egress socket path too long for a unix socket: {socket_path}")
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)  # also when it already existed: this is what keeps others out
        return directory

    def _config(
        self, session_id: str, allow: list[str], secrets: list[SecretBinding]
    ) -> EgressConfig:
        policy = EgressPolicy.build(
            allow,
            allow_private=self.allow_private,
            allowed_networks=self.allowed_networks,
            ports=self.ports,
        )
        rules = tuple(
            SecretRule.from_spec(binding.spec, binding.value, index)
            for index, binding in enumerate(secrets)
        )
        return EgressConfig(
            policy,
            rules,
            self.limits,
            upstream_ca_file=self.upstream_ca_file,
            ca_label=session_id,
        )
