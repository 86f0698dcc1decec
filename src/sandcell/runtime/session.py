"""Sessions on gVisor: a long-lived runsc sandbox per session, its kernel driven over pipes.

A session sandbox is a job sandbox (the same bundle, cgroup, seccomp filter, uid, no network
unless egress) whose program is the guest kernel (sandcell.guest.kernel), read-only at
GUEST_PACKAGE_DIR in the image's root (guest_mounts.ensure_guest_package). `runsc run` runs in
the foreground, so its stdin and stdout are the kernel's: they are the wire (see
kernel_channel.py).

pause   `runsc checkpoint` into <state_dir>/checkpoint: the sandbox ends with its memory on
        disk; then its host resources are released. The volume (session_volume.py) stays.
resume  `runsc restore` of that checkpoint into a new sandbox with new pipes. runsc gives the
        restored process (and the kernel's private dups of its stdio) the new pipes, so the wire
        simply goes on. Without a checkpoint, or when restoring fails: a fresh kernel over the
        same volume.
"""

import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.ports.runtime import SandboxSpec
from sandcell.ports.sessions import GUEST_PACKAGE_DIR, SessionSpec
from sandcell.runtime.bundle import check_env, oci_config, write_config
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.ext4 import ScratchError
from sandcell.runtime.guest_mounts import ensure_guest_package
from sandcell.runtime.gvisor import SANDBOX_ID, GVisorRuntime
from sandcell.runtime.launch import in_cgroup
from sandcell.runtime.runsc import RunscError
from sandcell.runtime.sandbox import cgroup_limits
from sandcell.runtime.session_runsc import CHECKPOINT_FILE, Checkpointer, SessionRunsc
from sandcell.runtime.session_sandbox import GVisorSession, SessionParts
from sandcell.runtime.session_volume import VOLUME_NAME, SessionScratch

log = logging.getLogger("sandcell.runtime.session")
START_TIMEOUT_S = 30.0  # runsc boot plus `import IPython` (or a restore)
# The kernel starts the guest package by name, from the directory above its mount point.
GUEST_PARENT, GUEST_NAME = str(Path(GUEST_PACKAGE_DIR).parent), Path(GUEST_PACKAGE_DIR).name
KERNEL_BOOT = (
    f"import sys; sys.path.insert(0, {GUEST_PARENT!r}); "
    f"from {GUEST_NAME}.kernel import main; main()"
)
# The kernel's own threads (wire, output pumps, preview relays) are tasks inside gVisor that
# RLIMIT_NPROC counts: they come on top of the tenant's pids budget, not out of it.
KERNEL_TASKS = 16
# Likewise the kernel's memory (IPython and the wire, ~20 MB beyond a bare interpreter) is
# ours: the cgroup gets it on top of the tenant's memory_mb and gVisor's own overhead.
KERNEL_MEMORY_MB = 32
KERNEL_ENV_DEFAULTS = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
CPU_SHARES = "cpu_shares"  # SessionSpec.extra: the cgroup's cpu.shares, if not the default


class GVisorSessionRuntime:
    """The SessionRuntime port on gVisor.

    `state_dir` is this runtime's own (runsc root, per-sandbox scratch); give it one that no
    GVisorRuntime for jobs uses, since `reap` removes every sandbox it finds there.
    """

    name = "gvisor"

    def __init__(
        self,
        state_dir: Path,
        *,
        runsc: str = "runsc",
        overhead_mb: int = 64,
        platform: str | None = None,
        cgroup_parent: str | None = None,
    ) -> None:
        self.base = GVisorRuntime(
            state_dir,
            runsc=runsc,
            overhead_mb=overhead_mb,
            platform=platform,
            cgroup_parent=cgroup_parent,
        )
        self.runsc = SessionRunsc(runsc, self.base.runsc.root, platform)

    def check(self) -> None:
        self.base.check()

    def version(self) -> str:
        return self.base.version()

    def reap(self) -> list[str]:
        """After a crash: remove every sandbox of this state_dir (volumes live elsewhere)."""
        return self.base.reap()

    def close(self) -> None:
        """The worker is done with sessions (none is left running): the parent cgroup goes."""
        self.base.close()

    def start(self, spec: SessionSpec) -> GVisorSession:
        session = self._new(spec)
        self._boot(session, checkpoint=None)
        return session

    def resume(self, spec: SessionSpec) -> GVisorSession:
        checkpoint = Checkpointer(spec.state_dir).final
        if (checkpoint / CHECKPOINT_FILE).is_file():
            session = self._new(spec)
            try:
                self._boot(session, checkpoint)
            except RuntimeUnavailable as exc:
                log.warning("restore of %s failed, starting afresh: %s", spec.sandbox_id, exc)
            else:
                session.memory_restored = True
                return session
            finally:
                # Restored or not, it is stale now: the volume moves on without it.
                shutil.rmtree(checkpoint, ignore_errors=True)
        return self.start(spec)

    def _new(self, spec: SessionSpec) -> GVisorSession:
        if not SANDBOX_ID.match(spec.sandbox_id):
            raise RuntimeUnavailable(f"invalid sandbox id {spec.sandbox_id!r}")
        self.base.ensure_dirs()
        scratch = SessionScratch(
            self.base.sandboxes_dir / spec.sandbox_id,
            spill=self.base.disks_dir / spec.sandbox_id,
            volume=spec.state_dir / VOLUME_NAME,
        )
        cgroup = SandboxCgroup(f"{self.base.cgroup_parent}/{spec.sandbox_id}")
        # Claiming the scratch dir is atomic: never touch what another sandbox of this id owns.
        if cgroup.exists() or self.runsc.has_state(spec.sandbox_id) or not scratch.claim():
            raise RuntimeUnavailable(f"sandbox id {spec.sandbox_id} is already in use")
        parts = SessionParts(spec, self.runsc, scratch, cgroup, Checkpointer(spec.state_dir))
        return GVisorSession(parts)

    def _boot(self, session: GVisorSession, checkpoint: Path | None) -> None:
        """Bring the sandbox up, or release everything it took and raise RuntimeUnavailable."""
        parts = session.parts
        try:
            sandbox_spec = _prepare(parts, self.base.overhead_mb)
            argv = self._runsc_argv(parts, sandbox_spec, checkpoint)
            launched = time.monotonic()
            session.launch(in_cgroup(parts.cgroup, argv))
            session.await_kernel(restored=checkpoint is not None, timeout_s=START_TIMEOUT_S)
        except (OSError, ScratchError, ValueError, RuntimeUnavailable, RunscError) as exc:
            session.release()
            detail = exc.detail if isinstance(exc, RuntimeUnavailable) else str(exc)
            raise RuntimeUnavailable(f"cannot start the session sandbox: {detail}") from exc
        session.boot_s = round(time.monotonic() - launched, 3)

    def _runsc_argv(
        self, parts: SessionParts, spec: SandboxSpec, checkpoint: Path | None
    ) -> list[str]:
        bundle, log_file, uds = parts.scratch.bundle, parts.scratch.log, spec.egress is not None
        if checkpoint is None:
            return self.runsc.run_argv(bundle, spec.sandbox_id, log_file, host_uds=uds)
        return self.runsc.restore_argv(bundle, spec.sandbox_id, log_file, checkpoint, host_uds=uds)


def _prepare(parts: SessionParts, overhead_mb: int) -> SandboxSpec:
    """Volume mounted, bundle written, cgroup made: everything but the sandbox itself."""
    spec = parts.spec
    limits = replace(spec.limits, pids=spec.limits.pids + KERNEL_TASKS)
    env = KERNEL_ENV_DEFAULTS | spec.env
    check_env(env)
    spec.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    parts.scratch.create_session(limits.disk_mb)
    argv = [spec.image.python, "-I", "-u", "-c", KERNEL_BOOT]
    sandbox_spec = SandboxSpec(spec.sandbox_id, spec.image, argv, env, limits, egress=spec.egress)
    config = oci_config(sandbox_spec, parts.scratch)
    ensure_guest_package(spec.image.rootfs)  # the kernel's code, in the image's root
    write_config(config, parts.scratch.bundle)
    overhead_mb += KERNEL_MEMORY_MB
    parts.cgroup.create(cgroup_limits(limits, overhead_mb, spec.egress is not None))
    if CPU_SHARES in spec.extra:  # a session pool's kernel boots yielding to live sessions
        parts.cgroup.set_shares(int(spec.extra[CPU_SHARES]))
    return sandbox_spec
