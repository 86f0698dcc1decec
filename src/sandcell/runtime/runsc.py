"""The runsc command line, as this runtime uses it.

Every command carries the same global flags: our own `--root` (so `list` and reaping only ever
see our containers), no network, OCI seccomp on, and `--ignore-cgroups` because the runtime
starts runsc inside a cgroup it owns (see cgroups.py).
"""

import json
import re
import subprocess
from pathlib import Path

CONTROL_TIMEOUT_S = 10
# KVM hangs the hosts this was built on, and on a VM it is nested virtualisation anyway.
ALLOWED_PLATFORMS = ("ptrace", "systrap")


class RunscError(Exception):
    """A runsc control command failed."""


class Runsc:
    def __init__(self, binary: str, root: Path, platform: str | None = None) -> None:
        if platform is not None and platform not in ALLOWED_PLATFORMS:
            raise ValueError(f"runsc platform {platform!r} is not allowed; use one of ptrace")
        self.binary = binary
        self.root = root
        self.platform = platform

    def flags(self, log: Path | None = None) -> list[str]:
        flags = [
            self.binary,
            f"--root={self.root}",
            "--network=none",
            "--oci-seccomp",
            "--ignore-cgroups",
        ]
        if self.platform:
            flags.append(f"--platform={self.platform}")
        if log is not None:
            flags.append(f"--log={log}")
        return flags

    def run_argv(
        self,
        bundle: Path,
        sandbox_id: str,
        log: Path,
        *,
        host_uds: bool = False,
        extra: list[str] | None = None,
    ) -> list[str]:
        """Foreground `run`: its pipes close when the sandbox ends (a detached one never).

        `host_uds`: let the guest connect (only connect) to host unix sockets bind-mounted into
        it; the egress proxy's socket is the only one a bundle ever mounts. `extra`: more
        global flags (the fork watch's strace).
        """
        uds = ["--host-uds=open"] if host_uds else []
        return [*self.flags(log), *uds, *(extra or []), "run", f"--bundle={bundle}", sandbox_id]

    def version(self) -> str:
        out = self._call("--version")
        match = re.search(r"runsc version (\S+)", out)
        if not match:
            raise RunscError(f"cannot parse `runsc --version`: {out[:200]!r}")
        return f"runsc {match.group(1)}"

    def kill_all(self, sandbox_id: str) -> None:
        self._call(*self.flags()[1:], "kill", "--all", sandbox_id, "KILL")

    def delete(self, sandbox_id: str) -> None:
        try:
            self._call(*self.flags()[1:], "delete", "--force", sandbox_id)
        finally:
            self._drop_orphan_locks(sandbox_id)

    def _drop_orphan_locks(self, sandbox_id: str) -> None:
        """Lock files without a state file: left when the sentry died before runsc wrote state
        (an OOM kill at boot); `delete` cannot find such a container, so they would stay."""
        if not self.root.is_dir():
            return
        prefix = f"{sandbox_id}_sandbox:"
        names = {p.name for p in self.root.iterdir() if p.name.startswith(prefix)}
        for name in names:
            if name.endswith(".lock") and name.removesuffix(".lock") + ".state" not in names:
                (self.root / name).unlink(missing_ok=True)

    def process_count(self, sandbox_id: str) -> int | None:
        """Processes (thread groups) the sentry counts in the sandbox; None if unknown."""
        try:
            out = self._call(*self.flags()[1:], "events", "--stats", sandbox_id)
            return int(json.loads(out)["data"]["pids"]["current"])
        except (RunscError, ValueError, KeyError, TypeError):
            return None

    def containers(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return self._call(*self.flags()[1:], "list", "--quiet").split()

    def has_state(self, sandbox_id: str) -> bool:
        """Whether runsc still keeps state (a container record or lock) for `sandbox_id`."""
        if not self.root.is_dir():
            return False
        prefix = f"{sandbox_id}_sandbox:"  # runsc names them <sandbox>_sandbox:<container>.*
        return any(p.name.startswith(prefix) for p in self.root.iterdir())

    def _call(self, *args: str) -> str:
        try:
            done = subprocess.run(
                [self.binary, *args],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=CONTROL_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RunscError(f"runsc {' '.join(args[-3:])}: {exc}") from exc
        if done.returncode != 0:
            raise RunscError(f"runsc {' '.join(args[-3:])}: {done.stderr.strip()[-500:]}")
        return done.stdout
