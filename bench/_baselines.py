"""Baselines measured in the same run: a bare interpreter and a cold `runsc run`."""

import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PYTHON = "/usr/bin/python3.11"


def timed(action: Callable[[], object], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[max(0, int(len(ordered) * 0.9) - 1)], 1),
        "runs": len(ordered),
    }


def bare_python(runs: int) -> list[float]:
    return timed(
        lambda: subprocess.run([PYTHON, "-c", "print(1)"], check=True, capture_output=True), runs
    )


def cold_runsc(rootfs: Path, runs: int) -> list[float]:
    """`runsc run` of a minimal bundle over the same image root, printing 1."""
    with tempfile.TemporaryDirectory() as scratch:
        bundle = Path(scratch)
        subprocess.run(["runsc", "spec"], cwd=bundle, check=True)
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"] = {"path": str(rootfs), "readonly": True}
        spec["process"].update(terminal=False, args=[PYTHON, "-c", "print(1)"])
        (bundle / "config.json").write_text(json.dumps(spec))
        counter = iter(range(runs))

        def once() -> None:
            name = f"bench-{time.monotonic_ns()}-{next(counter)}"
            subprocess.run(
                [
                    "runsc",
                    "--root",
                    f"{scratch}/state",
                    "--network=none",
                    "run",
                    "--bundle",
                    str(bundle),
                    name,
                ],
                check=True,
                capture_output=True,
                stdin=subprocess.DEVNULL,
            )

        return timed(once, runs)
