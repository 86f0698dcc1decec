"""A runtime with warm pools: a job takes a warm sandbox when it can, else it starts cold.

Both paths end the same way: one job per sandbox, every limit watched by the host, every
resource released and verified before `run` returns. `SandboxResult.pooled` says which it was.
The base runtime (gVisor or bwrap) runs the cold jobs; its warm factory boots the warm
sandboxes, fits one to its job and runs the job in it.
"""

import threading
from typing import Any, Protocol, runtime_checkable

from sandcell.domain.limits import Limits
from sandcell.ports.runtime import (
    HealthReporter,
    PlacedSink,
    SandboxResult,
    SandboxSink,
    SandboxSpec,
)
from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.bwrap_warm import BwrapWarmFactory
from sandcell.runtime.gvisor import SANDBOX_ID, GVisorRuntime
from sandcell.runtime.hand_over import WarmSandbox
from sandcell.runtime.pool import Factory, WarmPool, pool_refusal
from sandcell.runtime.warm import WarmFactory


@runtime_checkable
class JobWarmFactory(Factory[WarmSandbox], Protocol):
    def fit(self, warm: WarmSandbox, limits: Limits) -> None:
        """Tighten the warm sandbox's cgroup to the job's budget; OSError if refused."""

    def run(
        self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event, warm: WarmSandbox
    ) -> SandboxResult:
        """The job in the warm sandbox, to its end and release (see HandOverRun)."""


def warm_factory(runtime: GVisorRuntime | BwrapRuntime) -> JobWarmFactory:
    """Warm sandboxes under the runtime's own state dir and cgroup parent (so `reap` sees them)."""
    if isinstance(runtime, BwrapRuntime):
        return BwrapWarmFactory(runtime)
    return WarmFactory(runtime)


class PooledRuntime:
    def __init__(self, base: GVisorRuntime | BwrapRuntime, pool: WarmPool[WarmSandbox]) -> None:
        if not isinstance(pool.factory, JobWarmFactory):
            raise TypeError("the pool's factory cannot run jobs")
        self.base, self.pool, self.factory = base, pool, pool.factory
        self.name = base.name

    def version(self) -> str:
        return self.base.version()

    def check(self) -> None:
        self.base.check()

    def run(self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event) -> SandboxResult:
        warm = self._take(spec) if SANDBOX_ID.match(spec.sandbox_id) else None
        if warm is None:
            return self.base.run(spec, sink, cancel)
        if isinstance(sink, PlacedSink):
            sink.placed(warm.sandbox_id)
        try:
            result = self.factory.run(spec, sink, cancel, warm)
        finally:
            self.pool.done(warm)
        result.pooled = True
        return result

    def _take(self, spec: SandboxSpec) -> WarmSandbox | None:
        if pool_refusal(spec, self.pool.config.profile) is not None:
            self.pool.refused(spec.image.name)
            return None
        warm = self.pool.take(spec.image)
        if warm is None:
            return None
        try:
            self.factory.fit(warm, spec.limits)
        except OSError:  # the kernel would not lower the limit below what the sandbox holds
            self.pool.discard(warm)
            return None
        return warm

    def pool_figures(self) -> dict[str, Any]:
        return self.pool.figures()

    def health_figures(self) -> dict[str, int]:
        return self.base.health_figures() if isinstance(self.base, HealthReporter) else {}

    def reap(self) -> list[str]:
        """Destroy the warm sandboxes, remove a crash's leftovers, then start filling again."""
        self.pool.close()
        removed = self.base.reap()
        self.pool.start()
        return removed

    def close(self) -> None:
        self.pool.close()
        self.base.close()
