"""Sessions: a stateful interpreter in one sandbox, driven cell by cell."""

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class SessionState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        return self in (SessionState.STOPPED, SessionState.FAILED)


@dataclass
class Session:
    id: str
    tenant_id: str
    state: SessionState
    spec: dict[str, Any]  # image, limits, env, network, secrets: fixed at creation
    created_at: float
    last_used_at: float
    expires_at: float  # hard TTL
    idle_timeout_s: float
    worker_id: str | None = None
    paused_at: float | None = None
    memory_kept: bool | None = None  # after a pause: was process memory checkpointed?
    stopped_at: float | None = None
    reason: str | None = None  # why it stopped: "stopped", "idle_timeout", "ttl", "error"
    detail: str = ""
    executions: int = 0
    pooled: bool = False  # its kernel was pre-started by a session pool (see session_pool.py)
    sandbox_id: str | None = None  # the sandbox it runs in now, or ran in last
    extra: dict[str, Any] = field(default_factory=dict)
