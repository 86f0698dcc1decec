"""The worker's side of sessions: the live sandboxes, their lifecycle, idle and TTL reaping."""

import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandcell.domain.errors import Conflict, SandcellError, SessionUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.sessions import Session, SessionState
from sandcell.ports.egress import Egress, EgressSession
from sandcell.ports.images import ImageCatalog
from sandcell.ports.runtime import Closeable
from sandcell.ports.session_hosts import HttpReply, StreamItem
from sandcell.ports.sessions import (
    CellEvent,
    CellResult,
    SessionPool,
    SessionRuntime,
    SessionSandbox,
    SessionSpec,
)
from sandcell.ports.store import Store
from sandcell.services import workspace_files
from sandcell.services.secrets import SecretService, secret_bindings
from sandcell.services.worker import BASE_ENV, image_ca_bundle

log = logging.getLogger("sandcell.sessions")
MAX_DOWNLOAD = 256 * 1024 * 1024


@dataclass
class LiveSession:
    sandbox: SessionSandbox
    egress: EgressSession | None
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while a cell runs
    last_cell_end: float = 0.0  # before the API's record of the cell reaches the store

    def idle_since(self, recorded: float) -> float | None:
        """When it went idle, or None while a cell runs: a long cell is not idleness."""
        return None if self.lock.locked() else max(recorded, self.last_cell_end)


class LocalSessionHost:
    """Owns the session sandboxes of one worker; every state change is written to the store."""

    def __init__(
        self,
        store: Store,
        runtime: SessionRuntime,
        images: ImageCatalog,
        state_root: Path,
        worker_id: str,
        egress: Egress | None = None,
        secrets: SecretService | None = None,
        pool: SessionPool | None = None,
    ) -> None:
        self.store, self.runtime, self.images = store, runtime, images
        self.state_root, self.worker_id = state_root, worker_id
        self.egress, self.secrets, self.pool = egress, secrets, pool
        self._live: dict[str, LiveSession] = {}
        self._lock = threading.Lock()

    # lifecycle

    def start(self, session: Session) -> None:
        self._launch(session, resume=False)

    def resume(self, session: Session) -> None:
        if session.state is not SessionState.PAUSED:
            raise Conflict(f"the session is {session.state.value}, not paused")
        self._launch(session, resume=True)

    def _launch(self, session: Session, resume: bool) -> None:
        image = self.images.get(session.spec["image"])
        egress = self._egress_for(session, image)
        pooled: dict[str, bool] = {}  # set once, at the start: a resume is never from a pool
        try:
            spec = self._spec(session, image, egress)
            if resume:
                sandbox = self.runtime.resume(spec)
            else:
                sandbox, pooled["pooled"] = self._start(spec)
        except Exception as exc:
            if egress is not None:
                egress.close()
            detail = exc.detail if isinstance(exc, SandcellError) else "the sandbox did not start"
            self.store.update_session(
                session.id,
                state=SessionState.FAILED,
                reason="error",
                detail=detail,
                stopped_at=time.time(),
            )
            raise
        with self._lock:
            self._live[session.id] = LiveSession(sandbox, egress)
        self.store.update_session(
            session.id,
            state=SessionState.RUNNING,
            worker_id=self.worker_id,
            last_used_at=time.time(),
            paused_at=None,
            sandbox_id=sandbox.sandbox_id,
            **pooled,
        )

    def _start(self, spec: SessionSpec) -> tuple[SessionSandbox, bool]:
        """A pooled kernel if one fits (True), else a cold start (False)."""
        taken = self.pool.take(spec) if self.pool is not None else None
        return (taken, True) if taken is not None else (self.runtime.start(spec), False)

    def pool_figures(self) -> dict[str, Any]:
        return self.pool.pool_figures() if self.pool is not None else {}

    def close(self) -> None:
        """The worker is ending: its pooled kernels go (live sessions were paused first), then
        what the runtime holds on the host."""
        if self.pool is not None:
            self.pool.close()
        if isinstance(self.runtime, Closeable):
            self.runtime.close()

    def _spec(self, session: Session, image: Image, egress: EgressSession | None) -> SessionSpec:
        env = BASE_ENV | {"SANDCELL_SESSION_ID": session.id} | session.spec.get("env", {})
        state_dir = self.state_root / session.id
        state_dir.mkdir(parents=True, exist_ok=True)
        return SessionSpec(
            sandbox_id=f"{session.id}-{time.time_ns() % 10**9}",
            image=image,
            env=env | (egress.env() if egress else {}),
            limits=Limits(**session.spec["limits"]),
            state_dir=state_dir,
            egress=egress.attachment if egress else None,
        )

    def _egress_for(self, session: Session, image: Image) -> EgressSession | None:
        allow = list(session.spec.get("network", {}).get("allow", []))
        if not allow:
            return None
        if self.egress is None:
            raise Conflict("this worker has no egress proxy")
        specs = session.spec.get("secrets", [])
        bindings = secret_bindings(self.secrets, session.tenant_id, specs)
        return self.egress.open(session.id, allow, bindings, image_ca_bundle(image))

    def pause(self, session_id: str) -> bool:
        live = self._take(session_id)
        with live.lock:
            kept = live.sandbox.pause()
        if live.egress is not None:
            live.egress.close()
        self.store.update_session(
            session_id, state=SessionState.PAUSED, paused_at=time.time(), memory_kept=kept
        )
        return kept

    def stop(self, session_id: str, reason: str) -> None:
        with self._lock:
            live = self._live.pop(session_id, None)
        if live is not None:
            live.sandbox.interrupt()
            with live.lock:
                live.sandbox.stop()
            if live.egress is not None:
                live.egress.close()
        shutil.rmtree(self.state_root / session_id, ignore_errors=True)
        self.store.update_session(
            session_id, state=SessionState.STOPPED, reason=reason, stopped_at=time.time()
        )

    # cells

    def execute(
        self,
        session_id: str,
        code: str,
        timeout_s: float,
        on_event: Callable[[CellEvent], None] | None = None,
    ) -> CellResult:
        live = self._get(session_id)
        try:
            with live.lock:
                try:
                    result = live.sandbox.execute(code, timeout_s, on_event)
                finally:
                    live.last_cell_end = time.time()
        except SessionUnavailable as exc:
            self._ended(session_id, live, exc.detail)
            raise
        return result  # the API records the cell, which also marks the session used

    def _ended(self, session_id: str, live: LiveSession, detail: str) -> None:
        """The sandbox died under a cell (e.g. out of memory): release it, keep the files."""
        with self._lock:
            self._live.pop(session_id, None)
        live.sandbox.stop()
        if live.egress is not None:
            live.egress.close()
        self.store.update_session(
            session_id,
            state=SessionState.FAILED,
            reason="error",
            detail=detail,
            stopped_at=time.time(),
        )

    def execute_stream(self, session_id: str, code: str, timeout_s: float) -> Iterator[StreamItem]:
        """The cell's events as they happen, then ("result", …) or ("error", …)."""
        items: queue.Queue[StreamItem] = queue.Queue()

        def run() -> None:
            try:
                result = self.execute(
                    session_id, code, timeout_s, lambda event: items.put(("event", event))
                )
                items.put(("result", result))
            except SandcellError as exc:
                items.put(("error", {"type": type(exc).__name__, "detail": exc.detail}))

        threading.Thread(target=run, name=f"cell-{session_id}", daemon=True).start()
        while True:
            kind, item = items.get()
            yield kind, item
            if kind != "event":
                return

    def interrupt(self, session_id: str) -> None:
        self._get(session_id).sandbox.interrupt()

    def http(
        self,
        session_id: str,
        port: int,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> HttpReply:
        return self._get(session_id).sandbox.http(port, method, target, headers, body)

    # files

    def put_file(self, session_id: str, path: str, content: bytes) -> int:
        return workspace_files.write_file(self._get(session_id).sandbox.workspace, path, content)

    def get_file(self, session_id: str, path: str) -> bytes:
        workspace = self._get(session_id).sandbox.workspace
        return workspace_files.read_file(workspace, path, MAX_DOWNLOAD)

    def list_files(self, session_id: str, path: str) -> list[dict[str, Any]]:
        return workspace_files.list_dir(self._get(session_id).sandbox.workspace, path)

    # housekeeping

    def reap(self, now: float) -> list[str]:
        """Stop sessions past their idle timeout or hard TTL; return their ids."""
        stopped = []
        for session in self.store.sessions_of_worker(
            self.worker_id, [SessionState.RUNNING, SessionState.PAUSED]
        ):
            with self._lock:
                live = self._live.get(session.id)
            idle_since = live.idle_since(session.last_used_at) if live else session.last_used_at
            reason = _expiry_reason(session, now, idle_since)
            if reason:
                self.stop(session.id, reason)
                stopped.append(session.id)
        return stopped

    def pause_all(self) -> None:
        """On a graceful stop: checkpoint every live session so it can resume later."""
        with self._lock:
            ids = list(self._live)
        log.info("pausing %d live sessions before stopping", len(ids))
        for session_id in ids:
            try:
                kept = self.pause(session_id)
                log.info("session %s paused (memory kept: %s)", session_id, kept)
            except Exception:
                log.exception("session %s could not be paused; stopping it", session_id)
                self.stop(session_id, "worker_stopped")

    def stop_all(self, reason: str) -> None:
        with self._lock:
            ids = list(self._live)
        for session_id in ids:
            try:
                self.stop(session_id, reason)
            except Exception:
                log.exception("session %s did not stop cleanly", session_id)

    def _get(self, session_id: str) -> LiveSession:
        with self._lock:
            live = self._live.get(session_id)
        if live is None:
            raise Conflict("the session is not running")
        return live

    def _take(self, session_id: str) -> LiveSession:
        with self._lock:
            live = self._live.pop(session_id, None)
        if live is None:
            raise Conflict("the session is not running")
        return live


def _expiry_reason(session: Session, now: float, idle_since: float | None) -> str | None:
    if now >= session.expires_at:
        return "ttl"
    if session.state is not SessionState.RUNNING or idle_since is None:
        return None  # a paused session only expires by its TTL; a running cell is not idle
    return "idle_timeout" if now - idle_since >= session.idle_timeout_s else None
