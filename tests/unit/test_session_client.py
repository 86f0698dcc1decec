"""The API's client of its workers' session hosts."""

from sandcell.domain.records import WorkerInfo
from sandcell.remote.session_client import HttpSessionHosts


def _worker(name: str, url: str) -> WorkerInfo:
    return WorkerInfo(name, "host", "gvisor", "test", 0.0, url=url)


def test_every_worker_is_called_through_one_pool_made_with_the_hosts() -> None:
    # Made with the API: httpx's first transport loads httpcore (~0.2 s), and each one the CA
    # bundle (~20 ms); a tenant's first call to a worker paid that before.
    hosts = HttpSessionHosts("token")
    made = hosts._transport
    first = hosts.host(_worker("wrk_a", "http://127.0.0.1:1"))
    second = hosts.host(_worker("wrk_b", "http://127.0.0.1:2"))
    assert hosts.host(_worker("wrk_a", "http://127.0.0.1:1")) is first
    assert first._http._transport is second._http._transport is made
    # Shared by every worker, so not capped at httpx's 100 connections: the API's own threads
    # and streams bound its calls.
    assert made._pool._max_connections > 10_000  # type: ignore[attr-defined]
