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
# Where the runtime mounts the guest package (sandcell/guest, read-only) inside the sandbox;
# images create the empty mount point, so an image's digest never covers the kernel's code.
GUEST_PACKAGE_DIR = "/opt/sandcell"


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
    memory_restored: bool  # `resume` brought back the checkpointed memory (not a fresh kernel)

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

    def http(
        self, port: int, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """One HTTP/1.1 exchange with a server the session runs on 127.0.0.1:`port`.

        Works while a cell runs. Raises PreviewUnavailable when nothing answers there.
        """


class SessionRuntime(Protocol):
    name: str

    def start(self, spec: SessionSpec) -> SessionSandbox: ...

    def resume(self, spec: SessionSpec) -> SessionSandbox:
        """Start again from spec.state_dir: from the memory checkpoint if one is there."""


class SessionPool(Protocol):
    """Kernels started before their session: `take` hands one over, or None (start cold)."""

    def take(self, spec: SessionSpec) -> SessionSandbox | None: ...

    def pool_figures(self) -> dict[str, Any]:
        """For the worker's heartbeat; the shape of ports.runtime.PoolReporter."""

    def close(self) -> None:
        """Stop refilling and destroy every kernel not handed over."""
