"""The session runtime directly (no HTTP): cell round trip, pause/resume with pandas, memory.

    .venv/bin/python -m bench.session_runtime [--cells 200] [--cycles 5]

Needs root and the built `python-data` image. Baseline, measured in the same run: a cold
`runsc run` of `python3.11 -c 'print(1)'` over the same image root.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench._baselines import cold_runsc, summary, timed
from sandcell.domain.limits import Limits
from sandcell.ports.sessions import SessionSpec
from sandcell.runtime.images import build_image
from sandcell.runtime.session import GVisorSessionRuntime
from sandcell.runtime.session_runsc import CHECKPOINT_DIR, CHECKPOINT_FILE
from sandcell.runtime.session_sandbox import GVisorSession

IMAGE_DIR = Path(os.environ.get("SANDCELL_IMAGE_DIR", "/var/lib/sandcell/images"))
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/workspace"}
MiB = 1024 * 1024


class Bench:
    def __init__(self, scratch: Path) -> None:
        self.image = build_image("python-data", IMAGE_DIR)
        self.scratch = scratch
        self.runtime = GVisorSessionRuntime(scratch / "runtime")
        self.runtime.check()
        self.count = 0

    def spec(self, state_dir: Path) -> SessionSpec:
        self.count += 1
        return SessionSpec(f"bench-{self.count}", self.image, ENV, Limits(), state_dir)

    def start(self, name: str) -> GVisorSession:
        return self.runtime.start(self.spec(self.scratch / name))


def _idle_memory(session: GVisorSession, settle_s: float = 1.0) -> float:
    time.sleep(settle_s)
    return round(session.memory_bytes() / MiB, 1)


def _round_trips(
    bench: Bench, cells: int
) -> tuple[dict[str, float], dict[str, float], float, list[float]]:
    """`1+1`'s round trip, and the wire's alone: a ping, answered by the kernel's reader
    thread without IPython or the main thread."""
    starts: list[float] = []
    session = _timed_start(bench, "trips", starts)
    try:
        assert session.execute("1+1", 10)["result"] == "2"
        trips = summary(timed(lambda: session.execute("1+1", 10), cells))
        channel = session.channel
        assert channel is not None  # the session is running
        pings = summary(timed(lambda: channel.call("ping").wait(10), cells))
        idle = _idle_memory(session)
    finally:
        session.stop()
    for n in range(2):  # a few more cold starts for the start-time figure
        _timed_start(bench, f"start-{n}", starts).stop()
    return trips, pings, idle, starts


def _timed_start(bench: Bench, name: str, starts: list[float]) -> GVisorSession:
    started = time.perf_counter()
    session = bench.start(name)
    starts.append((time.perf_counter() - started) * 1000)
    return session


def _pause_resume(bench: Bench, cycles: int) -> dict[str, Any]:
    state_dir = bench.scratch / "pandas"
    session = bench.runtime.start(bench.spec(state_dir))
    session.execute("import pandas as pd\nx = 41", 60)
    memory = _idle_memory(session)
    pauses, resumes, sizes = [], [], []
    for _ in range(cycles):
        pauses.append(_ms(partial(_pause, session)))
        sizes.append((state_dir / CHECKPOINT_DIR / CHECKPOINT_FILE).stat().st_size / MiB)
        started = time.perf_counter()
        session = bench.runtime.resume(bench.spec(state_dir))
        resumes.append((time.perf_counter() - started) * 1000)
        _require(session.memory_restored and session.execute("x + 1", 10)["result"] == "42")
    first_cell = _ms(lambda: session.execute("pd.DataFrame({'a': [1]}).shape", 10))
    session.stop()
    return {
        "pause_ms": summary(pauses),
        "resume_ms": summary(resumes),
        "checkpoint_mb": round(statistics.median(sizes), 1),
        "idle_memory_with_pandas_mb": memory,
        "first_cell_after_resume_ms": round(first_cell, 1),
    }


def _ms(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def _pause(session: GVisorSession) -> None:
    _require(session.pause())


def _require(ok: object) -> None:
    if not ok:
        raise SystemExit("a pause or resume did not keep the session's memory")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--cold-runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as scratch:
        bench = Bench(Path(scratch))
        try:
            trips, pings, idle, starts = _round_trips(bench, args.cells)
            paused = _pause_resume(bench, args.cycles)
        finally:
            bench.runtime.reap()
            bench.runtime.close()  # its parent cgroup, which the worker removes on its way out
    cold = summary(cold_runsc(bench.image.rootfs, args.cold_runs))
    report = {
        "execute_1+1_round_trip_ms": trips,
        "ping_round_trip_ms": pings,
        "session_start_ms": summary(starts),
        "idle_session_memory_mb": idle,
        **paused,
        "cold_runsc_run_ms": cold,
        "cold_runsc_vs_round_trip": round(cold["median_ms"] / trips["median_ms"], 1),
        "resume_vs_cold_runsc": round(paused["resume_ms"]["median_ms"] / cold["median_ms"], 2),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
