"""HTTP/1.1 message relay over h11.

h11 does the parsing and framing on both sides (it refuses ambiguous framing such as a request
with both Content-Length and Transfer-Encoding, which is how smuggling starts); this module only
decides which headers cross the proxy. Hop-by-hop headers never cross, framing is re-declared
from what h11 validated, and `Expect: 100-continue` is answered by the proxy itself.
"""

from collections.abc import Iterable, Sequence

import h11

from sandcell.egress.errors import EgressDenied
from sandcell.egress.streams import Side

Headers = list[tuple[bytes, bytes]]

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
        b"content-length",  # framing: re-declared by `_framing`, never copied blindly
        b"host",  # requests: set from the verified target
    }
)


class HttpPeer:
    """An h11 connection over a `Side`, translating protocol errors into denial reasons."""

    def __init__(self, side: Side, role: type[h11.CLIENT] | type[h11.SERVER], max_head: int):
        self.side = side
        self.is_upstream = role is h11.CLIENT
        self.max_head = max_head
        self.conn = h11.Connection(role, max_incomplete_event_size=max_head)

    async def next_event(self) -> h11.Event:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._protocol_denial(exc) from exc
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.side.recv())
            elif event is h11.PAUSED:
                raise EgressDenied("bad_request", "data after the end of the exchange")
            else:
                assert isinstance(event, h11.Event)
                self._check_head_size(event)
                return event

    def _check_head_size(self, event: h11.Event) -> None:
        # h11 bounds only a head still incomplete; one that arrived whole in a single read can
        # be larger. Measure what it parsed, so the limit holds however the bytes were split.
        if isinstance(event, h11.Request | h11.Response | h11.InformationalResponse):
            size = sum(len(name) + len(value) + 4 for name, value in event.headers)
            size += len(event.target) if isinstance(event, h11.Request) else 0
            if size > self.max_head:
                raise EgressDenied("upstream_protocol" if self.is_upstream else "header_too_large")

    def _protocol_denial(self, exc: h11.RemoteProtocolError) -> EgressDenied:
        if self.is_upstream:
            return EgressDenied("upstream_protocol")
        return EgressDenied("header_too_large" if exc.error_status_hint == 431 else "bad_request")

    async def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            await self.side.send(data)

    def can_respond(self) -> bool:
        return self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE)

    def next_cycle(self) -> bool:
        """Reset for another exchange on the same connection, if both sides finished cleanly."""
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            return True
        return False


def end_to_end(headers: Iterable[tuple[bytes, bytes]], drop: Iterable[bytes] = ()) -> Headers:
    """Headers that may cross the proxy: not hop-by-hop, not named by Connection, not `drop`."""
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name == b"connection"
        for token in value.split(b",")
    }
    excluded = _HOP_BY_HOP | named | frozenset(drop)
    return [(name, value) for name, value in pairs if name not in excluded]


def _framing(headers: Sequence[tuple[bytes, bytes]]) -> Headers:
    """The body framing h11 already validated, declared again for the next hop.

    Chunked wins over Content-Length, as it did when h11 read the body (RFC 9112 6.3).
    """
    if any(name == b"transfer-encoding" for name, _ in headers):
        return [(b"transfer-encoding", b"chunked")]
    for name, value in headers:
        if name == b"content-length":
            return [(b"content-length", value)]
    return []


def _refuse_ambiguous_framing(request: h11.Request) -> None:
    # Both headers on one request is the classic smuggling set-up; RFC 9112 6.1 lets a proxy
    # reject it, and nothing legitimate needs it.
    names = {name for name, _ in request.headers}
    if b"transfer-encoding" in names and b"content-length" in names:
        raise EgressDenied("bad_request", "both Transfer-Encoding and Content-Length")


def upstream_request(request: h11.Request, path: bytes, host: bytes, extra: Headers) -> h11.Request:
    """The request to send upstream: origin-form target, verified Host, `extra` headers last."""
    _refuse_ambiguous_framing(request)
    drop = {name for name, _ in extra}
    headers = [(b"host", host), *end_to_end(request.headers, drop), *_framing(request.headers)]
    return h11.Request(method=request.method, target=path, headers=[*headers, *extra])


async def relay_exchange(
    client: HttpPeer, upstream: HttpPeer, request: h11.Request, keep_alive: bool
) -> bool:
    """Send `request` upstream, relay the body and the response; True if both may go on."""
    await upstream.send(request)
    if client.conn.they_are_waiting_for_100_continue:
        await client.send(h11.InformationalResponse(status_code=100, headers=[]))
    await _relay_body(client, upstream)
    response = await _final_response(upstream)
    keep = keep_alive and _reusable(response)
    headers = [*end_to_end(response.headers), *_framing(response.headers)]
    if not keep:
        headers.append((b"connection", b"close"))
    await client.send(
        h11.Response(status_code=response.status_code, headers=headers, reason=response.reason)
    )
    await _relay_body(upstream, client)
    return keep and client.next_cycle() and upstream.next_cycle()


async def _relay_body(source: HttpPeer, sink: HttpPeer) -> None:
    while True:
        event = await source.next_event()
        if isinstance(event, h11.Data):
            await sink.send(h11.Data(data=event.data))
        elif isinstance(event, h11.EndOfMessage):
            await sink.send(h11.EndOfMessage())  # trailers are dropped: nothing needs them here
            return
        else:
            raise _closed_early(source)


async def _final_response(upstream: HttpPeer) -> h11.Response:
    while True:
        event = await upstream.next_event()
        if isinstance(event, h11.Response):
            return event
        if not isinstance(event, h11.InformationalResponse):  # 1xx: already answered ourselves
            raise _closed_early(upstream)


def _closed_early(peer: HttpPeer) -> EgressDenied:
    return EgressDenied("upstream_protocol" if peer.is_upstream else "bad_request", "closed early")


def _reusable(response: h11.Response) -> bool:
    tokens = {
        token.strip().lower()
        for name, value in response.headers
        if name == b"connection"
        for token in value.split(b",")
    }
    return response.http_version == b"1.1" and b"close" not in tokens


async def send_text(peer: HttpPeer, status: int, text: str, extra: Headers) -> None:
    """A small final response from the proxy itself, closing the connection afterwards."""
    body = text.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
    ]
    await peer.send(h11.Response(status_code=status, headers=headers))
    await peer.send(h11.Data(data=body))
    await peer.send(h11.EndOfMessage())
