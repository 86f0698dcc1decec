"""DNS resolution and pinned upstream connections.

The sandbox has no resolver; the proxy resolves every name itself, checks every address it got
(one blocked address refuses the whole name, so a rebinding answer that mixes a public and a
private address cannot win), and then connects to those exact addresses. Nothing is resolved a
second time: the connection is pinned to what was checked. TLS upstream is verified against the
name, not the address.
"""

import asyncio
import functools
import ipaddress
import socket
import ssl
from collections.abc import Mapping, Sequence
from typing import Protocol

from sandcell.egress.errors import EgressDenied
from sandcell.egress.hosts import Host, IPAddress
from sandcell.egress.policy import EgressPolicy

_MAX_ADDRESSES = 8  # enough for any real service; bounds how long a connect loop can take


class Resolver(Protocol):
    async def resolve(self, name: str) -> Sequence[IPAddress]:
        """All addresses for `name`; raise OSError (or return nothing) when it has none."""


class SystemResolver:
    """The host's resolver (getaddrinfo), as the trusted worker sees it."""

    async def resolve(self, name: str) -> Sequence[IPAddress]:
        infos = await asyncio.get_running_loop().getaddrinfo(
            name, None, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        return [ipaddress.ip_address(info[4][0]) for info in infos]


class StaticResolver:
    """A fixed name → addresses map: for tests and for operators who pin names themselves."""

    def __init__(self, table: Mapping[str, str | Sequence[str]]) -> None:
        self._table = {
            name: [ipaddress.ip_address(a) for a in ([addrs] if isinstance(addrs, str) else addrs)]
            for name, addrs in table.items()
        }

    async def resolve(self, name: str) -> Sequence[IPAddress]:
        if name not in self._table:
            raise OSError(f"{name}: no such host in the static table")
        return self._table[name]


async def pinned_addresses(
    host: Host, policy: EgressPolicy, resolver: Resolver, timeout_s: float
) -> list[IPAddress]:
    """The checked addresses to connect to, in resolver order, or EgressDenied."""
    if host.ip is not None:
        found: Sequence[IPAddress] = [host.ip]
    else:
        try:
            async with asyncio.timeout(timeout_s):
                found = await resolver.resolve(host.name)
        except (OSError, TimeoutError) as exc:
            raise EgressDenied("dns_failed", host.name) from exc
    if not found:
        raise EgressDenied("dns_failed", host.name)
    for ip in found:
        policy.check_address(ip)
    return list(dict.fromkeys(found))[:_MAX_ADDRESSES]


async def connect_pinned(
    addresses: Sequence[IPAddress],
    port: int,
    timeout_s: float,
    tls: ssl.SSLContext | None = None,
    server_name: str | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the first address that answers; with `tls`, verify the peer as `server_name`.

    A certificate failure is final (another address of the same name would be no more
    trustworthy); a refused or timed-out address moves on to the next one.
    """
    for ip in addresses:
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.open_connection(
                    str(ip),
                    port,
                    ssl=tls,
                    server_hostname=server_name if tls else None,
                    ssl_handshake_timeout=timeout_s if tls else None,
                )
        except ssl.SSLError as exc:
            raise EgressDenied("upstream_tls", _tls_detail(exc)) from exc
        except (OSError, TimeoutError):
            continue
    raise EgressDenied("upstream_unreachable", f"port {port}")


def _tls_detail(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc.verify_message or "certificate verification failed"
    return exc.reason or "handshake failed"


@functools.lru_cache(maxsize=8)
def upstream_tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Verifying client context: the operator's CA bundle, or the system trust store.

    Loading a full bundle takes about 20 ms, so proxies share one context per bundle path (the
    file is read once per process). Client contexts are safe to share across threads.
    """
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context
