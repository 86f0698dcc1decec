"""The notification port: wake-ups between the API and workers ("a job was queued", "a job ended",
"a job logged", "cancel this job").

A notification is a hint, never the record: whoever wakes re-reads the store, and every waiter
still polls at a modest interval, so a lost notification costs that interval, never correctness.
That is why `notify` never raises and carries only an id.

`LocalNotifier` is the in-process implementation (listeners of one object, in one process); the
cross-process adapters (unix sockets for processes sharing a data dir, PostgreSQL LISTEN/NOTIFY
for scale-out) dispatch through one, and the composition root picks between them.
"""

import logging
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("sandcell.notify")

JOB_QUEUED = "sandcell_job_queued"
"""A job may be claimable now (submitted, or re-queued). Payload: the job id."""

JOB_DONE = "sandcell_job_done"
"""A job may have reached a terminal state. Payload: the job id."""

JOB_LOGS = "sandcell_job_logs"
"""New log chunks of a running job are in the store. Payload: the job id."""

JOB_CANCEL = "sandcell_job_cancel"
"""A running job was asked to stop. Payload: the job id."""

KEY_REVOKED = "sandcell_key_revoked"
"""An API key was revoked: processes that trusted it lately must check it again. Payload: the
key id."""

TENANT_CHANGED = "sandcell_tenant_changed"
"""A tenant's quotas changed: processes that kept it must read it again. Payload: its id."""

CHANNELS = (JOB_QUEUED, JOB_DONE, JOB_LOGS, JOB_CANCEL, KEY_REVOKED, TENANT_CHANGED)

ANY = ""
"""The payload of a wake-up that may concern every job (e.g. after a listener reconnected)."""

Listener = Callable[[str], None]
Unlisten = Callable[[], None]


class Notifier(Protocol):
    def notify(self, channel: str, payload: str = ANY) -> None:
        """Wake every listener of `channel` in every process this notifier reaches; never raises."""

    def listen(self, channel: str, listener: Listener) -> Unlisten:
        """Call `listener(payload)` for each notification on `channel`, from any thread.

        Listeners must be quick and must not block: set an event, schedule a callback.
        Returns the function that removes the listener again.
        """

    def close(self) -> None: ...


class LocalNotifier:
    """Listeners in this process only; also the dispatch table of the cross-process adapters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[str, list[Listener]] = {}

    def notify(self, channel: str, payload: str = ANY) -> None:
        with self._lock:
            listeners = list(self._listeners.get(channel, ()))
        for listener in listeners:
            try:
                listener(payload)
            except Exception:  # one broken listener must not starve the others
                log.exception("notification listener on %s failed", channel)

    def listen(self, channel: str, listener: Listener) -> Unlisten:
        with self._lock:
            self._listeners.setdefault(channel, []).append(listener)

        def unlisten() -> None:
            with self._lock:
                listeners = self._listeners.get(channel, [])
                if listener in listeners:
                    listeners.remove(listener)

        return unlisten

    def listeners(self, channel: str) -> int:
        with self._lock:
            return len(self._listeners.get(channel, ()))

    def close(self) -> None:
        with self._lock:
            self._listeners.clear()


def wake_on(notifier: Notifier, channel: str, event: threading.Event) -> Unlisten:
    """Set `event` on every notification of `channel` (any payload)."""
    return notifier.listen(channel, lambda _payload: event.set())
