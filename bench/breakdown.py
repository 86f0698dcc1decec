"""Where the time of a pooled `print(1)` and of a session's `1+1` goes: the probes behind the
breakdowns in RESULTS.md, beside a bare-python baseline from the same run.

    .venv/bin/python -m bench.breakdown [--runs 15] [--cells 300]

Needs root and the built images. The job part times `PooledRun`'s phases around
`PooledRuntime.run` (no HTTP); the session part starts a scratch `sandcell serve` and times,
for one `python-data` session, an empty request, an authenticated read, the worker's internal
`execute` called directly, and the API's `execute` that goes through it.
"""

import argparse
import json
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import _http
from bench._baselines import bare_python, summary, timed
from bench._server import UNLIMITED, server, tenant_client, worker_client
from bench.pool import IMAGE_DIR, Sink, pooled_runtime, spec, wait_ready
from sandcell.ports.runtime import SandboxResult, SandboxSpec
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.runtime.sandbox import SandboxRun
from sandcell.runtime.warm import PooledRun

PHASES = (
    "_prepare",
    "_launch",
    "_watch",
    "_early_result",
    "_decide",
    "_take_usage",
    "_collect",
    "_release",
)


@contextmanager
def phase_clock(names: tuple[str, ...]) -> Iterator[dict[str, list[float]]]:
    """Milliseconds spent in each named `PooledRun` method, for as long as the context lasts."""
    spent: dict[str, list[float]] = defaultdict(list)
    originals = {name: getattr(PooledRun, name) for name in names}

    def timed_method(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: SandboxRun, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                spent[name].append((time.perf_counter() - started) * 1000)

        return wrapper

    for name, method in originals.items():
        setattr(PooledRun, name, timed_method(name, method))
    try:
        yield spent
    finally:
        for name, method in originals.items():
            setattr(PooledRun, name, method)


class FirstOutput(Sink):
    """A sink that notes when the job's first byte of output, and its result, arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.first_at: float | None = None
        self.result_at: float | None = None

    def output(self, stream: str, data: bytes) -> None:
        if self.first_at is None:
            self.first_at = time.perf_counter()
        super().output(stream, data)

    def ended(self, result: SandboxResult) -> None:  # ports.runtime.EarlySink
        self.result_at = time.perf_counter()


def pooled_job_phases(runs: int) -> dict[str, Any]:
    images = FilesystemImageCatalog(IMAGE_DIR)
    job = spec(images.get("python"), b"print(1)", [])
    totals, first_output, result = [], [], []
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-phases-", dir="/var/tmp") as tmp:
        base = GVisorRuntime(Path(tmp) / "state")
        base.check()
        pooled = pooled_runtime(base, images, "python")
        try:
            with phase_clock(PHASES) as spent:
                for n in range(runs):
                    wait_ready(pooled.pool, "python")
                    time.sleep(0.5)  # the refill's boot settles; not what is measured
                    one = SandboxSpec(**{**job.__dict__, "sandbox_id": f"phases-{n}"})
                    sink, started = FirstOutput(), time.perf_counter()
                    ran = pooled.run(one, sink, threading.Event())
                    totals.append((time.perf_counter() - started) * 1000)
                    assert ran.pooled and sink.stdout == b"1\n", ran
                    assert sink.first_at is not None and sink.result_at is not None
                    first_output.append((sink.first_at - started) * 1000)
                    result.append((sink.result_at - started) * 1000)
        finally:
            pooled.close()
            base.reap()
    out = {f"{name.strip('_')}_ms": summary(samples) for name, samples in spent.items()}
    out["run_to_first_output_ms"] = summary(first_output)
    out["run_to_result_ms"] = summary(result)  # the early result, before the release
    out["runtime_run_ms"] = summary(totals)
    return out


def session_path(cells: int) -> dict[str, Any]:
    env = UNLIMITED | {"SANDCELL_POOL_SIZE": "", "SANDCELL_SESSION_POOL_SIZE": ""}
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-path-", dir="/var/tmp") as tmp:
        data_dir = Path(tmp) / "data"
        with server(data_dir, env) as url, tenant_client(url) as http:
            sid, _, _ = _http.session_first_result(http, "python-data")
            with worker_client(data_dir) as worker:
                direct = {"code": "1+1", "timeout_s": 30}
                return {
                    "empty_request_ms": summary(timed(lambda: http.get("/healthz"), cells)),
                    "session_read_ms": summary(
                        timed(lambda: http.get(f"/v1/sessions/{sid}"), cells)
                    ),
                    "worker_execute_ms": summary(
                        timed(
                            lambda: worker.post(f"/internal/sessions/{sid}/execute", json=direct),
                            cells,
                        )
                    ),
                    "api_execute_ms": summary(
                        timed(lambda: _http.execute(http, sid, "1+1"), cells)
                    ),
                }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--cells", type=int, default=300)
    args = parser.parse_args()
    python = summary(bare_python(20))
    report = {
        "bare_python_ms": python,
        "pooled_print_1": pooled_job_phases(args.runs),
        "session_1_plus_1": session_path(args.cells),
    }
    api = report["session_1_plus_1"]["api_execute_ms"]["median_ms"]
    report["api_execute_vs_python"] = round(api / python["median_ms"], 2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
