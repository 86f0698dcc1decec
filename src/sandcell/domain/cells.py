"""A session's cell history: what each executed cell was and what it answered, kept server-side
so it outlives the sandbox (and the browser tab that ran it).

A stored cell is capped: each text field to TEXT_CHARS, the whole cell to `cell_chars`
(characters; base64 images count their encoded length). Rich outputs that no longer fit are
replaced by a text/plain note, and `truncated` says something was cut. NUL and unpaired
surrogates become U+FFFD / '?': every store can hold the text, and nothing is interpreted.
"""

import math
from dataclasses import dataclass, field
from typing import Any

from sandcell.domain.errors import SandcellError

TEXT_CHARS = 256 * 1024  # code, stdout, stderr, result, each error field
CELL_CHARS = 2 * 1024 * 1024  # the whole stored cell, rich outputs included
KEEP_CELLS = 100  # the newest cells kept per session
MARKER = "\n[… {cut} more characters not kept in the history]"


@dataclass(frozen=True)
class SessionCell:
    session_id: str
    tenant_id: str
    code: str
    started_at: float
    finished_at: float
    duration_ms: float
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    display: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None  # {"ename", "evalue", "traceback": [str]}
    execution_count: int | None = None
    timed_out: bool = False
    interrupted: bool = False
    truncated: bool = False  # the kernel or the history cut some output
    seq: int = 0  # numbered by the store: 1, 2, … per session


def clean_text(text: str) -> str:
    """Text any store accepts: no NUL, no unpaired surrogates."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


class _Budget:
    """Characters left for one cell; every cut is remembered."""

    def __init__(self, total: int) -> None:
        self.left, self.cut = total, False

    def text(self, value: str, most: int = TEXT_CHARS) -> str:
        value = clean_text(value)
        keep = max(0, min(most, self.left))
        if len(value) > keep:
            self.cut = True
            value = value[:keep] + MARKER.format(cut=len(value) - keep)
        self.left = max(0, self.left - len(value))
        return value

    def lines(self, lines: list[Any]) -> list[str]:
        kept = []
        for number, line in enumerate(lines):
            if not self.left:
                self.cut = True
                kept.append(f"[… {len(lines) - number} more lines not kept in the history]")
                break
            kept.append(self.text(str(line)))
        return kept

    def display(self, items: list[Any], cap: int) -> list[dict[str, Any]]:
        """Rich outputs in order while they fit; then one note for the first that does not
        and however many came after it."""
        items = [item for item in items if isinstance(item, dict)]
        kept = []
        for number, item in enumerate(items):
            mime = clean_text(str(item.get("mime", "")))[:100]
            data = clean_text(str(item.get("data", "")))
            if len(data) > self.left:
                self.cut, rest = True, len(items) - number - 1
                note = f"[{mime} output of {len(data)} characters not kept: over {cap}"
                note += f" per cell{f', nor {rest} later outputs' if rest else ''}]"
                kept.append({"mime": "text/plain", "data": note, "omitted": mime})
                break
            self.left -= len(data)
            kept.append({"mime": mime, "data": data})
        return kept


def _error(budget: _Budget, error: Any) -> dict[str, Any] | None:
    if not isinstance(error, dict):
        return None
    lines = error.get("traceback")
    return {
        "ename": budget.text(str(error.get("ename", "Error")), 1024),
        "evalue": budget.text(str(error.get("evalue", ""))),
        "traceback": budget.lines(lines) if isinstance(lines, list) else [],
    }


def _optional_text(budget: _Budget, value: Any) -> str | None:
    return budget.text(value) if isinstance(value, str) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _duration_ms(reported: Any, started_at: float, finished_at: float) -> float:
    """The kernel's own measure of the cell, else the wall time the service saw."""
    number = isinstance(reported, int | float) and not isinstance(reported, bool)
    if number and math.isfinite(reported) and reported >= 0:
        return float(reported)
    return round((finished_at - started_at) * 1000, 1)


def recorded_cell(
    session_id: str,
    tenant_id: str,
    code: str,
    outcome: dict[str, Any],
    started_at: float,
    finished_at: float,
    cell_chars: int = CELL_CHARS,
) -> SessionCell:
    """The history entry for a cell whose answer (or failure) is `outcome`, capped."""
    budget = _Budget(cell_chars)
    stored_code = budget.text(code)
    error = _error(budget, outcome.get("error"))
    stdout = budget.text(str(outcome.get("stdout") or ""))
    stderr = budget.text(str(outcome.get("stderr") or ""))
    result = _optional_text(budget, outcome.get("result"))
    display = budget.display(list(outcome.get("display") or []), cell_chars)
    return SessionCell(
        session_id=session_id,
        tenant_id=tenant_id,
        code=stored_code,
        started_at=started_at,
        finished_at=finished_at,
        duration_ms=_duration_ms(outcome.get("duration_ms"), started_at, finished_at),
        stdout=stdout,
        stderr=stderr,
        result=result,
        display=display,
        error=error,
        execution_count=_count(outcome.get("execution_count")),
        timed_out=outcome.get("timed_out") is True,
        interrupted=outcome.get("interrupted") is True,
        truncated=budget.cut or outcome.get("truncated") is True,
    )


def failed_outcome(events: list[dict[str, Any]], failure: dict[str, Any]) -> dict[str, Any]:
    """A cell that failed outside the kernel (its sandbox died, its worker went): what it
    streamed before that, and the failure (`{"type", "detail"}`) as its error."""
    streams: dict[str, list[str]] = {"stdout": [], "stderr": []}
    display = []
    for event in events:
        kind = event.get("type")
        if kind in streams:
            streams[str(kind)].append(str(event.get("text", "")))
        elif kind == "display":
            display.append({"mime": event.get("mime", ""), "data": event.get("data", "")})
    error = {"ename": str(failure.get("type", "Error")), "evalue": str(failure.get("detail", ""))}
    text = {name: "".join(parts) for name, parts in streams.items()}
    return text | {"display": display, "error": error | {"traceback": []}}


def error_outcome(exc: SandcellError, events: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell that `exc` ended outside the kernel, after streaming `events`."""
    return failed_outcome(events, {"type": type(exc).__name__, "detail": exc.detail})
