"""The session runtime port: a long-lived sandbox running an interpreter, cell by cell."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.egress import EgressAttachment

# One execute's answer, as DESIGN.md section 5 names it:
#   {"stdout": str, "stderr": str, "result": str | None,
#    "display": [{"mime": "image/png" | "text/html" | "application/json" | "text/plain",
#                 "data": str (base64 for binary)}],
#    "error": {"ename", "evalue", "traceback": [str]} | None,
#    "execution_count": int, "duration_ms": float, "timed_out": bool, "interrupted": bool}
CellResult = dict[str, Any]
# Streamed pieces of a running cell: {"type": "stdout" | "stderr" | "display", ...}
CellEvent = dict[str, Any]


@dataclass(frozen=True)
class SessionSpec:
    sandbox_id: str  # unique per start or restore
    image: Image
    env: dict[str, str]
    limits: Limits  # timeout_s is not a cell timeout here; execute takes its own
    state_dir: Path  # where the workspace volume and checkpoints of this session live
    egress: EgressAttachment | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class SessionSandbox(Protocol):
    sandbox_id: str
    workspace: Path  # host path of the session's /workspace while it runs

    def execute(
        self, code: str, timeout_s: float, on_event: Callable[[CellEvent], None] | None = None
    ) -> CellResult:
        """Run one cell; past `timeout_s` the cell is interrupted, the session lives on."""

    def interrupt(self) -> None:
        """Stop the running cell (KeyboardInterrupt in the kernel), not the session."""

    def memory_bytes(self) -> int: ...

    def pause(self) -> bool:
        """Stop the sandbox, keeping the workspace; True if process memory was checkpointed."""

    def stop(self) -> bool:
        """Stop and release everything except the state_dir; True once verified."""


class SessionRuntime(Protocol):
    name: str

    def start(self, spec: SessionSpec) -> SessionSandbox: ...

    def resume(self, spec: SessionSpec) -> SessionSandbox:
        """Start again from spec.state_dir: from the memory checkpoint if one is there."""
