"""The proxy of one job: an asyncio server, and a thread that runs it for synchronous callers.

One proxy per job keeps identity trivial: everything that reaches this listener comes from that
job's sandbox (in production it listens on a unix socket that only that sandbox has mounted), so
no per-request credential is needed. Many `EgressServer`s can share one event loop; `EgressProxy`
gives one its own loop thread for a worker that is not async. TCP listening stays for tests and
benchmarks.
"""

import asyncio
import contextlib
import logging
import os
import threading
import traceback
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from sandcell.egress.audit import ConnectionAudit, Counter, EgressEvent, EventSink
from sandcell.egress.certs import JobCertificateAuthority
from sandcell.egress.config import EgressConfig
from sandcell.egress.handler import ConnectionHandler, ProxyContext
from sandcell.egress.resolve import Resolver, SystemResolver, upstream_tls_context
from sandcell.egress.secrets import Redactor

log = logging.getLogger("sandcell.egress")
T = TypeVar("T")

# connect(2) on a unix socket needs write permission on it. The sandbox's uid (65534) reaches it
# through runsc's gofer, and the sentry checks the mode it sees, so "other" must be able to
# write; who else can reach the path is decided by the directories above it (see gateway.py).
UNIX_SOCKET_MODE = 0o666

_OVER_LIMIT = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n"
    b"x-sandcell-egress: connection_limit\r\n\r\n"
)


class EgressServer:
    """One job's egress proxy on the running event loop."""

    def __init__(
        self, config: EgressConfig, on_event: EventSink, resolver: Resolver | None = None
    ) -> None:
        self.config = config
        self.redactor = Redactor.for_rules(config.secrets)
        hosts = config.intercepted_hosts
        self.ca = JobCertificateAuthority(hosts, config.ca_label) if hosts else None
        self._ctx = ProxyContext(
            config=config,
            resolver=resolver or SystemResolver(),
            upstream_tls=upstream_tls_context(config.upstream_ca_file),
            ca=self.ca,
            redactor=self.redactor,
        )
        self._on_event = on_event
        self._server: asyncio.Server | None = None
        self._unix_path: Path | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def ca_pem(self) -> bytes | None:
        """The job CA certificate to add to the sandbox's trust store; None without secrets."""
        return self.ca.cert_pem if self.ca else None

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None or not self._server.sockets or self._unix_path is not None:
            raise RuntimeError("the egress proxy is not listening on TCP")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> tuple[str, int]:
        """Listen on the configured TCP address; return the bound one."""
        self._server = await asyncio.start_server(
            self._accept, self.config.listen_host, self.config.listen_port
        )
        return self.address

    async def start_unix(self, path: Path) -> None:
        """Listen on a unix socket at `path` (which must not exist yet)."""
        self._server = await asyncio.start_unix_server(self._accept, path)
        self._unix_path = path
        os.chmod(path, UNIX_SOCKET_MODE)

    async def close(self) -> None:
        """Stop listening, end every open connection (each still gets its event)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self._unix_path is not None:  # asyncio leaves the socket file behind (before 3.13)
            with contextlib.suppress(FileNotFoundError):
                self._unix_path.unlink()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._tasks) >= self.config.limits.max_connections:
            await self._refuse_over_limit(writer)
            return
        self._tasks.add(task)
        handler = ConnectionHandler(self._ctx, reader, writer)
        try:
            await handler.run()
        except asyncio.CancelledError:
            pass  # close() cancelled us; end normally, or asyncio logs the cancellation as an error
        except Exception as exc:  # a bug must not take the proxy down, but it must be visible
            handler.audit.deny("internal_error")
            self._log_internal_error(exc)
        finally:
            self._tasks.discard(task)
            self._emit(handler.audit.event())

    async def _refuse_over_limit(self, writer: asyncio.StreamWriter) -> None:
        audit = ConnectionAudit(Counter())
        audit.deny("connection_limit")
        try:
            writer.write(_OVER_LIMIT)
            audit.client.sent = len(_OVER_LIMIT)
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), 1)
        except (OSError, TimeoutError):
            pass
        self._emit(audit.event())

    def _emit(self, event: EgressEvent) -> None:
        try:
            self._on_event(event)
        except Exception as exc:
            self._log_internal_error(exc)

    def _log_internal_error(self, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(exc))
        log.error("egress proxy internal error: %s", self.redactor.redact(text))


class EgressProxy:
    """An `EgressServer` on its own event-loop thread, for a synchronous worker.

        proxy = EgressProxy(config, on_event=record.append)
        proxy.start_unix(socket_dir / "proxy.sock")  # or: host, port = proxy.start()
        ...  # run the sandbox with proxy.ca_pem installed and HTTP(S)_PROXY pointing here
        proxy.stop()

    `on_event` is called on the proxy's thread, once per connection, also for connections
    still open at `stop()`.
    """

    def __init__(
        self, config: EgressConfig, on_event: EventSink, resolver: Resolver | None = None
    ) -> None:
        self.server = EgressServer(config, on_event, resolver)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def ca_pem(self) -> bytes | None:
        return self.server.ca_pem

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    def start(self, timeout_s: float = 10.0) -> tuple[str, int]:
        """Listen on the configured TCP address; return the bound one."""
        return self._start(self.server.start(), timeout_s)

    def start_unix(self, path: Path, timeout_s: float = 10.0) -> None:
        """Listen on a unix socket at `path` (which must not exist yet)."""
        self._start(self.server.start_unix(path), timeout_s)

    def _start(self, starting: Coroutine[Any, Any, T], timeout_s: float) -> T:
        if self._thread is not None:
            starting.close()  # never awaited: say so, or asyncio warns about it
            raise RuntimeError("the egress proxy is already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sandcell-egress", daemon=True
        )
        self._thread.start()
        try:
            return self._call(starting, timeout_s)
        except BaseException:
            self._shutdown_loop(timeout_s)
            raise

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is None:
            return
        try:
            self._call(self.server.close(), timeout_s)
        finally:
            self._shutdown_loop(timeout_s)

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def _shutdown_loop(self, timeout_s: float) -> None:
        loop, thread = self._loop, self._thread
        assert loop is not None and thread is not None
        # getaddrinfo runs in the loop's default executor; close it, or its thread leaks.
        asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop).result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        loop.close()
        self._loop, self._thread = None, None

    def __enter__(self) -> "EgressProxy":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
