"""bwrap's warm sandboxes: the same launch chain and isolation as a cold bwrap job, booted ahead.

A warm bwrap sandbox (hand_over.py) is made exactly as a cold one is (bwrap_run.py): its own
scratch disk, cgroup and host uid, the launch chain (cgroups, rlimits, the uid, bwrap with every
namespace, the seccomp filter and the image root read-only), with the guest pool runner as its
program. /job, /input and the guest channel directory are bind mounts of host directories, so
the hand-over's code, inputs and channel socket are seen inside at once. At hand-over the
cgroup is fitted to the job (memory, the job's CPU quota at once, as a cold bwrap job has it);
the rest is a one-shot BwrapRun with the hand-over steps of HandOverRun.

The runner is started by the pool's refill thread: bwrap's --die-with-parent is tied to that
thread, which lives until the pool is closed, and closing the pool destroys every warm
sandbox anyway.
"""

import os
import secrets
import subprocess
import threading
from dataclasses import replace

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.bwrap_run import (
    LAUNCH_ENV,
    BwrapRun,
    args_memfd,
    bwrap_args,
    cgroup_limits,
    chain_fds,
    launcher,
    memfd_with,
    teardown_scratch,
)
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.ext4 import ScratchError
from sandcell.runtime.hand_over import (
    JOB_SHARES,
    RUNNER_ENV,
    WARM_SHARES,
    HandOverRun,
    WarmSandbox,
    await_warm,
    stop_runner,
)
from sandcell.runtime.launch import launch_helper

MiB = 1024 * 1024


class BwrapWarmFactory:
    """Boots and destroys warm sandboxes of a BwrapRuntime (its state dir, cgroup parent and
    uids), and runs one job in each."""

    def __init__(self, runtime: BwrapRuntime) -> None:
        self.runtime = runtime

    def boot(
        self, image: Image, profile: Limits, preload: tuple[str, ...], extra_mb: int
    ) -> WarmSandbox:
        """A warm sandbox, its imports done; RuntimeUnavailable (and nothing left) otherwise."""
        runtime = self.runtime
        sandbox_id = f"pool-{image.name}-{secrets.token_hex(6)}"
        runtime.ensure_dirs()
        scratch = runtime.scratch(sandbox_id)
        if not scratch.claim():
            raise RuntimeUnavailable(f"sandbox id {sandbox_id} is already in use")
        cgroup = SandboxCgroup(f"{runtime.cgroup_parent}/{sandbox_id}")
        warm = WarmSandbox(sandbox_id, image, profile, scratch, cgroup, extra_mb)
        try:
            warm.uid = runtime.uids.take()
            self._prepare(warm)
            self._launch(warm, preload)
            await_warm(warm)
        except (OSError, ScratchError, ValueError, RuntimeUnavailable) as exc:
            problems = self.destroy(warm)
            detail = exc.detail if isinstance(exc, RuntimeUnavailable) else str(exc)
            left = f"; not released: {problems}" if problems else ""
            raise RuntimeUnavailable(f"cannot warm a sandbox: {detail}{left}") from exc
        return warm

    def _prepare(self, warm: WarmSandbox) -> None:
        assert warm.uid is not None
        warm.scratch.let_through()
        warm.scratch.create(None, [], warm.profile.disk_mb)
        for path in (warm.scratch.workspace, warm.scratch.output):
            os.chown(path, warm.uid, warm.uid)  # seen as 65534 inside, and writable only there
        warm.channel.mkdir(mode=0o711)
        overhead = self.runtime.overhead_mb + warm.memory_mb_extra
        warm.cgroup.create(cgroup_limits(warm.profile, overhead))
        # Warming yields the CPUs to running jobs; the job gets the ordinary weight back.
        warm.cgroup.set_shares(WARM_SHARES)

    def _launch(self, warm: WarmSandbox, preload: tuple[str, ...]) -> None:
        assert warm.uid is not None
        spec = SandboxSpec(
            warm.sandbox_id,
            warm.image,
            warm.runner_argv(preload),
            RUNNER_ENV,
            warm.profile,
            guest_channel=warm.channel,
        )
        fds = [seccomp_fd := memfd_with("sandcell-seccomp", self.runtime.seccomp_filter())]
        try:
            fds.append(args_fd := args_memfd(bwrap_args(spec, warm.scratch, seccomp_fd)))
            # The runner is the program itself, without the ready wrapper: its ready line
            # comes at hand-over, so the job's clock (and its output) starts there.
            helper, mounts_fd = launch_helper(), self.runtime.launch_mounts.fd()
            argv = launcher(
                helper, warm.cgroup, warm.uid, warm.profile, args_fd, spec.argv, None, mounts_fd
            )
            warm.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=LAUNCH_ENV,
                pass_fds=chain_fds(fds, mounts_fd),
                start_new_session=True,
            )
        finally:
            for fd in fds:
                os.close(fd)

    def destroy(self, warm: WarmSandbox) -> list[str]:
        """Kill and remove everything of a warm sandbox never handed a job; its uid is given
        back once nothing runs as it."""
        if warm.proc is not None:
            stop_runner(warm, warm.proc)
        problems: list[str] = []
        if not warm.cgroup.kill_all():
            problems.append("processes left in the cgroup")
        elif not warm.cgroup.remove():
            problems.append(f"cgroup {warm.cgroup.relpath}")
        problems += teardown_scratch(warm.scratch, sandbox_gone=not problems)
        if warm.uid is not None and not problems:
            self.runtime.uids.give_back(warm.uid)
        return problems

    def fit(self, warm: WarmSandbox, limits: Limits) -> None:
        """Tighten the cgroup to the job's budget; OSError if the kernel refuses."""
        warm.cgroup.set_memory(
            (limits.memory_mb + self.runtime.overhead_mb + warm.memory_mb_extra) * MiB
        )
        warm.cgroup.set_cpus(limits.cpu)
        warm.cgroup.set_shares(JOB_SHARES)

    def run(
        self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event, warm: WarmSandbox
    ) -> SandboxResult:
        assert warm.uid is not None
        result = PooledBwrapRun(spec, sink, cancel, warm, self.runtime.overhead_mb).execute()
        if result.released:  # a uid something may still run as is never handed out again
            self.runtime.uids.give_back(warm.uid)
        return result


class PooledBwrapRun(HandOverRun, BwrapRun):
    """One job in a warm bwrap sandbox: hand-over instead of launch, the rest as a cold run."""

    def __init__(
        self,
        spec: SandboxSpec,
        sink: SandboxSink,
        cancel: threading.Event,
        warm: WarmSandbox,
        overhead_mb: int,
    ) -> None:
        assert warm.uid is not None
        super().__init__(
            replace(spec, sandbox_id=warm.sandbox_id),
            sink,
            cancel,
            scratch=warm.scratch,
            cgroup=warm.cgroup,
            uid=warm.uid,
            seccomp=b"",  # in force since the sandbox started
            helper="",  # launched already
            overhead_mb=overhead_mb,
        )
        self.warm = warm
