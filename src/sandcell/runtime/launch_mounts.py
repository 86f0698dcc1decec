"""A mount namespace for bwrap launches: the host's, without the /sys tree no launch reaches.

bwrap reads /proc/self/mountinfo once for every mount it makes (13 a sandbox, 63 KB) and
copies, then tears down, every mount of the namespace it starts in: each host mount costs
every sandbox. On this VM /sys holds 14 of the host's 22 (the cgroup v1 tree); without them a
sandbox cost ~0.5 ms less CPU (bench/RESULTS.md, session 35). The launch helper joins the
sandbox's cgroups through /sys first, then enters this namespace (`mounts FD`) for the rest.

The scratch disks are mounted on the host after the namespace is made. sandcell's tmpfs
(volatile.RUN_ROOT, where they are mounted) is made a shared mount, as a systemd host has
every mount, and the namespace a slave of the host's: each disk reaches it as it is mounted
and leaves as it is unmounted. That is checked with a probe mount before the namespace is
used. Where any of it fails, launches run in the host's namespace, as before. (A bind of the
sandboxes dir onto itself would do for the disks, but a warm sandbox's channel is linked
into it from elsewhere on the tmpfs, and a hard link cannot cross mounts.)
"""

import logging
import os
import subprocess
import threading
from pathlib import Path

from sandcell.runtime.mounts import MNT_DETACH, MS_SHARED, mount, umount
from sandcell.runtime.reap import mount_points
from sandcell.runtime.volatile import RUN_ROOT

log = logging.getLogger("sandcell.runtime")
# In a namespace of its own, a slave of the host's: /sys goes (with every mount under it),
# then it waits with the namespace open until its stdin closes.
HOLDER = "umount --lazy /sys && echo held && exec cat >/dev/null"


class LaunchMounts:
    def __init__(self, disks_under: Path, shared: Path = RUN_ROOT) -> None:
        self.disks_under, self.shared = disks_under, shared
        self._fd: int | None = None
        self._tried = False
        self._lock = threading.Lock()

    def fd(self) -> int | None:
        """The namespace's fd for the launch helper, made at the first call; None if it cannot
        be made here (said once in the log): launches then run in the host's namespace."""
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    self._fd = self._make()
                except OSError as exc:
                    log.warning("bwrap launches stay in the host's mount namespace: %s", exc)
            return self._fd

    def close(self) -> None:
        """Let the namespace go (the tmpfs stays shared: another runtime may rely on it)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._tried = False

    def _make(self) -> int:
        _checked(mount(None, self.shared, flags=MS_SHARED), "share")
        with subprocess.Popen(  # its pipes closed and it waited for on the way out
            ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", HOLDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as holder:
            assert holder.stdin and holder.stdout and holder.stderr
            try:
                if holder.stdout.readline() != b"held\n":
                    holder.stdin.close()
                    raise OSError(f"cannot make it: {holder.stderr.read()[-300:]!r}")
                fd = os.open(f"/proc/{holder.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    self._check_propagation(holder.pid)
                except BaseException:
                    os.close(fd)
                    raise
                return fd
            finally:
                holder.stdin.close()  # it exits; the fd keeps the namespace

    def _check_propagation(self, holder_pid: int) -> None:
        """A probe mounted where the disks are must show in the namespace, and go from it
        once unmounted: else a sandbox would not find its scratch disk there."""
        probe = self.disks_under / f".mounts-probe-{os.getpid()}"
        probe.mkdir(mode=0o700, exist_ok=True)
        try:
            _checked(mount("tmpfs", probe, b"tmpfs", data=b"size=4k"), "probe")
            shown = str(probe) in mount_points(holder_pid)
            _checked(umount(probe, MNT_DETACH), "probe detach")
            gone = str(probe) not in mount_points(holder_pid)
        finally:
            probe.rmdir()
        if not (shown and gone):
            raise OSError(f"mounts under {self.disks_under} do not reach it")


def _checked(err: int, what: str) -> None:
    if err:
        raise OSError(err, f"{what}: {os.strerror(err)}")
