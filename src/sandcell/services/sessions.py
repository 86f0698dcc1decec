"""Sessions as the API sees them: create, execute, files, pause/resume, previews."""

import base64
import hashlib
import hmac
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sandcell.domain.cells import (
    CELL_CHARS,
    KEEP_CELLS,
    SessionCell,
    error_outcome,
    failed_outcome,
)
from sandcell.domain.errors import (
    Conflict,
    FieldError,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    RuntimeUnavailable,
    SandcellError,
    Unauthorized,
)
from sandcell.domain.ids import new_id
from sandcell.domain.records import LIVE_WORKER_S, Tenant, WorkerInfo
from sandcell.domain.sessions import Session, SessionState
from sandcell.ports.session_hosts import HttpReply, SessionHost, SessionHosts, StreamItem
from sandcell.ports.sessions import CellResult
from sandcell.ports.store import Store
from sandcell.services.audit import AuditLog
from sandcell.services.auth import Principal
from sandcell.services.direct_cells import DIRECT_TTL_S, DirectAccess, DirectTokens, record_cell
from sandcell.services.jobs import JobPolicy
from sandcell.services.validation import RequestValidator


@dataclass(frozen=True)
class SessionRequest:
    image: str | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)
    secrets: list[dict[str, Any]] = field(default_factory=list)
    idle_timeout_s: float | None = None
    ttl_s: float | None = None


@dataclass(frozen=True)
class SessionPolicy:
    default_image: str = "python-data"
    idle_timeout_s: float = 600.0
    max_idle_timeout_s: float = 86400.0
    ttl_s: float = 3600.0
    max_ttl_s: float = 7 * 86400.0
    preview_ttl_s: float = 3600.0
    history_cells: int = KEEP_CELLS  # the newest cells kept per session
    history_cell_chars: int = CELL_CHARS  # what one stored cell may hold


class SessionService:
    def __init__(
        self,
        store: Store,
        hosts: SessionHosts,
        check: RequestValidator,
        jobs: JobPolicy,
        policy: SessionPolicy,
        signing_key: bytes,
        direct_tokens: DirectTokens,
    ) -> None:
        self.store, self.hosts, self.check = store, hosts, check
        self.jobs, self.policy, self.signing_key = jobs, policy, signing_key
        self.direct_tokens = direct_tokens
        self.audit = AuditLog(store)

    # lifecycle

    def create(self, who: Principal, request: SessionRequest) -> Session:
        who.require("sessions")
        tenant = self._tenant(who)
        spec = self._validated(tenant, request)
        quota = self.jobs.quotas_for(tenant).sessions
        if self.store.count_live_sessions(tenant.id) >= quota:
            raise QuotaExceeded(f"at most {quota} live sessions (quota); stop one first", 5)
        worker = self._pick_worker()
        now = time.time()
        session = Session(
            id=new_id("ses"),
            tenant_id=tenant.id,
            state=SessionState.STARTING,
            spec=spec,
            created_at=now,
            last_used_at=now,
            expires_at=now + (request.ttl_s or self.policy.ttl_s),
            idle_timeout_s=request.idle_timeout_s or self.policy.idle_timeout_s,
            worker_id=worker.id,
        )
        self.store.add_session(session)
        self.hosts.host(worker).start(session)
        return self.get(who, session.id)

    def _validated(self, tenant: Tenant, request: SessionRequest) -> dict[str, Any]:
        image = request.image or self.policy.default_image
        errors = self.check.image_errors(tenant, image, session=True)
        limits, limit_errors = self.check.limits(tenant, request.limits)
        errors += limit_errors + self.check.network_errors(tenant, request.network, request.secrets)
        if request.idle_timeout_s and request.idle_timeout_s > self.policy.max_idle_timeout_s:
            errors.append(FieldError("idle_timeout_s", f"at most {self.policy.max_idle_timeout_s}"))
        if request.ttl_s and request.ttl_s > self.policy.max_ttl_s:
            errors.append(FieldError("ttl_s", f"at most {self.policy.max_ttl_s}"))
        if errors:
            raise InvalidRequest("the session request is invalid", errors)
        return {
            "image": image,
            "limits": limits.as_dict(),
            "env": request.env,
            "network": request.network,
            "secrets": request.secrets,
        }

    def get(self, who: Principal, session_id: str) -> Session:
        session = self.store.get_session(who.tenant(), session_id)
        if session is None:
            raise NotFound("no such session")
        return session

    def list_sessions(self, who: Principal, live_only: bool) -> list[Session]:
        return self.store.list_sessions(who.tenant(), live_only, 200)

    def stop(self, who: Principal, session_id: str) -> Session:
        session = self.get(who, session_id)
        if not session.state.is_final:
            self._host_of(session).stop(session.id, "stopped")
            self.audit.record(
                "session.stop", actor=who.key_id, tenant_id=session.tenant_id, target=session.id
            )
        return self.get(who, session_id)

    def pause(self, who: Principal, session_id: str) -> Session:
        session = self._running(who, session_id)
        self._host_of(session).pause(session.id)
        return self.get(who, session_id)

    def resume(self, who: Principal, session_id: str) -> Session:
        session = self.get(who, session_id)
        if session.state is not SessionState.PAUSED:
            raise Conflict(f"the session is {session.state.value}, not paused")
        worker = self._pick_worker(prefer_host_of=session.worker_id)
        self.hosts.host(worker).resume(session)
        return self.get(who, session_id)

    # cells, files, previews

    def execute(self, who: Principal, session_id: str, code: str, timeout_s: float) -> CellResult:
        session = self._running(who, session_id)
        host, started = self._host_of(session), time.time()
        try:
            result = host.execute(session.id, code, timeout_s)
        except SandcellError as exc:
            self._record(session, code, error_outcome(exc, []), started)
            raise
        self._record(session, code, result, started)
        return result

    def execute_stream(
        self, who: Principal, session_id: str, code: str, timeout_s: float
    ) -> Iterator[StreamItem]:
        session = self._running(who, session_id)
        items = self._host_of(session).execute_stream(session.id, code, timeout_s)
        return self._recorded(session, code, items, time.time())

    def _recorded(
        self, session: Session, code: str, items: Iterator[StreamItem], started: float
    ) -> Iterator[StreamItem]:
        """Pass the stream on; record the cell before its last item goes out, so a client
        that has the result finds the cell in the history."""
        events: list[dict[str, Any]] = []
        try:
            for kind, item in items:
                if kind == "event":
                    events.append(item)
                else:
                    outcome = item if kind == "result" else failed_outcome(events, item)
                    self._record(session, code, outcome, started)
                yield kind, item
                if kind != "event":
                    return  # the last item of a cell
        except SandcellError as exc:
            self._record(session, code, error_outcome(exc, events), started)
            raise

    def _record(self, session: Session, code: str, outcome: dict[str, Any], started: float) -> None:
        limits = self.policy.history_cells, self.policy.history_cell_chars
        record_cell(self.store, session.id, session.tenant_id, code, outcome, started, limits)

    def direct(self, who: Principal, session_id: str) -> DirectAccess:
        """Where and with what token to send this session's cells straight to its worker."""
        who.require("sessions")
        session = self._running(who, session_id)
        worker = self._worker_of(session)
        expires = int(time.time() + DIRECT_TTL_S)
        token = self.direct_tokens.mint(session.id, session.tenant_id, who.key_id, expires)
        return DirectAccess(f"{worker.url}/direct/sessions/{session.id}/execute", token, expires)

    def cells(
        self, who: Principal, session_id: str, after: int | None, limit: int
    ) -> list[SessionCell]:
        """The session's recorded cells, oldest first; kept while the session record is."""
        session = self.get(who, session_id)
        return self.store.session_cells(session.tenant_id, session.id, after, limit)

    def interrupt(self, who: Principal, session_id: str) -> None:
        session = self._running(who, session_id)
        self._host_of(session).interrupt(session.id)

    def put_file(self, who: Principal, session_id: str, path: str, content: bytes) -> int:
        session = self._running(who, session_id)
        return self._host_of(session).put_file(session.id, path, content)

    def get_file(self, who: Principal, session_id: str, path: str) -> bytes:
        session = self._running(who, session_id)
        return self._host_of(session).get_file(session.id, path)

    def list_files(self, who: Principal, session_id: str, path: str) -> list[dict[str, Any]]:
        session = self._running(who, session_id)
        return self._host_of(session).list_files(session.id, path)

    def preview_token(self, who: Principal, session_id: str, port: int) -> tuple[str, float]:
        session = self._running(who, session_id)
        expires = int(time.time() + self.policy.preview_ttl_s)
        payload = f"{session.id}.{port}.{expires}"
        return f"{payload}.{self._sign(payload)}", expires

    def preview(
        self, token: str, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> HttpReply:
        """Relay one request to the port a preview token names; the token is the credential."""
        session_id, port = self._verified(token)
        session = self.store.get_session(None, session_id)
        if session is None or session.state is not SessionState.RUNNING:
            raise NotFound("the session behind this preview is not running")
        return self._host_of(session).http(session.id, port, method, target, headers, body)

    def _verified(self, token: str) -> tuple[str, int]:
        try:
            session_id, port, expires, signature = token.split(".")
            payload = f"{session_id}.{port}.{expires}"
            valid = hmac.compare_digest(signature, self._sign(payload))
            if not valid or int(expires) < time.time():
                raise ValueError
            return session_id, int(port)
        except ValueError as exc:
            raise Unauthorized("invalid or expired preview token") from exc

    def _sign(self, payload: str) -> str:
        digest = hmac.new(self.signing_key, b"preview\n" + payload.encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")

    # helpers

    def _tenant(self, who: Principal) -> Tenant:
        tenant = self.store.get_tenant(who.tenant())
        if tenant is None:
            raise NotFound("tenant no longer exists")
        return tenant

    def _running(self, who: Principal, session_id: str) -> Session:
        session = self.get(who, session_id)
        if session.state is not SessionState.RUNNING:
            raise Conflict(f"the session is {session.state.value}, not running")
        return session

    def _host_of(self, session: Session) -> SessionHost:
        return self.hosts.host(self._worker_of(session))

    def _worker_of(self, session: Session) -> WorkerInfo:
        since = time.time() - LIVE_WORKER_S
        worker = self.store.live_worker(session.worker_id, since) if session.worker_id else None
        if worker is None or not worker.url:
            raise Conflict("the worker holding this session is gone")
        return worker

    def _live_workers(self) -> list[WorkerInfo]:
        return [w for w in self.store.live_workers(time.time() - LIVE_WORKER_S) if w.url]

    def _pick_worker(self, prefer_host_of: str | None = None) -> WorkerInfo:
        workers = self._live_workers()
        if not workers:
            raise RuntimeUnavailable("no worker is available to run sessions")
        same = [w for w in workers if w.id == prefer_host_of]
        return (same or workers)[0]
