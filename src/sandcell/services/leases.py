"""The leases of a worker's running jobs, kept by one thread: each renewed at half-life, and a
caller's cancel request turned into a stop of the job's sandbox.

One thread and one read a second serve every running job together. A thread and a read per
job did the same work once for each: at 16 jobs on 2 cores a job lasts seconds, so that was a
thread to start and join, and a read or three of its row, for every job.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandcell.domain.errors import StoreUnavailable
from sandcell.domain.records import Job
from sandcell.ports.notify import ANY, JOB_CANCEL, Notifier
from sandcell.ports.store import Store

log = logging.getLogger("sandcell.worker")
CANCEL_POLL_S = 1.0  # a look at the store for a cancel its notification missed


@dataclass(frozen=True)
class Held:
    job: Job
    token: int
    done: threading.Event  # set: stop the sandbox (a cancel request, or the lease is lost)
    lost: threading.Event  # set: the lease is gone; nothing of this attempt may be written


class LeaseKeeper:
    def __init__(self, store: Store, notifier: Notifier, lease_s: float, heartbeat_s: float):
        self.store, self.lease_s = store, lease_s
        self.every_s = min(heartbeat_s, CANCEL_POLL_S)
        self._held: dict[str, Held] = {}
        # Held through a whole look, so that once `hold`'s release returns nothing more is
        # done for that job.
        self._lock = threading.Lock()
        self._poke = threading.Event()  # a cancel notification: look now
        self._running = False
        notifier.listen(JOB_CANCEL, self._notified)

    def hold(
        self, job: Job, token: int, done: threading.Event, lost: threading.Event
    ) -> Callable[[], None]:
        """Keep the attempt's lease and relay a cancel as `done`, until the returned function
        is called. The thread runs while any job is held."""
        with self._lock:
            self._held[job.id] = Held(job, token, done, lost)
            if not self._running:
                self._running = True
                threading.Thread(target=self._keep, name="leases", daemon=True).start()

        def release() -> None:
            with self._lock:
                self._held.pop(job.id, None)

        return release

    def _notified(self, payload: str) -> None:  # any thread
        if payload == ANY or payload in self._held:
            self._poke.set()

    def _keep(self) -> None:
        while True:
            self._poke.wait(self.every_s)
            self._poke.clear()  # before the look: a poke from now on means another one
            with self._lock:
                if not self._held:
                    self._running = False
                    return
                self._look(list(self._held.values()))

    def _look(self, held: list[Held]) -> None:
        try:
            cancelled = self.store.cancels_requested([h.job.id for h in held])
            for h in held:
                if h.job.id in cancelled:
                    h.done.set()
                self._renew_if_due(h)
        except StoreUnavailable:
            # Renewed at half-life, a lease has slack: an outage is tried again next tick.
            # Once one has run out, another worker may run its job: stop this one.
            for h in held:
                if time.time() >= (h.job.lease_expires_at or 0) and not h.lost.is_set():
                    log.warning("job %s: lease ran out while the store was unreachable", h.job.id)
                    h.lost.set()
                    h.done.set()

    def _renew_if_due(self, h: Held) -> None:
        if time.time() <= (h.job.lease_expires_at or 0) - self.lease_s / 2:
            return
        asked = time.time()  # the store's expiry counts from here, so does ours
        if not self.store.renew_lease(h.job.id, h.token, asked, self.lease_s):
            h.lost.set()
            h.done.set()
            return
        h.job.lease_expires_at = asked + self.lease_s
