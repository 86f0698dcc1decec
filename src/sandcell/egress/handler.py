"""One sandbox connection to the proxy, from its first byte to its audit event.

The sandbox speaks HTTP/1.1 to a forward proxy:
- `GET http://host/path` (absolute form): checked, resolved, pinned, forwarded, one exchange per
  connection (`Connection: close`, so every upstream connection is audited on its own);
- `CONNECT host:port`: checked, resolved and pinned, then either a plain byte tunnel (TLS stays
  end to end, but the ClientHello must name the CONNECT host before any byte is relayed) or, for
  a host that carries secrets, TLS terminated here with the job CA so the secret headers can be
  added, and a verified TLS connection upstream. A tunnel carries TLS only: plain HTTP goes
  through the absolute-form path, where its Host header is checked.
Secrets are never added to plain HTTP: they would cross the network in clear text.
"""

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass

import h11

from sandcell.egress.audit import MODE_HTTP, MODE_INTERCEPT, MODE_TUNNEL, ConnectionAudit, Counter
from sandcell.egress.certs import JobCertificateAuthority
from sandcell.egress.client_hello import ClientHelloReader, check_server_name, normalize_server_name
from sandcell.egress.config import EgressConfig
from sandcell.egress.errors import EgressDenied
from sandcell.egress.hosts import Host, IPAddress, Target, parse_absolute_url, parse_authority
from sandcell.egress.http1 import HttpPeer, relay_exchange, send_text, upstream_request
from sandcell.egress.resolve import Resolver, connect_pinned, pinned_addresses
from sandcell.egress.secrets import Redactor
from sandcell.egress.streams import Activity, IdleTimeout, Side, splice

log = logging.getLogger("sandcell.egress")


@dataclass(frozen=True)
class ProxyContext:
    """What every connection of one proxy shares."""

    config: EgressConfig
    resolver: Resolver
    upstream_tls: ssl.SSLContext
    ca: JobCertificateAuthority | None
    redactor: Redactor


class _SniCheck:
    """Accepts the TLS handshake only when the client named exactly the CONNECT host."""

    def __init__(self, expected: str) -> None:
        self.expected, self.seen, self.called = expected, "", False

    def __call__(self, name: str | None) -> bool:
        self.called, self.seen = True, normalize_server_name(name or "")
        return self.seen == self.expected


class ConnectionHandler:
    def __init__(
        self, ctx: ProxyContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.ctx, self.limits = ctx, ctx.config.limits
        self.activity = Activity(self.limits.idle_timeout_s)
        counter = Counter()
        self.client = self._peer(Side(reader, writer, self.activity, counter), h11.SERVER)
        self.audit = ConnectionAudit(counter)
        self._upstream: Side | None = None

    def _peer(self, side: Side, role: type[h11.CLIENT] | type[h11.SERVER]) -> HttpPeer:
        return HttpPeer(side, role, self.limits.max_header_bytes)

    async def run(self) -> None:
        try:
            await self._serve()
        except EgressDenied as denied:
            await self._refuse(denied)
        except IdleTimeout:
            self._fail("idle_timeout")
            await self._reply(EgressDenied("upstream_timeout"))  # if a request is still waiting
        except (OSError, h11.LocalProtocolError):
            self._fail("connection_error")  # either peer went away or broke the protocol
        except asyncio.CancelledError:
            self._fail("proxy_stopped")
            raise
        finally:
            await self._close()

    def _fail(self, reason: str) -> None:
        # A connection that was allowed and later idled out or dropped stays "allowed".
        if self.audit.decision == "denied":
            self.audit.deny(reason)

    async def _refuse(self, denied: EgressDenied) -> None:
        self.audit.deny(denied.reason)
        detail = self.ctx.redactor.redact(denied.detail)  # details name hosts; scrub regardless
        log.info("egress denied %s:%s %s", self.audit.host, self.audit.port, detail)
        await self._reply(denied)

    async def _reply(self, denied: EgressDenied) -> None:
        if self.client.can_respond():
            text = f"sandcell egress proxy: denied ({denied.reason})\n"
            extra = [(b"x-sandcell-egress", denied.reason.encode())]
            # If the sandbox already hung up, the audit event is what matters.
            with contextlib.suppress(OSError, IdleTimeout, h11.LocalProtocolError):
                await send_text(self.client, denied.status, text, extra)

    async def _close(self) -> None:
        if self._upstream is not None:
            await self._upstream.close()
        await self.client.side.close()

    async def _serve(self) -> None:
        try:
            async with asyncio.timeout(self.limits.header_timeout_s):
                event = await self.client.next_event()
        except TimeoutError as exc:
            raise EgressDenied("header_timeout") from exc
        if isinstance(event, h11.ConnectionClosed):
            return
        assert isinstance(event, h11.Request)  # h11 servers see requests first, always
        self.audit.attempted(event.target.decode("ascii", "replace"))
        if event.method == b"CONNECT":
            await self._connect(event)
        else:
            await self._forward(event)

    async def _admit(self, target: Target) -> list[IPAddress]:
        self.ctx.config.policy.check_target(target.host, target.port)
        return await pinned_addresses(
            target.host, self.ctx.config.policy, self.ctx.resolver, self.limits.connect_timeout_s
        )

    async def _forward(self, request: h11.Request) -> None:
        target = parse_absolute_url(request.target.decode("ascii"), "http")
        self.audit.target(target.host.name, target.port)
        _check_host_header(request, target)
        outgoing = upstream_request(
            request, target.path.encode(), _authority(target, 80), [(b"connection", b"close")]
        )
        addresses = await self._admit(target)
        reader, writer = await connect_pinned(addresses, target.port, self.limits.connect_timeout_s)
        self._upstream = Side(reader, writer, self.activity)
        self.audit.allow(MODE_HTTP)
        await relay_exchange(self.client, self._peer(self._upstream, h11.CLIENT), outgoing, False)

    async def _connect(self, request: h11.Request) -> None:
        target = parse_authority(request.target.decode("ascii"), None)
        self.audit.target(target.host.name, target.port)
        _check_host_header(request, target, required=False)
        addresses = await self._admit(target)
        if target.host.ip is None and target.host.name in self.ctx.config.intercepted_hosts:
            await self._intercept(target, addresses)
        else:
            await self._tunnel(target, addresses)

    async def _tunnel(self, target: Target, addresses: list[IPAddress]) -> None:
        reader, writer = await connect_pinned(addresses, target.port, self.limits.connect_timeout_s)
        self._upstream = Side(reader, writer, self.activity)
        first_bytes = await self._client_hello(target.host, await self._established())
        self.audit.allow(MODE_TUNNEL)
        await self._upstream.send(first_bytes)
        await splice(self.client.side, self._upstream)

    async def _client_hello(self, host: Host, data: bytes) -> bytes:
        """Read the sandbox's first ClientHello whole, check its server name against `host`.

        Returns every byte read so far, for the tunnel to relay unchanged. Bounded in size by
        `ClientHelloReader` and in time by the TLS handshake timeout.
        """
        reader = ClientHelloReader()
        try:
            async with asyncio.timeout(self.limits.tls_handshake_timeout_s):
                while (hello := reader.feed(data)) is None:
                    if not (data := await self.client.side.recv()):
                        raise EgressDenied("bad_client_hello", "closed before a whole ClientHello")
        except TimeoutError as exc:
            raise EgressDenied("client_hello_timeout") from exc
        check_server_name(host, hello.server_name)
        return bytes(reader.data)

    async def _established(self) -> bytes:
        """Answer the CONNECT; return bytes the sandbox pipelined behind it."""
        await self.client.send(
            h11.Response(status_code=200, headers=[], reason=b"Connection established")
        )
        early, _closed = self.client.conn.trailing_data
        return early

    async def _intercept(self, target: Target, addresses: list[IPAddress]) -> None:
        host = target.host.name
        reader, writer = await connect_pinned(
            addresses,
            target.port,
            self.limits.connect_timeout_s,
            tls=self.ctx.upstream_tls,
            server_name=host,
        )
        self._upstream = upstream = Side(reader, writer, self.activity)
        if await self._established():
            raise EgressDenied("bad_request", "data sent before the tunnel was established")
        await self._accept_tls(host)
        self.audit.allow(MODE_INTERCEPT)
        self.client = self._peer(self.client.side, h11.SERVER)  # HTTP inside the TLS session
        await self._relay_intercepted(target, self._peer(upstream, h11.CLIENT))

    async def _accept_tls(self, host: str) -> None:
        assert self.ctx.ca is not None  # intercepted hosts exist only with secrets, so with a CA
        sni = _SniCheck(host)
        context = self.ctx.ca.server_context(host, sni)
        try:
            await self.client.side.start_tls(context, self.limits.tls_handshake_timeout_s)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            raise EgressDenied("sni_mismatch" if sni.seen != host else "client_tls") from exc
        if not sni.called:
            raise EgressDenied("sni_mismatch", "no server name sent")

    async def _relay_intercepted(self, target: Target, upstream: HttpPeer) -> None:
        secrets = [
            (rule.header.encode(), rule.header_value())
            for rule in self.ctx.config.rules_for(target.host.name)
        ]
        while (request := await self._next_request()) is not None:
            path = _path_in_tunnel(request, target)
            outgoing = upstream_request(request, path, _authority(target, 443), secrets)
            if not await relay_exchange(self.client, upstream, outgoing, keep_alive=True):
                return

    async def _next_request(self) -> h11.Request | None:
        try:
            event = await self.client.next_event()
        except IdleTimeout:
            return None  # a kept-alive connection that the sandbox no longer uses
        if isinstance(event, h11.ConnectionClosed):
            return None
        assert isinstance(event, h11.Request)
        return event


def _check_host_header(request: h11.Request, target: Target, required: bool = True) -> None:
    """The Host header must name the request's target; a missing port means the target's."""
    values = [value for name, value in request.headers if name == b"host"]
    if not values:
        if required:
            raise EgressDenied("bad_request", "a Host header is required")
        return
    stated = parse_authority(values[0].decode("ascii", "replace"), target.port)
    if (stated.host.name, stated.port) != (target.host.name, target.port):
        raise EgressDenied("host_mismatch", f"Host {stated.host}:{stated.port}")


def _path_in_tunnel(request: h11.Request, target: Target) -> bytes:
    """Origin form, or an absolute https URL for the tunnel's own host; nothing else."""
    raw = request.target.decode("ascii")
    if raw.startswith("/"):
        _check_host_header(request, target)
        return request.target
    url = parse_absolute_url(raw, "https")
    if (url.host.name, url.port) != (target.host.name, target.port):
        raise EgressDenied("host_mismatch", f"request for {url.host}:{url.port} in this tunnel")
    _check_host_header(request, url)
    return url.path.encode()


def _authority(target: Target, default_port: int) -> bytes:
    name = target.host.name
    return (name if target.port == default_port else f"{name}:{target.port}").encode()
