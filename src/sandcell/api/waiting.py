"""Waiting for a job's end (or its next logs) inside the event loop, woken by notifications
instead of polling."""

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType

from anyio import to_thread

from sandcell.ports.notify import ANY, JOB_DONE, Notifier, Unlisten

FALLBACK_S = 1.0
"""A waiter hears of its job's end at most this late: a lost notification costs no more."""


class EndSweep:
    """The fallback look of every waiter of this process at once: every FALLBACK_S, one read
    of which awaited jobs have ended, and those jobs' waiters are woken as their notification
    would have woken them. A thousand waiters cost one read a second, not a thousand; and at
    16 jobs on 2 cores, where each waits for seconds, a job no longer costs a read a second.

    Used from the event loop only; its look runs while anyone waits, and ends after.
    """

    def __init__(self, ended_among: Callable[[list[str]], set[str]]) -> None:
        self._ended_among = ended_among
        self._waiters: dict[str, set[JobEnd]] = {}
        self._looking: asyncio.Task[None] | None = None

    def add(self, job_id: str, end: "JobEnd") -> None:
        self._waiters.setdefault(job_id, set()).add(end)
        loop = asyncio.get_running_loop()
        looking = self._looking
        if looking is None or looking.done() or looking.get_loop() is not loop:
            self._looking = loop.create_task(self._look())

    def remove(self, job_id: str, end: "JobEnd") -> None:
        waiters = self._waiters.get(job_id, set())
        waiters.discard(end)
        if not waiters:
            self._waiters.pop(job_id, None)

    async def _look(self) -> None:
        while self._waiters:
            await asyncio.sleep(FALLBACK_S)
            if not self._waiters:
                return
            with contextlib.suppress(Exception):  # the store's trouble: the next look tries again
                for job_id in await to_thread.run_sync(self._ended_among, list(self._waiters)):
                    for end in self._waiters.get(job_id, ()):
                        end.wake()


class JobEnd:
    """An event set when a notification on `channels` (by default: the job may have ended)
    names `job_id`; use as a context."""

    def __init__(
        self,
        notifier: Notifier,
        job_id: str | None,
        channels: tuple[str, ...] = (JOB_DONE,),
        sweep: EndSweep | None = None,
    ) -> None:
        self._notifier = notifier
        self._job_id = job_id  # None: not known yet (a submit's); see expect
        self._channels = channels
        self._sweep = sweep  # without one, `wait` itself wakes every FALLBACK_S
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._unlisten: list[Unlisten] = []
        self._heard_before: set[str] = set()  # payloads heard while the id was not known

    def __enter__(self) -> "JobEnd":
        self._unlisten = [self._notifier.listen(c, self._heard) for c in self._channels]
        if self._sweep is not None and self._job_id is not None:
            self._sweep.add(self._job_id, self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for unlisten in self._unlisten:
            unlisten()
        if self._sweep is not None and self._job_id is not None:
            self._sweep.remove(self._job_id, self)

    def expect(self, job_id: str) -> None:
        """Name the job, once known: what was heard for it since listening counts."""
        self._job_id = job_id
        if self._sweep is not None:
            self._sweep.add(job_id, self)
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

    def wake(self) -> None:  # any thread
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout_s: float) -> None:
        """Until a notification for the job (or the sweep's word), or `timeout_s`; without a
        sweep, at most FALLBACK_S."""
        limit = timeout_s if self._sweep is not None else min(timeout_s, FALLBACK_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), limit)
        self._event.clear()
