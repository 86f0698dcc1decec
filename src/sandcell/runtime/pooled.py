"""The gVisor runtime with warm pools: a job takes a warm sandbox when it can, else it starts cold.

Both paths end the same way: one job per sandbox, every limit watched by the host, every
resource released and verified before `run` returns. `SandboxResult.pooled` says which it was.
"""

import threading
from typing import Any

from sandcell.ports.runtime import PlacedSink, SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime.gvisor import SANDBOX_ID, GVisorRuntime
from sandcell.runtime.pool import WarmPool, pool_refusal
from sandcell.runtime.warm import PooledRun, WarmFactory, WarmSandbox, fit_to_job


def warm_factory(runtime: GVisorRuntime) -> WarmFactory:
    """Warm sandboxes under the runtime's own state dir and cgroup parent (so `reap` sees them)."""
    return WarmFactory(
        runtime.runsc,
        runtime.sandboxes_dir,
        runtime.blanks,
        runtime.cgroup_parent,
        runtime.overhead_mb,
    )


class PooledRuntime:
    name = "gvisor"

    def __init__(self, base: GVisorRuntime, pool: WarmPool[WarmSandbox]) -> None:
        self.base, self.pool = base, pool

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
        run = PooledRun(spec, sink, cancel, self.base.runsc, warm, self.base.overhead_mb)
        try:
            result = run.execute()
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
            fit_to_job(warm, spec.limits, self.base.overhead_mb)
        except OSError:  # the kernel would not lower the limit below what the sandbox holds
            self.pool.discard(warm)
            return None
        return warm

    def pool_figures(self) -> dict[str, Any]:
        return self.pool.figures()

    def reap(self) -> list[str]:
        """Destroy the warm sandboxes, remove a crash's leftovers, then start filling again."""
        self.pool.close()
        removed = self.base.reap()
        self.pool.start()
        return removed

    def close(self) -> None:
        self.pool.close()
        self.base.close()
