"""Waiting for one file descriptor to become readable, whatever its number.

A worker running 16 sandboxes holds hundreds of descriptors at its busiest (pipes, pidfds,
memfds, its database connections), so their numbers pass 1024, where `select.select` refuses
them (FD_SETSIZE). poll(2) has no such ceiling.
"""

import math
import select


def readable(fd: int, timeout_s: float | None) -> bool:
    """Whether `fd` is readable (or at its end, or closed by the peer) within `timeout_s`
    seconds (None: for as long as it takes; 0: right now)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    # Rounded up: a wait of a fraction of a millisecond must not become a busy loop.
    timeout_ms = None if timeout_s is None else max(0, math.ceil(timeout_s * 1000))
    return bool(poller.poll(timeout_ms))
