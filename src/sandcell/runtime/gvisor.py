"""The gVisor runtime: each job in its own runsc sandbox, everything released before returning.

<volatile>/runsc/                  runsc --root: only this runtime's containers (volatile.py)
<volatile>/sandboxes/<id>/         scratch of one sandbox (see scratch.py), on a tmpfs
<state_dir>/disks/<id>/            its disk image and inputs, on the state_dir's disk
<state_dir>/blank-disks/           one blank ext4 image per disk size, copied for each (ext4.py)
/sys/fs/cgroup/<ctl>/sandcell/<key>/<id>   its cgroup; <key> is derived from state_dir, so
                                   two runtimes on one host never reap each other's
"""

import contextlib
import os
import re
import shutil
import threading
from pathlib import Path

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.states import Reason
from sandcell.ports.runtime import SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime import cgroups
from sandcell.runtime.cgroups import CgroupLimits, SandboxCgroup
from sandcell.runtime.launch import launch_helper
from sandcell.runtime.reap import reap_cgroups, reap_scratch, remove_parent
from sandcell.runtime.runsc import Runsc, RunscError
from sandcell.runtime.sandbox import SandboxRun
from sandcell.runtime.scratch import Scratch, probe_loop_disk, scratch_blanks
from sandcell.runtime.volatile import (
    ensure_tmpfs,
    remove_if_empty,
    state_key,
    volatile_dir,
)

SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # names dirs and cgroups


class GVisorRuntime:
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
        self.state_dir = state_dir
        self.run_dir = volatile_dir(state_dir)
        self.sandboxes_dir = self.run_dir / "sandboxes"
        self.disks_dir = state_dir / "disks"
        self.blanks = scratch_blanks(state_dir / "blank-disks")
        self.runsc = Runsc(runsc, self.run_dir / "runsc", platform)
        self.overhead_mb = overhead_mb
        self.cgroup_parent = cgroup_parent or f"sandcell/{state_key(state_dir)}"
        self._version: str | None = None

    def version(self) -> str:
        if self._version is None:
            try:
                self._version = self.runsc.version()
            except RunscError as exc:
                raise RuntimeUnavailable(str(exc)) from exc
        return self._version

    def check(self) -> None:
        """Fail closed: raise RuntimeUnavailable unless every protection can be applied."""
        if shutil.which(self.runsc.binary) is None:
            raise RuntimeUnavailable(f"runsc not found ({self.runsc.binary!r} is not on PATH)")
        if os.geteuid() != 0:
            raise RuntimeUnavailable("the gvisor runtime needs root (runsc, cgroups, loop disks)")
        cgroups.require_v1()
        self.ensure_dirs()
        try:
            probe = SandboxCgroup(f"{self.cgroup_parent}/.probe-{os.getpid()}")
            probe.create(CgroupLimits(memory_bytes=64 << 20, cpus=0.5, pids_max=64))
            if not probe.remove():
                raise RuntimeUnavailable(f"cannot remove cgroup {probe.relpath}")
            probe_loop_disk(self.state_dir)
            launch_helper()  # every sandbox starts behind it (launch.in_cgroup)
            self.version()
        except Exception:
            self.close()  # closed, failing: its directories on the tmpfs and cgroups go too
            raise

    def run(self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event) -> SandboxResult:
        if not SANDBOX_ID.match(spec.sandbox_id):
            return SandboxResult(None, Reason.RUNTIME_ERROR, "invalid sandbox id", released=True)
        self.ensure_dirs()
        scratch = self.scratch(spec.sandbox_id)
        cgroup = SandboxCgroup(f"{self.cgroup_parent}/{spec.sandbox_id}")
        # Claiming the scratch dir is atomic: never touch what another run of this id owns.
        if cgroup.exists() or self.runsc.has_state(spec.sandbox_id) or not scratch.claim():
            detail = f"sandbox id {spec.sandbox_id} is already in use"
            return SandboxResult(None, Reason.RUNTIME_ERROR, detail, released=True)
        run = SandboxRun(spec, sink, cancel, self.runsc, scratch, cgroup, self.overhead_mb)
        return run.execute()

    def reap(self) -> list[str]:
        """Remove what an earlier crash of a runtime with this state_dir left behind.

        Call it before the first `run`: it removes every sandbox this state_dir knows of.
        """
        removed = self._reap_containers()
        removed += self._reap_cgroups()
        removed += self._reap_scratch()
        return removed

    def close(self) -> None:
        """The worker is done with this runtime (every run returned): its parent cgroup and
        its volatile directory go."""
        remove_parent(self.cgroup_parent)
        remove_if_empty(self.runsc.root, self.sandboxes_dir, self.run_dir)

    def scratch(self, sandbox_id: str) -> Scratch:
        """The (not yet claimed) scratch of sandbox `sandbox_id`."""
        return Scratch(
            self.sandboxes_dir / sandbox_id, self.blanks, spill=self.disks_dir / sandbox_id
        )

    def ensure_dirs(self) -> None:
        ensure_tmpfs()
        for path in (
            self.state_dir,
            self.disks_dir,
            self.run_dir,
            self.runsc.root,
            self.sandboxes_dir,
        ):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _reap_containers(self) -> list[str]:
        removed = []
        try:
            containers = self.runsc.containers()
        except RunscError:
            containers = []
        for container in containers:
            for step in (self.runsc.kill_all, self.runsc.delete):
                # Already stopped, or gone: the cgroup sweep below kills it either way.
                with contextlib.suppress(RunscError):
                    step(container)
            removed.append(f"runsc container {container}")
        return removed

    def _reap_cgroups(self) -> list[str]:
        return reap_cgroups(self.cgroup_parent)

    def _reap_scratch(self) -> list[str]:
        return reap_scratch(self.sandboxes_dir, self.disks_dir)
