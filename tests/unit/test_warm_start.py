"""A server pays its first request's one-off costs as it starts, not in a tenant's call."""

import subprocess
import sys
from pathlib import Path

import pytest

# Run in a fresh interpreter: this one has long loaded anyio's asyncio backend.
PROBE = """
import asyncio, sys
from sandcell.api.internal import create_internal_app
from sandcell.app import build_api
from sandcell.settings import Settings

app = {app}
loaded = lambda: "anyio._backends._asyncio" in sys.modules

async def started() -> bool:
    async with app.router.lifespan_context(app):
        return loaded()

print(loaded(), asyncio.run(started()))
"""
APPS = {
    "api": "build_api(Settings(data_dir=sys.argv[1]))",
    "worker_internal": "create_internal_app(object(), object(), 'token')",
}


@pytest.mark.parametrize("which", sorted(APPS))
def test_a_started_server_has_made_its_first_hop_to_a_thread(which: str, tmp_path: Path) -> None:
    # The hop loads anyio's asyncio backend and starts the first thread: ~25 ms of CPU, and
    # ~80 ms on a busy worker, where a tenant's first session used to pay it.
    probe = PROBE.format(app=APPS[which])
    result = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]  # not before it starts; after, already
