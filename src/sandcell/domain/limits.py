"""The resource budget of one job, and the bounds a tenant may ask for."""

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 60.0
    cpu: float = 1.0
    memory_mb: int = 512
    pids: int = 128
    disk_mb: int = 256
    output_mb: float = 10.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


# Smallest values that still let a Python interpreter start inside gVisor.
FLOOR = Limits(timeout_s=0.1, cpu=0.05, memory_mb=32, pids=4, disk_mb=4, output_mb=0.001)


def out_of_range(requested: dict[str, Any], maximum: Limits) -> dict[str, str]:
    """Field -> message for every requested limit outside [FLOOR, maximum]."""
    problems: dict[str, str] = {}
    for name, value in requested.items():
        low, high = getattr(FLOOR, name), getattr(maximum, name)
        if not low <= value <= high:
            problems[name] = f"must be between {low} and {high}"
    return problems
