"""Calls put off for a moment (a job's start record, its last log lines), for every job of the
process, by one thread.

A job sink defers two writes: the start, so that a short job has it written with its end, and
output that no more output follows, so that it becomes readable without waiting for the end.
A `threading.Timer` each was two threads to start for every job, ~0.2 ms of CPU apiece and
more on a busy host. The calls run one after another: one that waits out a store outage holds
up the others, which could not have been written either.
"""

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("sandcell.worker")
IDLE_S = 5.0  # the thread ends after this long with nothing to call, and starts again on need


class Call:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        """It will not be called, unless it is being called already (as `Timer.cancel`)."""
        self.cancelled = True


class Later:
    def __init__(self) -> None:
        self._due: list[tuple[float, int, Call]] = []
        self._order = itertools.count()  # equal times: first asked, first called
        self._changed = threading.Condition()
        self._running = False

    def call_in(self, delay_s: float, fn: Callable[[], None]) -> Call:
        call = Call(fn)
        with self._changed:
            entry = (time.monotonic() + delay_s, next(self._order), call)
            heapq.heappush(self._due, entry)
            if not self._running:
                self._running = True
                threading.Thread(target=self._serve, name="later", daemon=True).start()
            self._changed.notify()
        return call

    def _serve(self) -> None:
        while (call := self._next()) is not None:
            if call.cancelled:
                continue
            try:
                call.fn()
            except Exception:  # one caller's failure must not end everyone's calls
                log.exception("a deferred call failed")

    def _next(self) -> Call | None:
        """The next call once it is due; None (and the thread ends) after IDLE_S of none."""
        with self._changed:
            while True:
                if not self._due:
                    self._changed.wait(IDLE_S)
                    if not self._due:
                        self._running = False
                        return None
                    continue
                due, _, call = self._due[0]
                now = time.monotonic()
                if due <= now:
                    heapq.heappop(self._due)
                    return call
                self._changed.wait(due - now)


LATER = Later()  # the process's one
