"""Waiting for a job's end inside the event loop, woken by notifications instead of polling."""

import asyncio
import contextlib
from types import TracebackType

from sandcell.ports.notify import ANY, JOB_DONE, Notifier, Unlisten

FALLBACK_S = 1.0
"""A waiter re-reads the job at least this often: a lost notification costs no more."""


class JobEnd:
    """An event set when a notification says `job_id` may have ended; use as a context."""

    def __init__(self, notifier: Notifier, job_id: str) -> None:
        self._notifier = notifier
        self._job_id = job_id
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._unlisten: Unlisten | None = None

    def __enter__(self) -> "JobEnd":
        self._unlisten = self._notifier.listen(JOB_DONE, self._heard)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._unlisten is not None:
            self._unlisten()

    def _heard(self, payload: str) -> None:  # any thread
        if payload in (self._job_id, ANY) and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout_s: float) -> None:
        """Until a notification for the job, or `timeout_s` (at most FALLBACK_S)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), min(timeout_s, FALLBACK_S))
        self._event.clear()
