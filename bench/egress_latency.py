"""Added latency of one HTTPS request through the egress proxy, against going direct.

    .venv/bin/python -m bench.egress_latency [--runs 50]

Everything runs on loopback in the same run: an HTTPS echo server (own process), the egress proxy
(own process, like the worker that hosts it) and the client (this process, like the sandbox).
Each sample is one GET on a fresh connection (TCP + TLS + request), which is what a script doing
one `requests.get` pays; "reused" samples send the request on an already open connection.
Modes: direct; `tunnel` (CONNECT, TLS end to end); `intercept` (CONNECT to a secret host: TLS
terminated with the job CA, header injected, verified TLS upstream).
"""

import argparse
import http.client
import json
import multiprocessing
import multiprocessing.synchronize
import ssl
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.integration.egress_servers import EchoServer, TestPKI

from bench._baselines import timed
from sandcell.egress import (
    EgressConfig,
    EgressPolicy,
    EgressProxy,
    SecretRule,
    StaticResolver,
    ca_bundle,
)

UPSTREAM_IP = "127.0.0.3"
NAMES = {"api.secret.test": UPSTREAM_IP, "other.test": UPSTREAM_IP}


def _upstream(pki: TestPKI, ready: "multiprocessing.Queue[Any]", stop: Any) -> None:
    context = pki.server_context(["other.test", "api.secret.test", UPSTREAM_IP])
    with EchoServer(UPSTREAM_IP, context) as server:
        ready.put(server.port)
        stop.wait()


def _proxy(ca_file: Path, ready: "multiprocessing.Queue[Any]", stop: Any) -> None:
    policy = EgressPolicy.build(list(NAMES), allowed_networks=["127.0.0.0/8"], ports=None)
    spec = {"name": "token", "hosts": ["api.secret.test"], "header": "Authorization"}
    rules = (SecretRule.from_spec(spec | {"format": "Bearer {value}"}, "bench-secret"),)
    config = EgressConfig(policy, rules, upstream_ca_file=str(ca_file))
    with EgressProxy(config, lambda _event: None, StaticResolver(NAMES)) as proxy:
        ready.put((proxy.address, proxy.ca_pem))
        stop.wait()


def summary(samples: list[float]) -> dict[str, float]:
    """Like bench._baselines.summary, with the finer resolution loopback numbers need."""
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[max(0, int(len(ordered) * 0.9) - 1)], 2),
        "runs": len(ordered),
    }


def _get(connection: http.client.HTTPSConnection) -> None:
    connection.request("GET", "/")
    response = connection.getresponse()
    response.read()
    assert response.status == 200, response.status


def _fresh(make: Callable[[], http.client.HTTPSConnection]) -> Callable[[], None]:
    def once() -> None:
        connection = make()
        try:
            _get(connection)
        finally:
            connection.close()

    return once


def _measure(make: Callable[[], http.client.HTTPSConnection], runs: int) -> dict[str, Any]:
    for _ in range(5):  # warm up caches (leaf certificate, TLS contexts, code paths)
        _fresh(make)()
    reused = make()
    _get(reused)
    result = {
        "fresh": summary(timed(_fresh(make), runs)),
        "reused": summary(timed(lambda: _get(reused), runs)),
    }
    reused.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    runs = parser.parse_args().runs
    fork = multiprocessing.get_context("fork")  # children start before this process has threads
    with tempfile.TemporaryDirectory() as scratch:
        pki = TestPKI(Path(scratch))
        stop, ready = fork.Event(), fork.Queue()
        children = [
            fork.Process(target=_upstream, args=(pki, ready, stop)),
            fork.Process(target=_proxy, args=(pki.ca_file, ready, stop)),
        ]
        for child in children:
            child.start()
        try:
            report = _run(pki, [ready.get(timeout=30), ready.get(timeout=30)], runs)
        finally:
            stop.set()
            for child in children:
                child.join(10)
    print(json.dumps(report, indent=2))


def _run(pki: TestPKI, announced: list[Any], runs: int) -> dict[str, Any]:
    port = next(a for a in announced if isinstance(a, int))
    (proxy_host, proxy_port), ca_pem = next(a for a in announced if isinstance(a, tuple))
    bundle = ca_bundle(pki.ca_file.read_bytes(), ca_pem)
    context = ssl.create_default_context(cadata=bundle.decode())

    def via_proxy(host: str) -> Callable[[], http.client.HTTPSConnection]:
        def make() -> http.client.HTTPSConnection:
            connection = http.client.HTTPSConnection(proxy_host, proxy_port, context=context)
            connection.set_tunnel(host, port)
            return connection

        return make

    direct = _measure(lambda: http.client.HTTPSConnection(UPSTREAM_IP, port, context=context), runs)
    tunnel = _measure(via_proxy("other.test"), runs)
    intercept = _measure(via_proxy("api.secret.test"), runs)
    base = direct["fresh"]["median_ms"]
    return {
        "direct": direct,
        "tunnel": tunnel,
        "intercept": intercept,
        "added_ms_fresh": {
            "tunnel": round(tunnel["fresh"]["median_ms"] - base, 2),
            "intercept": round(intercept["fresh"]["median_ms"] - base, 2),
        },
        "added_ms_reused": {
            "tunnel": round(tunnel["reused"]["median_ms"] - direct["reused"]["median_ms"], 2),
            "intercept": round(intercept["reused"]["median_ms"] - direct["reused"]["median_ms"], 2),
        },
    }


if __name__ == "__main__":
    main()
