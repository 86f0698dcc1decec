"""Riding out a short store outage (a database restart, a failover) instead of failing work.

Only for calls that are safe to repeat: reads, and writes that are fenced or idempotent
(see the store's StoreUnavailable: a write may have committed before the connection died).
"""

import time
from collections.abc import Callable
from typing import TypeVar

from sandcell.domain.errors import StoreUnavailable

T = TypeVar("T")
FIRST_DELAY_S, MAX_DELAY_S = 0.05, 1.0


def patiently(call: Callable[[], T], patience_s: float) -> T:
    """`call()`, repeated while the store is unavailable, for up to about `patience_s`."""
    deadline = time.monotonic() + patience_s
    delay = FIRST_DELAY_S
    while True:
        try:
            return call()
        except StoreUnavailable:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = next_delay(delay)


def next_delay(delay: float) -> float:
    """Exponential backoff, from FIRST_DELAY_S up to MAX_DELAY_S."""
    return min(max(delay * 2, FIRST_DELAY_S), MAX_DELAY_S)
