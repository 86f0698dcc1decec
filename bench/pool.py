"""Warm pool against cold start through `Runtime.run`: a trivial job and a CSV → chart job.

    .venv/bin/python -m bench.pool [--runs 20] [--chart-runs 5]

Measured in this one run, sequentially: bare `python3.11 -c 'print(1)'` and a cold `runsc run`
(baselines), `print(1)` cold and from a `python` pool, a pandas + matplotlib chart of a
10k-row CSV cold and from a `python-data` pool, and the memory of an idle warm sandbox. Each
pooled run waits until a warm sandbox is ready (the refill is not what is timed: it runs in
the background between jobs); its time is hand-over → exit → verified release.
"""

import argparse
import json
import tempfile
import threading
import time
from itertools import count
from pathlib import Path
from typing import BinaryIO

from bench._baselines import bare_python, cold_runsc, summary
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import InputFile, Runtime, SandboxSpec
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.hand_over import WarmSandbox
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.runtime.pool import PoolConfig, WarmPool
from sandcell.runtime.pooled import PooledRuntime, warm_factory

IMAGE_DIR = Path("/var/lib/sandcell/images")
GUEST_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/workspace"}
CHART = (
    "import pandas as pd, matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot as plt\n"
    "df = pd.read_csv('/input/data.csv')\n"
    "ax = df.groupby('group')['value'].mean().plot(kind='bar')\n"
    "ax.figure.savefig('/output/chart.png')\n"
    "print(len(df))\n"
)
MiB = 1024 * 1024


class Sink:
    def __init__(self) -> None:
        self.stdout, self.files = b"", 0

    def ready(self) -> None:
        pass

    def output(self, stream: str, data: bytes) -> None:
        if stream == "stdout":
            self.stdout += data

    def output_file(self, path: str, content: BinaryIO, size: int) -> None:
        self.files += 1


def write_csv(directory: Path) -> Path:
    path = directory / "data.csv"
    rows = "".join(f"{i},g{i % 7},{(i * 37) % 101}\n" for i in range(10_000))
    path.write_text("id,group,value\n" + rows)
    return path


def timed_runs(
    runtime: Runtime,
    spec: SandboxSpec,
    runs: int,
    pool: WarmPool[WarmSandbox] | None,
    expect: bytes,
) -> list[float]:
    ids = count()
    samples = []
    for _ in range(runs + 1):  # the first one warms the page cache and is not kept
        if pool is not None:
            wait_ready(pool, spec.image.name)
        sink = Sink()
        one = SandboxSpec(**{**spec.__dict__, "sandbox_id": f"bench-{time.time_ns()}-{next(ids)}"})
        started = time.perf_counter()
        result = runtime.run(one, sink, threading.Event())
        elapsed = (time.perf_counter() - started) * 1000
        assert result.reason is None and result.released and sink.stdout == expect, result
        assert result.pooled is (pool is not None), result
        samples.append(elapsed)
    return samples[1:]


def wait_ready(pool: WarmPool[WarmSandbox], name: str, timeout_s: float = 120.0) -> float:
    started = time.monotonic()
    while pool.ready_count(name) < 1:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"the {name} pool did not fill")
        time.sleep(0.01)
    return time.monotonic() - started


def idle_memory_mb(pool: WarmPool[WarmSandbox], name: str) -> float:
    wait_ready(pool, name)
    time.sleep(1.0)  # let the boot's transient memory settle
    return round(pool.memory_bytes() / MiB, 1)


def measure(runs: int, chart_runs: int) -> dict[str, object]:
    images = FilesystemImageCatalog(IMAGE_DIR)
    python, data = images.get("python"), images.get("python-data")
    results: dict[str, object] = {
        "bare_python3.11": summary(bare_python(runs)),
        "raw_runsc_run": summary(cold_runsc(python.rootfs, runs)),
    }
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-pool-", dir="/var/tmp") as tmp:
        base = GVisorRuntime(Path(tmp) / "state")
        base.check()
        csv = write_csv(Path(tmp))
        trivial = spec(python, b"print(1)", [])
        chart = spec(data, CHART.encode(), [InputFile(csv, "data.csv")])
        results["cold_trivial"] = summary(timed_runs(base, trivial, runs, None, b"1\n"))
        results["cold_chart"] = summary(timed_runs(base, chart, chart_runs, None, b"10000\n"))
        for name, job, n, expect in (
            ("python", trivial, runs, b"1\n"),
            ("python-data", chart, chart_runs, b"10000\n"),
        ):
            pooled = pooled_runtime(base, images, name)
            try:
                results[f"idle_warm_{name}_mb"] = idle_memory_mb(pooled.pool, name)
                key = "pooled_trivial" if name == "python" else "pooled_chart"
                results[key] = summary(timed_runs(pooled, job, n, pooled.pool, expect))
            finally:
                pooled.close()
        base.reap()
    return results


def spec(image: Image, code: bytes, inputs: list[InputFile]) -> SandboxSpec:
    argv = [image.python, "/job/main.py"]
    return SandboxSpec("bench", image, argv, GUEST_ENV, Limits(), code=code, inputs=inputs)


def pooled_runtime(base: GVisorRuntime, images: FilesystemImageCatalog, name: str) -> PooledRuntime:
    pool = WarmPool(warm_factory(base), images, PoolConfig({name: 1}, Limits()))
    pool.start()
    return PooledRuntime(base, pool)


def ratios(results: dict[str, object]) -> dict[str, float]:
    def median(key: str) -> float:
        value = results[key]
        assert isinstance(value, dict)
        return float(value["median_ms"])

    return {
        "pooled_trivial / bare_python": round(
            median("pooled_trivial") / median("bare_python3.11"), 2
        ),
        "cold_trivial / bare_python": round(median("cold_trivial") / median("bare_python3.11"), 2),
        "pooled_trivial / cold_trivial": round(
            median("pooled_trivial") / median("cold_trivial"), 2
        ),
        "pooled_chart / cold_chart": round(median("pooled_chart") / median("cold_chart"), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--chart-runs", type=int, default=5)
    args = parser.parse_args()
    results = measure(args.runs, args.chart_runs)
    print(json.dumps({"results": results, "ratios": ratios(results)}, indent=2))


if __name__ == "__main__":
    main()
