"""Job states and the reasons a job ends the way it does (DESIGN.md section 4)."""

from enum import StrEnum


class JobState(StrEnum):
    ACCEPTED = "accepted"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class Reason(StrEnum):
    EXIT_CODE = "exit_code"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    PIDS = "pids"
    DISK = "disk"
    OUTPUT_LIMIT = "output_limit"
    CANCELLED = "cancelled"
    WORKER_LOST = "worker_lost"
    IMAGE_UNAVAILABLE = "image_unavailable"
    RUNTIME_ERROR = "runtime_error"
    POLICY_DENIED = "policy_denied"
    EXPIRED = "expired"
    INTERNAL = "internal"

    @property
    def state(self) -> JobState:
        """The terminal state a job ending for this reason lands in."""
        return JobState.CANCELLED if self is Reason.CANCELLED else JobState.FAILED
