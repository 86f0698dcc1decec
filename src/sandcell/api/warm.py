"""What a server's first request would otherwise pay, paid as it starts."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI


@asynccontextmanager
async def warmed(_: FastAPI) -> AsyncIterator[None]:
    """A lifespan: the first hop of a sync route to a thread loads anyio's asyncio backend and
    starts the pool's first thread, ~25 ms of CPU. A worker's internal endpoint is first called
    for a tenant's first session, on a busy process, where that took ~80 ms."""
    await anyio.to_thread.run_sync(lambda: None)
    yield
