"""Preview requests: HTTP/1.1 to a server inside a session, relayed by its kernel.

The sandbox has no network the host could reach. The host writes the request bytes (h11, with
`Connection: close`, so the response ends where the connection does), the kernel moves them to
127.0.0.1:<port> inside the sandbox and returns what came back, and h11 parses it here. The
response is the sandbox's, so it is parsed as untrusted input: bounded, and refused whole when
it does not frame.
"""

import base64

import h11

from sandcell.domain.errors import InvalidRequest, PreviewUnavailable

MAX_RESPONSE_BYTES = 10 << 20
DEFAULT_TIMEOUT_S = 30.0
# Hop-by-hop and framing headers are this relay's own business, never the caller's.
DROPPED_HEADERS = frozenset(
    {
        *("connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"),
        *("transfer-encoding", "content-length", "host"),
    }
)
HttpReply = tuple[int, list[tuple[str, str]], bytes]


def request_bytes(
    port: int, method: str, target: str, headers: list[tuple[str, str]], body: bytes
) -> bytes:
    if not 0 < port < 65536:
        raise InvalidRequest(f"port {port} is out of range")
    kept = [(k, v) for k, v in headers if k.lower() not in DROPPED_HEADERS]
    own = [("Host", f"127.0.0.1:{port}"), ("Connection", "close")]
    length = [("Content-Length", str(len(body)))] if body or method not in ("GET", "HEAD") else []
    client = h11.Connection(h11.CLIENT)
    try:
        head = client.send(h11.Request(method=method, target=target, headers=own + kept + length))
        data = client.send(h11.Data(data=body)) if body else b""
        end = client.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:  # a bad method, target or header name/value
        raise InvalidRequest(f"cannot forward that request: {exc}") from exc
    return (head or b"") + (data or b"") + (end or b"")


def parse_response(raw: bytes, complete: bool, method: str) -> HttpReply:
    """Status, headers and body of the relayed response; PreviewUnavailable if it is broken."""
    client = h11.Connection(h11.CLIENT)
    # Tell h11 which request this answers (HEAD has no body whatever the headers say).
    client.send(h11.Request(method=method, target="/", headers=[("Host", "sandbox")]))
    client.send(h11.EndOfMessage())
    client.receive_data(raw)
    if complete:
        client.receive_data(b"")
    status, headers, body = 0, [], bytearray()
    try:
        while (event := client.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return status, headers, bytes(body)
    except h11.RemoteProtocolError as exc:
        raise PreviewUnavailable(f"the session's server sent a broken response: {exc}") from exc
    raise PreviewUnavailable("the session's server sent an incomplete response")


def relay_answer(answer: dict[str, object] | None) -> tuple[bytes, bool]:
    """The raw response and whether it is complete, from the kernel's answer."""
    if answer is None:
        raise PreviewUnavailable("the session stopped before the server answered")
    if "error" in answer:
        raise PreviewUnavailable(f"the session's server did not answer: {answer['error']}")
    response = answer.get("response")
    if not isinstance(response, str) or answer.get("truncated") is True:
        raise PreviewUnavailable(f"no response, or one over {MAX_RESPONSE_BYTES} bytes")
    return base64.b64decode(response), answer.get("complete") is True
