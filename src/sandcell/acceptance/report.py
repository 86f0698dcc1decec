"""The acceptance report: one table per step for people, one JSON document for machines."""

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from sandcell.acceptance.checks import StepResult
from sandcell.acceptance.deployment import TERMINAL, JobEntry

LATENCY_NOTES = {
    "ack_ms": "client: POST /v1/jobs sent → 202 received",
    "ready_ms": "server: accepted_at → started_at (queue_ms + start_ms: sandbox ready)",
    "done_ms": "client: POST /v1/jobs sent → terminal state seen (long-poll)",
}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def latency(jobs: list[JobEntry]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in LATENCY_NOTES:
        values = [v for j in jobs if (v := getattr(j, name)) is not None]
        found[name] = {
            "count": len(values),
            **{f"p{q}": percentile(values, q) for q in (50, 90, 99)},
            "measured": LATENCY_NOTES[name],
        }
    return found


def build(url: str, steps: list[StepResult], jobs: list[JobEntry], cleanup: Any) -> dict[str, Any]:
    states: dict[str, int] = {}
    for job in jobs:
        key = "/".join(filter(None, [job.record.get("state"), job.record.get("reason")]))
        states[key] = states.get(key, 0) + 1
    recovery = next((s.facts.get("recovery") for s in steps if s.number == 4), None)
    return {
        "url": url,
        "passed": bool(steps) and all(s.passed for s in steps),
        "load": {
            "submitted": len(jobs),
            "terminal": sum(j.record.get("state") in TERMINAL for j in jobs),
            "completed": states.get("completed", 0),
            "by_outcome": states,
        },
        "failures": [
            {"step": s.number, "check": c.name, "evidence": c.evidence}
            for s in steps
            for c in s.checks
            if not c.passed
        ]
        + [
            {"step": s.number, "check": "step could not finish", "evidence": s.error}
            for s in steps
            if s.error
        ],
        "latency_ms": latency(jobs),
        "recovery": {"passed": _step_passed(steps, 4), **(recovery or {})},
        "steps": [_step_json(s) for s in steps],
        "cleanup": cleanup,
    }


def _step_passed(steps: list[StepResult], number: int) -> bool | None:
    return next((s.passed for s in steps if s.number == number), None)


def _step_json(step: StepResult) -> dict[str, Any]:
    return {
        "step": step.number,
        "title": step.title,
        "passed": step.passed,
        "seconds": round(step.seconds, 1),
        "error": step.error,
        "checks": [
            {"name": c.name, "passed": c.passed, "evidence": c.evidence} for c in step.checks
        ],
        "facts": step.facts,
    }


def print_tables(console: Console, report: dict[str, Any]) -> None:
    for step in report["steps"]:
        verdict = "[green]PASS[/green]" if step["passed"] else "[red]FAIL[/red]"
        table = Table(
            title=f"{verdict} step {step['step']}: {step['title']} ({step['seconds']} s)",
            title_justify="left",
        )
        table.add_column("check")
        table.add_column("result", no_wrap=True)
        table.add_column("evidence", overflow="fold")
        for check in step["checks"]:
            table.add_row(check["name"], _mark(check["passed"]), check["evidence"])
        if step["error"]:
            table.add_row("step could not finish", _mark(False), step["error"])
        console.print(table)
    console.print(_summary(report))


def _summary(report: dict[str, Any]) -> Table:
    table = Table(title="load and latency", title_justify="left")
    for column in ("figure", "p50", "p90", "p99", "n"):
        table.add_column(column)
    for name, figures in report["latency_ms"].items():
        table.add_row(name, *(_ms(figures[f"p{q}"]) for q in (50, 90, 99)), str(figures["count"]))
    load = report["load"]
    table.caption = (
        f"submitted {load['submitted']} jobs, {load['completed']} completed, outcomes "
        f"{load['by_outcome']}; recovery {'passed' if report['recovery']['passed'] else 'FAILED'}"
        f"; {'PASSED' if report['passed'] else 'FAILED'}"
    )
    return table


def _mark(passed: bool) -> str:
    return "[green]pass[/green]" if passed else "[red]fail[/red]"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"
