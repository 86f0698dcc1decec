"""Worker lifecycle as an operator sees it: asking a worker to drain or stop, and its state."""

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from sandcell.domain.records import LIVE_WORKER_S

WorkerState = Literal["running", "draining", "stopping", "stopped", "lost"]


class StopMode(StrEnum):
    DRAIN = "drain"  # claim nothing more, let running jobs finish, then exit
    STOP = "stop"  # claim nothing more, stop sandboxes now, hand their jobs back, exit


@dataclass(frozen=True)
class WorkerStatus:
    id: str
    host: str
    runtime: str
    runtime_version: str
    started_at: float
    seen_at: float
    stopped_at: float | None
    stop_mode: StopMode | None
    stop_requested_at: float | None
    running_jobs: list[str] = field(default_factory=list)

    def state(self, now: float) -> WorkerState:
        """running | draining | stopping | stopped | lost (not seen for LIVE_WORKER_S)."""
        if self.stopped_at is not None:
            return "stopped"
        if self.seen_at < now - LIVE_WORKER_S:
            return "lost"
        if self.stop_mode is StopMode.DRAIN:
            return "draining"
        if self.stop_mode is StopMode.STOP:
            return "stopping"
        return "running"
