"""What a step found: named checks, each passed or not, with the evidence behind it."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Check:
    name: str
    passed: bool
    evidence: str


@dataclass
class StepResult:
    number: int
    title: str
    checks: list[Check] = field(default_factory=list)
    error: str | None = None  # the step could not finish: what stopped it
    facts: dict[str, Any] = field(default_factory=dict)  # figures for the JSON report
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.passed for c in self.checks)

    def expect(self, name: str, passed: bool, evidence: object) -> bool:
        self.checks.append(Check(name, bool(passed), str(evidence)))
        return bool(passed)


class StepFailed(Exception):
    """A step cannot go on (its evidence says why); the other steps still run."""
