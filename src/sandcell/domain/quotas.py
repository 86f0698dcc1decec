"""What one tenant may hold and how fast it may ask: quotas answer 429 with Retry-After."""

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Quotas:
    concurrent_jobs: int = 16  # accepted + running at once
    sessions: int = 4
    storage_mb: int = 10240  # input files and artifacts together
    jobs_per_minute: float = 600.0  # sustained submission rate
    burst: int = 60  # submissions allowed at once above the rate

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Admission:
    """The checks a submission passes in the same transaction that records it."""

    quotas: Quotas
    now: float
