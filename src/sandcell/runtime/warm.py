"""gVisor's warm sandboxes: booted before their job exists, handed one job, destroyed after it.

A warm sandbox (hand_over.py) is a job sandbox made ahead (scratch volume, cgroup, OCI bundle,
`runsc run`) whose program is the guest pool runner instead of the job's. Everything a cold job
gets is there from the start and the same: read-only image root, uid 65534 without
capabilities, the seccomp filter, rlimits, /job, /input, /workspace, /output, the guest
package, and an (empty) guest channel directory. runsc's gofer shows files added to a bind
mount after the sandbox started, so the hand-over's code, inputs and channel socket arrive.
At hand-over the cgroup's memory limit is lowered to the job's (fit_to_job); the rest is a
one-shot SandboxRun, with the hand-over steps of HandOverRun.
"""

import contextlib
import secrets
import subprocess
import threading
from dataclasses import replace
from typing import Any

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime.bundle import oci_config, require_mount_points, write_config
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.ext4 import ScratchError
from sandcell.runtime.fork_watch import ForkWatch
from sandcell.runtime.guest_mounts import ensure_guest_package, oci_guest_mounts
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.hand_over import (
    JOB_SHARES,
    RUNNER_ENV,
    WARM_SHARES,
    HandOverRun,
    WarmSandbox,
    await_warm,
    stop_runner,
)
from sandcell.runtime.launch import in_cgroup
from sandcell.runtime.reap import left_on_host
from sandcell.runtime.runsc import Runsc, RunscError
from sandcell.runtime.sandbox import (
    RUNSC_ENV,
    SandboxRun,
    boot_cpus,
    cgroup_limits,
)

MiB = 1024 * 1024


class WarmFactory:
    """Boots and destroys warm sandboxes under a GVisorRuntime's state dir and cgroup parent."""

    def __init__(self, runtime: GVisorRuntime) -> None:
        self.runtime, self.runsc = runtime, runtime.runsc
        self.cgroup_parent, self.overhead_mb = runtime.cgroup_parent, runtime.overhead_mb

    def boot(
        self, image: Image, profile: Limits, preload: tuple[str, ...], extra_mb: int
    ) -> WarmSandbox:
        """A warm sandbox, its imports done; RuntimeUnavailable (and nothing left) otherwise."""
        sandbox_id = f"pool-{image.name}-{secrets.token_hex(6)}"
        scratch = self.runtime.scratch(sandbox_id)
        cgroup = SandboxCgroup(f"{self.cgroup_parent}/{sandbox_id}")
        self.runtime.ensure_dirs()
        if not scratch.claim():
            raise RuntimeUnavailable(f"sandbox id {sandbox_id} is already in use")
        warm = WarmSandbox(sandbox_id, image, profile, scratch, cgroup, extra_mb)
        try:
            self._prepare(warm, list(preload))
            self._launch(warm)
            await_warm(warm)
        except (OSError, ScratchError, ValueError, RuntimeUnavailable) as exc:
            problems = self.destroy(warm)
            detail = exc.detail if isinstance(exc, RuntimeUnavailable) else str(exc)
            left = f"; not released: {problems}" if problems else ""
            raise RuntimeUnavailable(f"cannot warm a sandbox: {detail}{left}") from exc
        return warm

    def _prepare(self, warm: WarmSandbox, preload: list[str]) -> None:
        warm.scratch.create(None, [], warm.profile.disk_mb)
        warm.channel.mkdir(mode=0o711)
        spec = self._spec(warm, preload)
        config = oci_config(spec, warm.scratch)
        # The runner is the program itself, without the ready wrapper: its ready line comes at
        # hand-over, so the job's clock (and its output) starts there.
        config["process"]["args"] = spec.argv
        ensure_guest_package(spec.image.rootfs)
        config["mounts"] += oci_guest_mounts(spec)
        require_mount_points(config, warm.image.rootfs)
        write_config(config, warm.scratch.bundle)
        overhead = self.overhead_mb + warm.memory_mb_extra
        warm.cgroup.create(cgroup_limits(warm.profile, overhead))
        # Warming yields the CPUs to running jobs; the job gets the ordinary weight back.
        warm.cgroup.set_shares(WARM_SHARES)

    def _spec(self, warm: WarmSandbox, preload: list[str]) -> SandboxSpec:
        argv = warm.runner_argv(tuple(preload))
        return SandboxSpec(
            warm.sandbox_id, warm.image, argv, RUNNER_ENV, warm.profile, guest_channel=warm.channel
        )

    def fit(self, warm: WarmSandbox, limits: Limits) -> None:
        fit_to_job(warm, limits, self.overhead_mb)

    def run(
        self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event, warm: WarmSandbox
    ) -> SandboxResult:
        return PooledRun(spec, sink, cancel, self.runsc, warm, self.overhead_mb).execute()

    def _launch(self, warm: WarmSandbox) -> None:
        warm.forks = ForkWatch(warm.scratch.root / "forks.fifo")
        run = self.runsc.run_argv(
            warm.scratch.bundle,
            warm.sandbox_id,
            warm.scratch.log,
            host_uds=True,
            extra=warm.forks.runsc_flags(),
        )
        warm.forks.start()
        argv = in_cgroup(warm.cgroup, run)
        warm.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=RUNSC_ENV,
            start_new_session=True,
        )

    def destroy(self, warm: WarmSandbox) -> list[str]:
        """Kill and remove everything of a warm sandbox (never handed a job, or done with it)."""
        if warm.forks is not None:
            warm.forks.stop()
        if warm.proc is not None:
            stop_runner(warm, warm.proc, lambda: self._kill_container(warm))
        problems: list[str] = []
        with contextlib.suppress(RunscError):
            if self.runsc.has_state(warm.sandbox_id):
                self.runsc.delete(warm.sandbox_id)
        if not warm.cgroup.kill_all():
            problems.append("processes left in the cgroup")
        elif not warm.cgroup.remove():
            problems.append(f"cgroup {warm.cgroup.relpath}")
        problems += warm.scratch.teardown()
        if self.runsc.has_state(warm.sandbox_id):
            problems.append("runsc container state")
        return problems + left_on_host(warm.sandbox_id, warm.cgroup)

    def _kill_container(self, warm: WarmSandbox) -> None:
        with contextlib.suppress(RunscError):
            self.runsc.kill_all(warm.sandbox_id)


class PooledRun(HandOverRun, SandboxRun):
    """One job in a warm gVisor sandbox: hand-over instead of boot, the rest as a cold run."""

    def __init__(
        self,
        spec: SandboxSpec,
        sink: SandboxSink,
        cancel: Any,
        runsc: Runsc,
        warm: WarmSandbox,
        overhead_mb: int,
    ) -> None:
        spec = replace(spec, sandbox_id=warm.sandbox_id)
        super().__init__(spec, sink, cancel, runsc, warm.scratch, warm.cgroup, overhead_mb)
        self.warm = warm
        assert warm.forks is not None  # watching since the sandbox started
        self.forks = warm.forks


def fit_to_job(warm: WarmSandbox, limits: Limits, overhead_mb: int) -> None:
    """Tighten the warm sandbox's cgroup to the job's budget; OSError if the kernel refuses."""
    memory = (limits.memory_mb + overhead_mb + warm.memory_mb_extra) * MiB
    warm.cgroup.set_memory(memory)
    warm.cgroup.set_cpus(boot_cpus(limits))  # the job's own quota applies at its ready line
    warm.cgroup.set_shares(JOB_SHARES)
