"""Waiting for a job's end (or its next logs) inside the event loop, woken by notifications
instead of polling."""

import asyncio
import contextlib
from types import TracebackType

from sandcell.ports.notify import ANY, JOB_DONE, Notifier, Unlisten

FALLBACK_S = 1.0
"""A waiter re-reads the job at least this often: a lost notification costs no more."""


class JobEnd:
    """An event set when a notification on `channels` (by default: the job may have ended)
    names `job_id`; use as a context."""

    def __init__(
        self, notifier: Notifier, job_id: str | None, channels: tuple[str, ...] = (JOB_DONE,)
    ) -> None:
        self._notifier = notifier
        self._job_id = job_id  # None: not known yet (a submit's); see expect
        self._channels = channels
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._unlisten: list[Unlisten] = []
        self._heard_before: set[str] = set()  # payloads heard while the id was not known

    def __enter__(self) -> "JobEnd":
        self._unlisten = [self._notifier.listen(c, self._heard) for c in self._channels]
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for unlisten in self._unlisten:
            unlisten()

    def expect(self, job_id: str) -> None:
        """Name the job, once known: what was heard for it since listening counts."""
        self._job_id = job_id
        if self._heard_before & {job_id, ANY}:
            self._event.set()
        self._heard_before.clear()

    def _heard(self, payload: str) -> None:  # any thread
        job_id = self._job_id
        if job_id is not None and payload not in (job_id, ANY):
            return
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._note, payload)

    def _note(self, payload: str) -> None:  # in the loop
        if self._job_id is None:
            self._heard_before.add(payload)
        elif payload in (self._job_id, ANY):
            self._event.set()

    async def wait(self, timeout_s: float) -> None:
        """Until a notification for the job, or `timeout_s` (at most FALLBACK_S)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), min(timeout_s, FALLBACK_S))
        self._event.clear()
