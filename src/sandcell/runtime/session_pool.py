"""Session pools: session kernels booted before their session exists, handed one session.

A pooled kernel is an ordinary session sandbox (session.py) on a volume of its own, made under
the pool's directory next to the sessions' state dirs, with the image's heavy modules imported
(`preload`, into sys.modules: nothing in the user's namespace, no cell counted). Take-over:

1. the kernel's state dir (its volume, mounted by the sandbox) is renamed to the session's
   state dir: same filesystem, so the mount and the loop device survive; from then on pause
   (checkpoint), stop and resume find everything where a cold session keeps it;
2. the session's own environment (SANDCELL_SESSION_ID) is set in the kernel (`environ`).

The sandbox keeps its id (`spool-<image>-<hex>`); the session record names it. A pooled kernel
serves exactly one session and is destroyed with it, like a cold one. What it cannot honour
starts cold (`session_refusal`): network (egress is attached at boot), an environment of the
caller's own (read by the interpreter at start), and limits other than the pool's profile
(memory, cpu, pids and disk are fixed at boot; a cell's output cap and timeout are not).
"""

import logging
import os
import secrets
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.images import ImageCatalog
from sandcell.ports.sessions import SessionSandbox, SessionSpec
from sandcell.runtime.hand_over import JOB_SHARES, WARM_SHARES
from sandcell.runtime.pool import PoolConfig, WarmPool
from sandcell.runtime.session import CPU_SHARES, GVisorSessionRuntime
from sandcell.runtime.session_runsc import Checkpointer
from sandcell.runtime.session_sandbox import GVisorSession, State
from sandcell.runtime.session_volume import VOLUME_NAME

log = logging.getLogger("sandcell.runtime.session_pool")
PRELOAD_TIMEOUT_S = 60.0  # `import pandas, matplotlib.pyplot` on a busy host
ENVIRON_TIMEOUT_S = 5.0
# Set by sandcell for each session (never by callers: the API refuses the prefix).
SESSION_ENV_PREFIX = "SANDCELL_"
# What a pooled kernel imports before its session comes (others: IPython only).
SESSION_PRELOADS: dict[str, tuple[str, ...]] = {
    "python-data": ("numpy", "pandas", "matplotlib", "matplotlib.pyplot"),
}
FIXED_AT_BOOT = ("memory_mb", "cpu", "pids", "disk_mb")


@dataclass
class PooledKernel:
    sandbox_id: str
    image: Image
    profile: Limits
    session: GVisorSession
    state_dir: Path  # under the pool's directory until take-over

    def alive(self) -> bool:
        proc = self.session.proc
        return self.session.state is State.RUNNING and proc is not None and proc.poll() is None

    def memory_bytes(self) -> int:
        return self.session.memory_bytes()


class KernelFactory:
    """Boots pooled kernels with `env` (the sessions' base environment) under `pool_dir`."""

    def __init__(self, runtime: GVisorSessionRuntime, pool_dir: Path, env: dict[str, str]) -> None:
        self.runtime, self.pool_dir, self.env = runtime, pool_dir, env

    def boot(
        self, image: Image, profile: Limits, preload: tuple[str, ...], extra_mb: int
    ) -> PooledKernel:
        sandbox_id = f"spool-{image.name}-{secrets.token_hex(6)}"
        state_dir = self.pool_dir / sandbox_id
        # Booting (~3 CPU-s for python-data) yields the CPUs to live sessions and jobs: a
        # refill starts right after a take-over, while the new session runs its first cells.
        extra = {CPU_SHARES: WARM_SHARES}
        spec = SessionSpec(sandbox_id, image, dict(self.env), profile, state_dir, extra=extra)
        try:
            session = self.runtime.start(spec)  # released again if it does not come up
        except RuntimeUnavailable:
            shutil.rmtree(state_dir, ignore_errors=True)
            raise
        kernel = PooledKernel(sandbox_id, image, profile, session, state_dir)
        try:
            _call(session, PRELOAD_TIMEOUT_S, "preload", modules=list(preload))
        except RuntimeUnavailable:
            problems = self.destroy(kernel)
            if problems:
                log.warning("pooled kernel %s not released: %s", sandbox_id, problems)
            raise
        return kernel

    def destroy(self, kernel: PooledKernel) -> list[str]:
        kernel.session.stop()
        problems = kernel.session.release()
        shutil.rmtree(kernel.state_dir, ignore_errors=True)  # the pool's; never a session's
        return problems


def session_refusal(spec: SessionSpec, profile: Limits, boot_env: dict[str, str]) -> str | None:
    """Why `spec` cannot take a pooled kernel booted with `profile` and `boot_env`."""
    own_env = {
        name
        for name, value in spec.env.items()
        if not name.startswith(SESSION_ENV_PREFIX) and boot_env.get(name) != value
    }
    checks = [
        (spec.egress is not None, "network"),
        (bool(own_env), "env"),
        *((getattr(spec.limits, name) != getattr(profile, name), name) for name in FIXED_AT_BOOT),
    ]
    return next((why for refused, why in checks if refused), None)


class SessionPool:
    """The SessionPool port on gVisor: a WarmPool of kernels, and the take-over."""

    def __init__(
        self,
        runtime: GVisorSessionRuntime,
        images: ImageCatalog,
        config: PoolConfig,
        pool_dir: Path,
        env: dict[str, str],
    ) -> None:
        self.pool_dir, self.env = pool_dir, env
        self.pool = WarmPool(KernelFactory(runtime, pool_dir, env), images, config)

    def start(self) -> None:
        """Remove what an earlier run left in the pool's directory, then start filling."""
        shutil.rmtree(self.pool_dir, ignore_errors=True)
        self.pool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.pool.start()

    def close(self) -> None:
        self.pool.close()

    def pool_figures(self) -> dict[str, Any]:
        return self.pool.figures()

    def take(self, spec: SessionSpec) -> SessionSandbox | None:
        """A running kernel for the session of `spec`, or None (it starts cold)."""
        if spec.image.name not in self.pool.config.sizes:
            return None
        if session_refusal(spec, self.pool.config.profile, self.env) is not None:
            self.pool.refused(spec.image.name)
            return None
        kernel = self.pool.take(spec.image)
        if kernel is None:
            return None
        try:
            return adopt(kernel, spec, self.env)
        except (OSError, RuntimeUnavailable) as exc:
            log.warning("pooled kernel %s not handed over: %s", kernel.sandbox_id, exc)
            self.pool.discard(kernel)
            _renew(spec.state_dir)  # the cold start after this gets a fresh volume
            return None


def adopt(kernel: PooledKernel, spec: SessionSpec, boot_env: dict[str, str]) -> GVisorSession:
    """Make `kernel` the session of `spec`: its volume moves into spec.state_dir."""
    session, parts = kernel.session, kernel.session.parts
    if spec.state_dir.exists():
        spec.state_dir.rmdir()  # made empty for a new session; anything in it: OSError, cold
    os.rename(kernel.state_dir, spec.state_dir)
    kernel.state_dir = spec.state_dir  # a destroy from now on removes the session's dir
    parts.spec = replace(spec, sandbox_id=kernel.sandbox_id)
    parts.scratch.volume = spec.state_dir / VOLUME_NAME
    parts.checkpointer = Checkpointer(spec.state_dir)
    changed = {name: value for name, value in spec.env.items() if boot_env.get(name) != value}
    _call(session, ENVIRON_TIMEOUT_S, "environ", set=changed)
    parts.cgroup.set_shares(JOB_SHARES)  # the session's ordinary weight from now on
    return session


def _call(session: GVisorSession, timeout_s: float, op: str, **fields: Any) -> dict[str, Any]:
    channel = session.channel
    if channel is None or session.state is not State.RUNNING:
        raise RuntimeUnavailable(f"the pooled kernel is {session.state.value}")
    call = channel.call(op, **fields)
    if not call.wait(timeout_s) or call.answer is None:
        raise RuntimeUnavailable(f"the pooled kernel did not answer {op!r}")
    failed = call.answer.get("failed")
    if failed:
        log.warning("pooled kernel %s could not import %s", session.sandbox_id, failed)
    return call.answer


def _renew(state_dir: Path) -> None:
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
