"""Warm sandboxes: booted before their job exists, handed one job, destroyed after it.

A warm sandbox is a job sandbox made ahead (scratch volume, cgroup, OCI bundle, `runsc run`)
whose program is the guest pool runner (sandcell.guest.pool_runner) instead of the job's: it
imports the image's heavy modules and waits for one job on its stdin. Everything a cold job
gets is there from the start and the same: read-only image root, uid 65534 without
capabilities, the seccomp filter, rlimits, /job, /input, /workspace, /output, the guest
package, and an (empty) guest channel directory.

At hand-over (PooledRun) the host writes the code to /job/main.py, copies the inputs into
/input and links the job's guest channel socket into the channel directory — runsc's gofer
shows files added to a bind mount after the sandbox started — then lowers the cgroup's memory
limit to the job's, and writes the job (argv, env) to the runner's stdin. The runner prints the
ready line and runs the code; from there on it is a one-shot SandboxRun: the same limit
watching, reasons, output collection and verified release. When the code is done, the runner
says so with its exit lines (streams.py) and waits for its stdin to close: the host decides
and reports the job's end first, then lets the runner exit and gVisor tear the sandbox down.
"""

import contextlib
import json
import logging
import os
import secrets
import select
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import (
    GUEST_CHANNEL_SOCKET,
    EarlySink,
    SandboxResult,
    SandboxSink,
    SandboxSpec,
)
from sandcell.ports.sessions import GUEST_PACKAGE_DIR
from sandcell.runtime.bundle import check_env, oci_config, require_mount_points, write_config
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.ext4 import BlankDisks, ScratchError
from sandcell.runtime.fork_watch import ForkWatch
from sandcell.runtime.guest_mounts import oci_guest_mounts
from sandcell.runtime.reap import wait_until_gone
from sandcell.runtime.runsc import Runsc, RunscError
from sandcell.runtime.sandbox import (
    JOIN_CGROUPS,
    RUNSC_ENV,
    SandboxRun,
    boot_cpus,
    cgroup_limits,
)
from sandcell.runtime.scratch import Scratch
from sandcell.runtime.streams import Streams

log = logging.getLogger("sandcell.runtime.pool")
MiB = 1024 * 1024
WARM_MARKER = b"\x1esandcell-warm "  # the runner's line once its imports are done
WARM_TIMEOUT_S = 60.0  # runsc boot plus the image's imports (pandas: ~2 s alone), on a busy host
MAX_WARM_LINE = 4096
EXIT_WAIT_S = 5.0
WARM_SHARES, JOB_SHARES, TEARDOWN_SHARES = 128, 1024, 2  # cpu.shares (2: the kernel's least)
GUEST_PARENT, GUEST_NAME = str(Path(GUEST_PACKAGE_DIR).parent), Path(GUEST_PACKAGE_DIR).name
RUNNER_BOOT = (
    f"import sys; sys.path.insert(0, {GUEST_PARENT!r}); "
    f"from {GUEST_NAME}.pool_runner import main; main()"
)
# The runner's own environment until the job's replaces it. matplotlib reads its backend and
# config dir at import: headless Agg, and a cache in the sandbox's /tmp (its own memory).
RUNNER_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/workspace",
    "MPLBACKEND": "Agg",
    "MPLCONFIGDIR": "/tmp/.matplotlib",
}


@dataclass
class WarmSandbox:
    sandbox_id: str
    image: Image
    profile: Limits
    scratch: Scratch
    cgroup: SandboxCgroup
    memory_mb_extra: int  # what the cgroup gets on top of the profile's memory for the imports
    proc: subprocess.Popen[bytes] | None = None
    warm_at: float = 0.0  # monotonic; when the runner said its imports were done
    failed_imports: tuple[str, ...] = ()
    forks: ForkWatch | None = None  # started with the sandbox; the job's run reads it

    @property
    def channel(self) -> Path:
        return self.scratch.root / "channel"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def memory_bytes(self) -> int:
        """What the sandbox holds now (sentry, gofer, runner), less reclaimable file cache."""
        stat = self.cgroup.memory_stat()
        return max(0, stat["usage"] - stat.get("total_inactive_file", 0))


class WarmFactory:
    """Boots and destroys warm sandboxes under a GVisorRuntime's state dir and cgroup parent."""

    def __init__(
        self,
        runsc: Runsc,
        sandboxes_dir: Path,
        blanks: BlankDisks,
        cgroup_parent: str,
        overhead_mb: int,
    ) -> None:
        self.runsc, self.sandboxes_dir, self.blanks = runsc, sandboxes_dir, blanks
        self.cgroup_parent, self.overhead_mb = cgroup_parent, overhead_mb

    def boot(
        self, image: Image, profile: Limits, preload: tuple[str, ...], extra_mb: int
    ) -> WarmSandbox:
        """A warm sandbox, its imports done; RuntimeUnavailable (and nothing left) otherwise."""
        sandbox_id = f"pool-{image.name}-{secrets.token_hex(6)}"
        scratch = Scratch(self.sandboxes_dir / sandbox_id, self.blanks)
        cgroup = SandboxCgroup(f"{self.cgroup_parent}/{sandbox_id}")
        self.sandboxes_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not scratch.claim():
            raise RuntimeUnavailable(f"sandbox id {sandbox_id} is already in use")
        warm = WarmSandbox(sandbox_id, image, profile, scratch, cgroup, extra_mb)
        try:
            self._prepare(warm, list(preload))
            self._launch(warm)
            self._await_warm(warm)
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
        config["mounts"] += oci_guest_mounts(spec)
        require_mount_points(config, warm.image.rootfs)
        write_config(config, warm.scratch.bundle)
        overhead = self.overhead_mb + warm.memory_mb_extra
        warm.cgroup.create(cgroup_limits(warm.profile, overhead))
        # Warming yields the CPUs to running jobs; the job gets the ordinary weight back.
        warm.cgroup.set_shares(WARM_SHARES)

    def _spec(self, warm: WarmSandbox, preload: list[str]) -> SandboxSpec:
        argv = [warm.image.python, "-c", RUNNER_BOOT, *preload]
        return SandboxSpec(
            warm.sandbox_id, warm.image, argv, RUNNER_ENV, warm.profile, guest_channel=warm.channel
        )

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
        argv = [*JOIN_CGROUPS, *map(str, warm.cgroup.procs_files()), "--", *run]
        warm.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=RUNSC_ENV,
            start_new_session=True,
        )

    def _await_warm(self, warm: WarmSandbox) -> None:
        assert warm.proc is not None and warm.proc.stdout is not None
        line = _read_line(warm.proc.stdout.fileno(), WARM_TIMEOUT_S)
        if not line.startswith(WARM_MARKER):
            said = _available(warm.proc)
            raise RuntimeUnavailable(f"the pool runner did not come up: {said!r} {line[:200]!r}")
        try:
            failed = json.loads(line[len(WARM_MARKER) :]).get("failed", [])
        except (ValueError, AttributeError):
            failed = []
        warm.failed_imports = tuple(str(name) for name in failed)
        if warm.failed_imports:
            log.warning("pool runner of %s could not import %s", warm.image.name, failed)
        warm.warm_at = time.monotonic()

    def destroy(self, warm: WarmSandbox) -> list[str]:
        """Kill and remove everything of a warm sandbox (never handed a job, or done with it)."""
        if warm.forks is not None:
            warm.forks.stop()
        if warm.proc is not None:
            self._stop(warm, warm.proc)
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
        return problems + wait_until_gone(warm.sandbox_id)

    def _stop(self, warm: WarmSandbox, proc: subprocess.Popen[bytes]) -> None:
        """End the sandbox's `runsc run`: EOF for an idle runner, then kill if need be."""
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # an idle runner exits on EOF
        if not _wait(proc, 0.5):
            with contextlib.suppress(RunscError):
                self.runsc.kill_all(warm.sandbox_id)
            if not _wait(proc, EXIT_WAIT_S):
                warm.cgroup.kill_all()
                _wait(proc, EXIT_WAIT_S)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


class PooledRun(SandboxRun):
    """One job in a warm sandbox: hand-over instead of boot, the rest as a cold run."""

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
        self.cpu_before = 0.0

    def _prepare(self) -> None:
        spec = self.spec
        check_env(spec.env)
        self.scratch.fill(spec.code, spec.inputs)
        if spec.guest_channel is not None:
            os.link(
                spec.guest_channel / GUEST_CHANNEL_SOCKET, self.warm.channel / GUEST_CHANNEL_SOCKET
            )
        self.cpu_before = self.cgroup.usage().get("cpu_s", 0.0)

    def _launch(self) -> Streams:
        proc = self.warm.proc
        assert proc is not None and proc.stdin is not None
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.launched_at = time.monotonic()
        job = {"argv": self.spec.argv, "env": self.spec.env, "cwd": "/workspace"}
        proc.stdin.write(json.dumps(job).encode() + b"\n")
        # Kept open: the runner exits when it closes, once the job's result is taken.
        proc.stdin.flush()  # BrokenPipeError (an OSError) if the runner is gone
        cap = int(self.limits.output_mb * MiB)
        self.streams = Streams(proc.stdout, proc.stderr, self.sink, cap, exit_lines=True)
        self.streams.start()
        return self.streams

    def _program_done(self, streams: Streams) -> bool:
        return streams.exit_status is not None

    def _wait_exit(self, streams: Streams) -> int:
        """The job's exit status: the one the runner's exit lines gave, if they came (a job
        that printed the line and goes on is killed after EXIT_WAIT_S: not its own status)."""
        self._let_runner_exit()
        code = super()._wait_exit(streams)
        said = streams.exit_status
        return code if said is None else said

    def _release(self) -> list[str]:
        self._let_runner_exit()
        return super()._release()

    def _let_runner_exit(self) -> None:
        """Close the runner's stdin: having said the job's end, it waits for this to exit.

        gVisor's teardown then takes some 10 ms of CPU on the host; at the lowest weight it
        waits for the service's own work (answering for the job just reported) instead.
        """
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.cgroup.set_shares(TEARDOWN_SHARES)
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def _tick(self, streams: Streams) -> None:
        if streams.ended.is_set():  # both pipes closed without exit lines: only the exit tells
            super()._tick(streams)
        elif not self._waited_for_start(streams):
            streams.ended.wait(self._wait_s(streams))  # the runner's exit lines end it at once

    def _early_result(self, streams: Streams) -> SandboxResult | None:
        """The job's end as the runner's exit lines tell it, reported before gVisor's teardown.

        Decided as after the exit: every limit's counter can be read while the sandbox lives,
        and what the job wrote to /output is on the host already (gVisor writes a mount's
        files through: shared file access, mapped files too). Only a clean end is reported
        early, so a limit's reason is still recorded with the release verified.
        """
        status = streams.exit_status
        if status is None or self.kill_reason is not None or not isinstance(self.sink, EarlySink):
            return None
        result = self._decide(streams, status)
        if result.reason not in (None, Reason.EXIT_CODE):
            return None
        self._take_usage(streams)
        self._collect(streams)
        if streams.error is not None:
            return None  # the sink failed while collecting: the ordinary end reports it
        result.usage, result.pooled = self._usage_now(), True
        self.sink.ended(result)
        return result

    def _take_usage(self, streams: Streams) -> None:
        super()._take_usage(streams)
        if "cpu_s" in self.usage:  # the job's CPU, not the boot's and the imports'
            self.usage["cpu_s"] = round(max(0.0, self.usage["cpu_s"] - self.cpu_before), 6)


def fit_to_job(warm: WarmSandbox, limits: Limits, overhead_mb: int) -> None:
    """Tighten the warm sandbox's cgroup to the job's budget; OSError if the kernel refuses."""
    memory = (limits.memory_mb + overhead_mb + warm.memory_mb_extra) * MiB
    warm.cgroup.set_memory(memory)
    warm.cgroup.set_cpus(boot_cpus(limits))  # the job's own quota applies at its ready line
    warm.cgroup.set_shares(JOB_SHARES)


def _read_line(fd: int, timeout_s: float) -> bytes:
    """Bytes from `fd` up to a newline (never past it), EOF, MAX_WARM_LINE or the timeout."""
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n") and len(line) < MAX_WARM_LINE:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        byte = os.read(fd, 1)  # one at a time: nothing after the line is ours to take
        if not byte:
            break
        line += byte
    return line


def _available(proc: subprocess.Popen[bytes]) -> str:
    """What runsc said on stderr so far (without blocking), for the error detail."""
    if proc.stderr is None:
        return ""
    fd = proc.stderr.fileno()
    ready, _, _ = select.select([fd], [], [], 0)
    return os.read(fd, 2000).decode("utf-8", "replace").strip() if ready else ""


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True
