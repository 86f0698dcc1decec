"""One cgroup (v1) per sandbox: its limits, the counters that say why it died, its cleanup.

runsc runs with `--ignore-cgroups` and is started *inside* this cgroup, so the runsc CLI,
gofer, sentry and ptrace stubs all inherit it. Owning the cgroup (instead of letting runsc
create and delete one) is what keeps `memory.oom_control`'s `oom_kill` and `pids.events`
readable after the sandbox is gone: those counters are how a reason is told apart.
"""

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.runtime.settle import settled

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu", "cpuacct", "pids")
CPU_PERIOD_US = 100_000
# Files a sandbox's cgroup must offer (checked on a probe cgroup: the roots lack some).
REQUIRED_FILES = {
    "memory": ("memory.limit_in_bytes", "memory.oom_control", "memory.max_usage_in_bytes"),
    "cpu": ("cpu.cfs_quota_us", "cpu.cfs_period_us"),
    "cpuacct": ("cpuacct.usage",),
    "pids": ("pids.max", "pids.events"),
}


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int
    cpus: float
    pids_max: int


def require_v1(root: Path = CGROUP_ROOT) -> None:
    """Raise RuntimeUnavailable unless every controller we enforce with is mounted (v1)."""
    if (root / "cgroup.controllers").exists():
        raise RuntimeUnavailable("cgroup v2 (unified) hosts are not supported yet; need cgroup v1")
    missing = [c for c in CONTROLLERS if not (root / c / "cgroup.procs").exists()]
    if missing:
        raise RuntimeUnavailable(f"cgroup v1 controllers not mounted: {', '.join(missing)}")


# Whether a cgroup offers REQUIRED_FILES, and memsw (swap accounting), is the same for every
# cgroup of a hierarchy: looked at in the first one a process makes (a runtime's probe).
_SWAP_ACCOUNTED: dict[Path, bool] = {}  # cgroup root -> memsw present; absent: not yet looked


class SandboxCgroup:
    """The cgroup `<parent>/<name>` in every controller of CONTROLLERS."""

    def __init__(self, relpath: str, root: Path = CGROUP_ROOT) -> None:
        self.relpath = relpath
        self.root = root
        # Its directories and the files the watch reads every tick, as plain strings: building
        # a Path per call cost more CPU than the system call itself.
        self._dirs = {c: f"{root}/{c}/{relpath}" for c in CONTROLLERS}
        self._procs_files = [f"{self._dirs[c]}/cgroup.procs" for c in CONTROLLERS]
        self._procs = f"{self._dirs['pids']}/cgroup.procs"
        self._oom_control = f"{self._dirs['memory']}/memory.oom_control"
        self._pids_events = f"{self._dirs['pids']}/pids.events"

    def dir(self, controller: str) -> Path:
        return Path(self._dirs[controller])

    def create(self, limits: CgroupLimits) -> None:
        """Make the cgroup and apply `limits`; on any failure remove it and fail closed."""
        try:
            for controller in CONTROLLERS:
                os.makedirs(self._dirs[controller], exist_ok=True)
            if self.root not in _SWAP_ACCOUNTED:
                self._require_files()
                memsw = f"{self._dirs['memory']}/memory.memsw.limit_in_bytes"
                _SWAP_ACCOUNTED[self.root] = os.path.exists(memsw)
            self._apply(limits)
        except OSError as exc:
            self.remove()
            raise RuntimeUnavailable(f"cannot set up cgroup {self.relpath}: {exc}") from exc

    def _apply(self, limits: CgroupLimits) -> None:
        self._write("memory", "memory.limit_in_bytes", limits.memory_bytes)
        # With swap accounting, also cap memory+swap: otherwise the limit leaks into swap.
        if _SWAP_ACCOUNTED[self.root]:
            self._write("memory", "memory.memsw.limit_in_bytes", limits.memory_bytes)
        self._write("cpu", "cpu.cfs_period_us", CPU_PERIOD_US)
        self.set_cpus(limits.cpus)
        self._write("pids", "pids.max", limits.pids_max)

    def set_memory(self, memory_bytes: int) -> None:
        """Change the memory limit (a warm sandbox's, at hand-over); OSError if refused."""
        limit, memsw = "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"
        # memsw must stay >= the limit: lower the limit first, raise memsw first.
        lower = memory_bytes < int(_read(self.dir("memory") / limit) or 0)
        for name in [limit, memsw] if lower else [memsw, limit]:
            if name == limit or (self.dir("memory") / memsw).exists():
                self._write("memory", name, memory_bytes)

    def set_shares(self, shares: int) -> None:
        """The cgroup's weight when CPUs are contended (1024: an ordinary sandbox's)."""
        self._write("cpu", "cpu.shares", shares)

    def set_cpus(self, cpus: float) -> None:
        self._write("cpu", "cpu.cfs_quota_us", max(1000, int(cpus * CPU_PERIOD_US)))

    def _require_files(self) -> None:
        for controller, files in REQUIRED_FILES.items():
            for name in files:
                if not (self.dir(controller) / name).exists():
                    raise FileNotFoundError(f"{controller} controller has no {name}")

    def procs_files(self) -> list[Path]:
        return [Path(path) for path in self._procs_files]

    def pids(self) -> set[int]:
        """Every host process in the cgroup, in any controller."""
        found: set[int] = set()
        for path in self._procs_files:
            found.update(int(p) for p in _read(path).split())
        return found

    def process_count(self) -> int:
        return len(_read(self._procs).split())

    def oom_kills(self) -> int:
        return _keyed(_read(self._oom_control)).get("oom_kill", 0)

    def pids_limit_hits(self) -> int:
        return _keyed(_read(self._pids_events)).get("max", 0)

    def usage(self) -> dict[str, float]:
        usage: dict[str, float] = {}
        peak = _read(self.dir("memory") / "memory.max_usage_in_bytes").strip()
        cpu_ns = _read(self.dir("cpuacct") / "cpuacct.usage").strip()
        if peak.isdigit():
            usage["max_memory_bytes"] = float(peak)
        if cpu_ns.isdigit():
            usage["cpu_s"] = int(cpu_ns) / 1e9
        return usage

    def memory_stat(self) -> dict[str, int]:
        """Current memory use: `usage` (what the limit counts) and memory.stat's counters."""
        stat = _keyed(_read(self.dir("memory") / "memory.stat"))
        usage = _read(self.dir("memory") / "memory.usage_in_bytes").strip()
        return stat | {"usage": int(usage) if usage.isdigit() else 0}

    def kill_all(self, timeout_s: float = 5.0, spare: frozenset[int] = frozenset()) -> bool:
        """SIGKILL every process in the cgroup until none is left; True if it emptied.

        With `spare`, those processes are left alone (True once only they remain).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids() - spare
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                _kill_member(pid, f":pids:/{self.relpath}\n")
            time.sleep(0.01)

    def remove(self, timeout_s: float = 2.0) -> bool:
        """rmdir the cgroup in every controller; True once none of them exists."""

        def gone() -> bool:
            still_there = [c for c in CONTROLLERS if self._rmdir(self._dirs[c])]  # tries each
            return not still_there

        # Exiting tasks take a moment to leave the css: rmdir again until it goes.
        return settled(gone, timeout_s)

    def exists(self) -> bool:
        return any(os.path.exists(path) for path in self._dirs.values())

    @staticmethod
    def _rmdir(path: str) -> bool:
        """Try to remove `path`; True if it is still there."""
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return True
            raise
        return False

    def _write(self, controller: str, name: str, value: int) -> None:
        fd = os.open(f"{self._dirs[controller]}/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(value).encode())
        finally:
            os.close(fd)


def children(parent: str, root: Path = CGROUP_ROOT) -> set[str]:
    """Names of the cgroups directly under `parent` in any controller (for reaping)."""
    names: set[str] = set()
    for controller in CONTROLLERS:
        base = root / controller / parent
        if base.is_dir():
            names.update(p.name for p in base.iterdir() if p.is_dir())
    return names


def read_pseudo_file(path: Path | str) -> bytes:
    """A kernel pseudo-file's bytes (a cgroup's, /proc's), with plain system calls rather than
    open(): the watch reads three cgroup files every tick of every running sandbox, and every
    release scans every host process's cmdline; a file object cost as much CPU again as the
    reads themselves."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read(path: Path | str) -> str:
    """A cgroup file's text; "" if the cgroup is gone."""
    try:
        return read_pseudo_file(path).decode()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        if exc.errno == errno.ENODEV:  # a cgroup being removed under us
            return ""
        raise


def _keyed(text: str) -> dict[str, int]:
    """Parse "key value" lines (memory.oom_control, pids.events)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return values


def _kill_member(pid: int, membership: str) -> None:
    """SIGKILL `pid` only if it is still the process in our cgroup (pids get reused)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        # The pidfd pins one process: if `pid` was reused before it was opened, the new
        # owner is not in our cgroup and is left alone.
        if membership in _read(Path(f"/proc/{pid}/cgroup")):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)
