"""`print(1)` through `Runtime.run`, gVisor and bwrap, against their raw tools and bare Python.

    .venv/bin/python -m bench.runtimes [--runs 30]

Everything is measured in this one run, sequentially, on the same image root: bare
`python3.11 -c 'print(1)'` on the host, a raw `bwrap` over the image (same namespaces, none of
sandcell's scratch volume, cgroup, seccomp or uid switch), a cold `runsc run`, and each
runtime's full `run` (scratch volume, cgroup, launch, ready line, output, release).
"""

import argparse
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import BinaryIO

from bench._baselines import bare_python, cold_runsc, raw_bwrap_once, summary, timed
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import Runtime, SandboxSpec
from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.images import FilesystemImageCatalog

IMAGE_DIR = Path("/var/lib/sandcell/images")
GUEST_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


class CollectingSink:
    def __init__(self) -> None:
        self.stdout = b""

    def ready(self) -> None:
        pass

    def output(self, stream: str, data: bytes) -> None:
        if stream == "stdout":
            self.stdout += data

    def output_file(self, path: str, content: BinaryIO, size: int) -> None:
        pass


def raw_bwrap(rootfs: Path, runs: int) -> list[float]:
    return timed(raw_bwrap_once(rootfs), runs)


def through_runtime(runtime: Runtime, image: Image, runs: int) -> list[float]:
    ids = count()

    def once() -> None:
        spec = SandboxSpec(
            f"bench-{runtime.name}-{next(ids)}",
            image,
            [image.python, "/job/main.py"],
            GUEST_ENV,
            Limits(),
            code=b"print(1)",
        )
        sink = CollectingSink()
        result = runtime.run(spec, sink, threading.Event())
        assert result.reason is None and result.released and sink.stdout == b"1\n", result

    once()  # first use: page cache, the seccomp filter compiled once
    return timed(once, runs)


@contextmanager
def state_dir(name: str) -> Iterator[Path]:
    # World-traversable: bwrap runs as the sandbox's uid and must reach its bind sources.
    path = Path(tempfile.mkdtemp(prefix=f"sandcell-bench-{name}-", dir="/var/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def measure(runs: int) -> dict[str, dict[str, float]]:
    image = FilesystemImageCatalog(IMAGE_DIR).get("python")
    results = {"bare_python3.11": summary(bare_python(runs))}
    results["raw_bwrap"] = summary(raw_bwrap(image.rootfs, runs))
    results["raw_runsc_run"] = summary(cold_runsc(image.rootfs, runs))
    makers: dict[str, Callable[[Path], GVisorRuntime | BwrapRuntime]] = {
        "gvisor": GVisorRuntime,
        "bwrap": BwrapRuntime,
    }
    for name, make in makers.items():
        with state_dir(name) as path:
            runtime = make(path)
            runtime.check()
            results[f"{name}_run"] = summary(through_runtime(runtime, image, runs))
            runtime.reap()
    return results


def ratios(results: dict[str, dict[str, float]]) -> dict[str, float]:
    def ratio(a: str, b: str) -> float:
        return round(results[a]["median_ms"] / results[b]["median_ms"], 2)

    return {
        "gvisor_run / bare_python": ratio("gvisor_run", "bare_python3.11"),
        "gvisor_run / raw_runsc_run": ratio("gvisor_run", "raw_runsc_run"),
        "bwrap_run / bare_python": ratio("bwrap_run", "bare_python3.11"),
        "bwrap_run / raw_bwrap": ratio("bwrap_run", "raw_bwrap"),
        "gvisor_run / bwrap_run": ratio("gvisor_run", "bwrap_run"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    results = measure(args.runs)
    print(json.dumps({"results": results, "ratios": ratios(results)}, indent=2))


if __name__ == "__main__":
    main()
