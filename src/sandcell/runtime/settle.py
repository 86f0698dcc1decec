"""Waiting for the kernel to finish what it does after a sandbox exits (a loop device let go,
the sandbox's last host process gone): look again at growing intervals.

On a busy host that can take a while (~0.4 s for a loop device with 16 sandboxes on 2 cores),
and a look every 10 ms cost more CPU than the rest of the release did (~30 looks a sandbox).
"""

import time
from collections.abc import Callable

FIRST_LOOK_S, MAX_LOOK_S = 0.005, 0.05


def settled(done: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `done()` came true within `timeout_s`; it is asked at once, then after 5, 10,
    20, 40 and every 50 ms."""
    deadline = time.monotonic() + timeout_s
    pause = FIRST_LOOK_S
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, MAX_LOOK_S)
    return True
