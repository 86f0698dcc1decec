"""How a sandbox's end reaches the caller, on every runtime: a clean end before the release
(ports.runtime.EarlySink), a limit's only once the sandbox is released."""

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from sandcell.domain.states import Reason
from sandcell.ports.runtime import SandboxResult
from tests.integration.conftest import RecordingSink
from tests.security.conftest import AnyRuntime, RunCode


@dataclass
class EarlySink(RecordingSink):
    """Takes a clean end before the release (ports.runtime.EarlySink), noting what it had."""

    scratch: Path | None = None
    early: list[tuple[SandboxResult, dict[str, bytes], str, bool]] = field(default_factory=list)

    def ended(self, result: SandboxResult) -> None:
        assert self.scratch is not None
        unreleased = self.scratch.exists()
        self.early.append((replace(result), dict(self.files), self.stdout, unreleased))


@pytest.mark.parametrize(("code", "exit_code"), [("", 0), ("raise SystemExit(3)", 3)])
def test_a_clean_end_is_reported_before_the_release(
    runtime: AnyRuntime, run_code: RunCode, code: str, exit_code: int
) -> None:
    sandbox_id = f"early-{exit_code}-{time.monotonic_ns()}"
    sink = EarlySink(scratch=runtime.sandboxes_dir / sandbox_id)
    code = "open('/output/made.txt', 'w').write('kept')\nprint('out')\n" + code
    ran = run_code(code, sink=sink, sandbox_id=sandbox_id)
    [(early, files, stdout, unreleased)] = sink.early
    assert unreleased  # its scratch disk was still on the host
    assert (early.exit_code, early.released, early.pooled) == (exit_code, False, False)
    assert files == {"made.txt": b"kept"} and stdout == "out\n"
    result = ran.result
    assert (result.exit_code, result.reason, result.usage) == (
        early.exit_code,
        early.reason,
        early.usage,
    )
    assert result.released


def test_a_limits_end_waits_for_the_release(run_code: RunCode) -> None:
    sink = EarlySink(scratch=Path("/nonexistent"))
    ran = run_code("import time; time.sleep(30)", sink=sink, timeout_s=0.5)
    assert ran.result.reason is Reason.TIMEOUT and ran.result.released
    assert sink.early == []
