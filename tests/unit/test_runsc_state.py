"""`delete` leaves no runsc state behind, even a lock file whose container never got state."""

import shutil
from pathlib import Path

import pytest

from sandcell.runtime.runsc import Runsc


@pytest.mark.skipif(shutil.which("runsc") is None, reason="runsc is not installed")
def test_delete_drops_a_lock_without_state_and_keeps_other_sandboxes(tmp_path: Path) -> None:
    (tmp_path / "sb1_sandbox:sb1.lock").touch()  # the sentry died before runsc wrote state
    (tmp_path / "sb2_sandbox:sb2.lock").touch()
    (tmp_path / "sb2_sandbox:sb2.state").touch()
    runsc = Runsc(str(shutil.which("runsc")), tmp_path)
    assert runsc.has_state("sb1")
    runsc.delete("sb1")
    assert not runsc.has_state("sb1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "sb2_sandbox:sb2.lock",
        "sb2_sandbox:sb2.state",
    ]
