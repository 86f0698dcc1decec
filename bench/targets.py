"""Issue 6's targets, each read off a `sandcell bench` report (bench/suite.py) and judged.

The report itself (JSON, on stdout and in --json) holds every figure and its baselines; this is
the verdict a reader wants first, printed to stderr at the end of a run. A target whose figure
the run did not measure (a section left out, or failed) says so instead of passing; one missed
where a baseline of the same run, which the figure cannot go below, is itself past the limit
is "out of reach", with that baseline beside it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MB_PER_MIB = 1.048576


@dataclass(frozen=True)
class Target:
    name: str
    path: tuple[str, ...]  # where the figure is in the report
    limit: float
    at_least: bool = False  # a floor (throughput), not a ceiling (time, memory)
    unit: str = "ms"
    scale: Callable[[float], float] = float  # the report's figure into the target's unit
    floor: tuple[str, ...] | None = None  # a baseline the figure cannot beat (same scale)


TARGETS = [
    Target(
        "pooled print(1), submit -> completed",
        ("trivial", "pooled_vs_python"),
        2.0,
        unit="x python",
    ),
    Target("CSV -> chart from the pool", ("chart", "pooled", "median_ms"), 600),
    Target(
        "session create -> first result, from the pool",
        ("session", "pooled", "create_to_first_result", "median_ms"),
        50,
    ),
    Target(
        "direct 1+1 round trip (http.client)",
        ("session", "pooled", "direct_1+1_stdlib_client", "median_ms"),
        3,
    ),
    Target(
        "direct 1+1 round trip (httpx, as the SDK)",
        ("session", "pooled", "direct_1+1", "median_ms"),
        3,
    ),
    *(
        Target(
            f"gVisor throughput at concurrency {c}",
            ("throughput", "gvisor", f"c{c}", "ratio"),
            0.8,
            at_least=True,
            unit="x raw runsc",
        )
        for c in (1, 4, 16)
    ),
    Target(
        "bwrap throughput at concurrency 16",
        ("throughput", "bwrap", "c16", "jobs_per_s"),
        80,
        at_least=True,
        unit="jobs/s",
    ),
    *(
        Target(
            f"idle pooled {image} sandbox (PSS)",
            ("memory", f"idle_pooled_{image}_pss_mib", "per_sandbox_mib"),
            60,
            unit="MB",
            scale=lambda mib: mib * MB_PER_MIB,
            # The interpreter's own private memory, outside any sandbox, with the pool's imports.
            floor=("memory", f"interpreter_alone_{image}", "anonymous_mib"),
        )
        for image in ("python", "python-data")
    ),
]


def figure(report: dict[str, Any], path: tuple[str, ...]) -> float | None:
    """The number at `path`, or None if the run has none there."""
    value: Any = report
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def verdicts(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, figure, verdict) for each target: "met", "missed", "out of reach (…)" or "not
    measured"."""
    rows = []
    for target in TARGETS:
        bound = f"{'>=' if target.at_least else '<='} {target.limit:g} {target.unit}"
        label = f"{target.name} {bound}"
        value = figure(report, target.path)
        if value is None:
            rows.append((label, "-", "not measured"))
            continue
        scaled = target.scale(value)
        rows.append((label, f"{scaled:.2f} {target.unit}", _verdict(report, target, scaled)))
    return rows


def _verdict(report: dict[str, Any], target: Target, scaled: float) -> str:
    if _within(target, scaled):
        return "met"
    floor = figure(report, target.floor) if target.floor else None
    if floor is not None and not _within(target, target.scale(floor)):
        return f"out of reach (its baseline alone: {target.scale(floor):.2f} {target.unit})"
    return "missed"


def _within(target: Target, scaled: float) -> bool:
    return scaled >= target.limit if target.at_least else scaled <= target.limit


def print_verdicts(report: dict[str, Any]) -> None:
    """The verdicts as a table on stderr (stdout carries the report)."""
    from rich.console import Console
    from rich.table import Table

    table = Table("target", "this run", "verdict", title="issue 6's targets")
    for row in verdicts(report):
        table.add_row(*row)
    Console(stderr=True).print(table)
