"""Warm pools: per image, a few sandboxes booted ahead with the image's heavy imports done.

Each pool keeps up to its size of warm sandboxes (see warm.py) for one image and one limits
profile (the configured defaults). A pooled sandbox serves exactly one job and is destroyed
after it, like a cold one; the pool only moves the boot (and `import pandas`) out of the job's
time. One background thread refills: one sandbox at a time, never beyond the memory bound
(the measured memory of the warm sandboxes, plus the expected size of the next one), and
not for an image that has had no job for `idle_s` — an idle pool is emptied, and fills
again with that image's next job.

The pool is generic over what it keeps warm (a `Warm` made by a `Factory`): job sandboxes
(warm.py) and session kernels (session_pool.py) share the refill, the memory bound, the idle
shrink and the counters.

What a pooled sandbox cannot honour goes cold (`pool_refusal`): the network (egress is
mounted at boot), a retry's restored outputs, a command instead of code, limits that are
fixed at boot (pids: RLIMIT_NPROC; disk_mb: the scratch volume), and an environment that
python reads only as it starts (`started_with`). Memory and CPU are tightened at hand-over;
the timeout and the output cap are the host's to watch anyway.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sandcell.domain.errors import RuntimeUnavailable, SandcellError
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.images import ImageCatalog
from sandcell.ports.runtime import SandboxSpec
from sandcell.runtime.hand_over import RUNNER_ENV

log = logging.getLogger("sandcell.runtime.pool")
MiB = 1024 * 1024
# What a pool runner imports before its job comes, per image (others: nothing beyond python).
PRELOADS: dict[str, tuple[str, ...]] = {
    "python-data": ("numpy", "pandas", "matplotlib", "matplotlib.pyplot"),
}
# The imports' memory, given to the cgroup on top of the job's memory_mb (it is ours: a job
# that never imports pandas must not lose that much of its budget to it).
PRELOAD_MB = {"python-data": 128}
# The expected memory of a warm sandbox before one of that image was measured.
FIRST_GUESS_MB = {"python-data": 200}
DEFAULT_GUESS_MB = 64
BACKOFF_S, BACKOFF_MAX_S = 2.0, 60.0
# A refill boots a sandbox (runsc, mkfs, imports: CPU work) and would slow the very job that
# took the last warm one; it waits until that job is done, or this long at most.
YIELD_S = 1.0


class Warm(Protocol):
    """Something booted ahead for one image and limits profile; used once, then destroyed."""

    sandbox_id: str
    image: Image
    profile: Limits

    def alive(self) -> bool: ...

    def memory_bytes(self) -> int: ...


W = TypeVar("W", bound=Warm)


class Factory(Protocol[W]):
    def boot(self, image: Image, profile: Limits, preload: tuple[str, ...], extra_mb: int) -> W:
        """A warm one, its preloads done; RuntimeUnavailable (and nothing left) otherwise."""

    def destroy(self, warm: W) -> list[str]:
        """Kill and remove everything of it; return what could not be released."""


@dataclass(frozen=True)
class PoolConfig:
    sizes: dict[str, int]  # image name -> warm sandboxes to keep; 0 or absent: no pool
    profile: Limits  # the limits every pooled sandbox is booted with (the defaults)
    memory_mb: int = 1024  # all warm sandboxes together, measured
    idle_s: float = 600.0  # an image without a job for this long has its pool emptied
    tick_s: float = 0.5  # how often the refill thread looks, when nothing wakes it
    # What a warm one imports before use, and the memory that takes, per image.
    preloads: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(PRELOADS))
    preload_mb: dict[str, int] = field(default_factory=lambda: dict(PRELOAD_MB))


# The runner is started with RUNNER_ENV; the job's own environment replaces it at hand-over.
# These three the runner then applies itself (pool_runner.become); every other PYTHON*
# variable (the hash seed, warnings, -O, dev mode, the int digit limit...) python reads only
# as it starts, so a job that sets one runs cold.
APPLIED_AT_HAND_OVER = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})
# Also fixed in a started runner: the locale's encodings (python, at start) and matplotlib's
# backend and config dir (at its import, for images that preload it).
FIXED_AT_START = ("LANG", "LC_ALL", "LC_CTYPE", "MPLBACKEND", "MPLCONFIGDIR")


def started_with(env: dict[str, str]) -> bool:
    """Whether `env` sets something a started runner can no longer take."""
    python = any(name.startswith("PYTHON") and name not in APPLIED_AT_HAND_OVER for name in env)
    fixed = any(name in env and env[name] != RUNNER_ENV.get(name) for name in FIXED_AT_START)
    return python or fixed


def pool_refusal(spec: SandboxSpec, profile: Limits) -> str | None:
    """Why `spec` cannot run in a warm sandbox booted with `profile`; None if it can."""
    limits = spec.limits
    checks = [
        (spec.egress is not None, "network"),
        (bool(spec.restore_outputs), "restored outputs"),
        (spec.code is None or spec.argv != [spec.image.python, "/job/main.py"], "command"),
        (started_with(spec.env), "env"),
        (limits.pids != profile.pids, "pids"),
        (limits.disk_mb != profile.disk_mb, "disk_mb"),
        (limits.memory_mb > profile.memory_mb, "memory_mb"),
    ]
    return next((why for refused, why in checks if refused), None)


@dataclass
class PoolStats:
    hits: int = 0
    misses: int = 0  # a job the pool could have served, but had nothing warm for
    refused: int = 0  # a job the pool cannot serve (its limits, network...): cold
    booted: int = 0
    boot_failures: int = 0
    memory_blocked: int = 0  # refills put off by the memory bound
    shrunk: int = 0  # warm sandboxes destroyed because their image was idle
    by_image: dict[str, dict[str, int]] = field(default_factory=dict)


class WarmPool(Generic[W]):
    def __init__(
        self,
        factory: Factory[W],
        images: ImageCatalog,
        config: PoolConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factory, self.images, self.config, self.clock = factory, images, config, clock
        self.stats = PoolStats()
        self._ready: dict[str, deque[W]] = {name: deque() for name in config.sizes}
        self._demand = {name: clock() for name in config.sizes}  # last job of each image
        self._expected_mb = {n: FIRST_GUESS_MB.get(n, DEFAULT_GUESS_MB) for n in config.sizes}
        self._not_before: dict[str, float] = {}  # boot backoff after a failure
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._in_use: dict[str, float] = {}  # sandbox id -> when it was taken, until `done`

    # the runtime's side

    def start(self) -> None:
        if self._thread is not None or not any(self.config.sizes.values()):
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._refill_loop, name="warm-pool", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop refilling and destroy every warm sandbox."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            every = [warm for ready in self._ready.values() for warm in ready]
            for ready in self._ready.values():
                ready.clear()
        self._destroy(every)

    def take(self, image: Image) -> W | None:
        """A warm sandbox for a job of `image`, or None (the job goes cold).

        The sandbox is the caller's from here on: run it (PooledRun) or `discard` it.
        """
        self.note_demand(image.name)
        stale: list[W] = []
        found = None
        with self._lock:
            ready = self._ready.get(image.name, deque())
            while ready and found is None:
                warm = ready.popleft()
                usable = warm.alive() and warm.image.digest == image.digest
                if usable and warm.profile == self.config.profile:
                    found = warm
                else:
                    stale.append(warm)  # died while idle, or the image was rebuilt
            self._count("hits" if found else "misses", image.name)
            if found is not None:
                self._in_use[found.sandbox_id] = time.monotonic()
        self._destroy(stale)
        self._wake.set()  # refill what was taken (or found dead)
        return found

    def refused(self, image_name: str) -> None:
        self.note_demand(image_name)
        with self._lock:
            self._count("refused", image_name)

    def note_demand(self, image_name: str) -> None:
        if image_name in self._demand:
            self._demand[image_name] = self.clock()

    def done(self, warm: W) -> None:
        """The job that took `warm` has ended (and released it): refill now."""
        with self._lock:
            self._in_use.pop(warm.sandbox_id, None)
        self._wake.set()

    def discard(self, warm: W) -> None:
        self._destroy([warm])
        self.done(warm)

    def ready_count(self, image_name: str) -> int:
        with self._lock:
            return len(self._ready.get(image_name, ()))

    def ready_ids(self, image_name: str) -> list[str]:
        """The sandbox ids of the warm sandboxes of `image_name`, next to be taken first."""
        with self._lock:
            return [warm.sandbox_id for warm in self._ready.get(image_name, ())]

    def memory_bytes(self) -> int:
        """What the warm sandboxes hold now, measured in their cgroups."""
        with self._lock:
            every = [warm for ready in self._ready.values() for warm in ready]
        return sum(warm.memory_bytes() for warm in every)

    def snapshot(self) -> dict[str, object]:
        """Sizes, memory and counters, for /metrics and the bench."""
        sizes = {name: self.ready_count(name) for name in self.config.sizes}
        return {
            "ready": sizes,
            "target": dict(self.config.sizes),
            "memory_bytes": self.memory_bytes(),
            "stats": self.stats,
        }

    def figures(self) -> dict[str, Any]:
        """`snapshot`, JSON-safe and in the shape of ports.runtime.PoolReporter."""
        with self._lock:
            stats = self.stats
            by_image = {name: dict(counts) for name, counts in stats.by_image.items()}
            totals = {"shrunk": stats.shrunk, "boot_failures": stats.boot_failures}
        per = {
            what: {name: counts.get(what, 0) for name, counts in by_image.items()}
            for what in ("hits", "misses", "refused")
        }
        return {
            "ready": {name: self.ready_count(name) for name in self.config.sizes},
            "target": dict(self.config.sizes),
            "memory_bytes": self.memory_bytes(),
            "memory_limit_bytes": self.config.memory_mb * MiB,
            **per,
            **totals,
        }

    # the refill thread

    def _refill_loop(self) -> None:
        while not self._stop.is_set():
            self._yield_to_jobs()
            try:
                self._refill_once()
            except Exception:  # never let the thread die: the pool would silently run dry
                log.exception("warm pool refill failed")
            self._wake.wait(self.config.tick_s)
            self._wake.clear()

    def _yield_to_jobs(self) -> None:
        """Wait while a job taken from the pool less than YIELD_S ago is still running."""
        while not self._stop.is_set():
            with self._lock:
                now = time.monotonic()  # real time, whatever clock drives the idle shrink
                recent = {k: at for k, at in self._in_use.items() if now - at < YIELD_S}
                self._in_use = recent  # a session keeps its kernel: forget it after YIELD_S
            if not recent:
                return
            self._wake.wait(YIELD_S - (now - min(recent.values())))
            self._wake.clear()

    def _refill_once(self) -> None:
        self._drop_dead()
        self._shrink_idle()
        for name, size in self.config.sizes.items():
            while not self._stop.is_set() and self._wants(name, size):
                if not self._memory_allows(name):
                    with self._lock:
                        self.stats.memory_blocked += 1
                    break
                if not self._boot_one(name):
                    break

    def _wants(self, name: str, size: int) -> bool:
        now = self.clock()
        idle = now - self._demand[name] > self.config.idle_s
        return not idle and now >= self._not_before.get(name, 0.0) and self.ready_count(name) < size

    def _memory_allows(self, name: str) -> bool:
        expected = self._expected_mb[name] * MiB
        return self.memory_bytes() + expected <= self.config.memory_mb * MiB

    def _boot_one(self, name: str) -> bool:
        try:
            image = self.images.get(name)
            warm = self.factory.boot(
                image,
                self.config.profile,
                self.config.preloads.get(name, ()),
                self.config.preload_mb.get(name, 0),
            )
        except (RuntimeUnavailable, SandcellError, OSError) as exc:
            self._failed(name, exc)
            return False
        self._failures.pop(name, None)
        self._expected_mb[name] = max(1, warm.memory_bytes() // MiB)
        with self._lock:
            self._ready[name].append(warm)
            self.stats.booted += 1
        return True

    def _failed(self, name: str, exc: Exception) -> None:
        count = self._failures[name] = self._failures.get(name, 0) + 1
        delay = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (count - 1))
        self._not_before[name] = self.clock() + delay
        with self._lock:
            self.stats.boot_failures += 1
        log.warning("warm pool for %s: %s (again in %.0f s)", name, exc, delay)

    def _drop_dead(self) -> None:
        dead: list[W] = []
        with self._lock:
            for ready in self._ready.values():
                dead += [warm for warm in ready if not warm.alive()]
                kept = [warm for warm in ready if warm.alive()]
                ready.clear()
                ready.extend(kept)
        self._destroy(dead)

    def _shrink_idle(self) -> None:
        now, idle = self.clock(), list[W]()
        with self._lock:
            for name, ready in self._ready.items():
                if ready and now - self._demand[name] > self.config.idle_s:
                    idle += ready
                    ready.clear()
        self._destroy(idle)
        with self._lock:
            self.stats.shrunk += len(idle)  # counted once released

    def _destroy(self, warms: list[W]) -> None:
        for warm in warms:
            problems = self.factory.destroy(warm)
            if problems:
                log.warning("warm sandbox %s not released: %s", warm.sandbox_id, problems)

    def _count(self, what: str, image_name: str) -> None:
        setattr(self.stats, what, getattr(self.stats, what) + 1)
        per = self.stats.by_image.setdefault(image_name, {})
        per[what] = per.get(what, 0) + 1
