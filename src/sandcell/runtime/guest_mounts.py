"""What every job sandbox gets for the guest helper (`import sandcell_guest`), on any runtime.

- the guest package (src/sandcell/guest), read-only at GUEST_PACKAGE_DIR; the worker puts that
  directory on PYTHONPATH. It holds code only, no sockets and nothing secret. Under gVisor it
  is bound there on the host, once per image root (`ensure_guest_package`), and every
  sandbox's root shows it: a mount of each sandbox's own would be one more gofer channel for
  the sentry to set up, some 3 ms of CPU for every sandbox, used or not. bwrap binds it per
  sandbox, which costs next to nothing there;
- the attempt's guest channel directory (commit_stage, once), read-only at GUEST_CHANNEL_DIR.
  Read-only is enough to connect(2) to the socket in it and keeps the guest from creating
  anything in the host directory. Its socket is served by the worker for this attempt only.

Both mount points are made in the image at build time (a read-only root cannot get new ones).
"""

import os
from pathlib import Path
from typing import Any

import sandcell.guest
from sandcell.domain.errors import RuntimeUnavailable
from sandcell.ports.runtime import GUEST_CHANNEL_DIR, SandboxSpec
from sandcell.ports.sessions import GUEST_PACKAGE_DIR
from sandcell.runtime.mounts import (
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REMOUNT,
    mount,
    umount,
)
from sandcell.runtime.reap import is_mount_point
from sandcell.runtime.volatile import host_mount_lock

GUEST_SOURCE = Path(sandcell.guest.__file__).parent
READ_ONLY = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC  # read by Python, never executed


def ensure_guest_package(rootfs: Path, source: Path = GUEST_SOURCE) -> None:
    """Bind `source` read-only at the image's GUEST_PACKAGE_DIR, on the host, unless it is
    there already: two stat calls, as runtimes call this for every sandbox. A mount there of
    another directory (the package of another install) is detached first; sandboxes running
    meanwhile keep the view they started with. The image's own files stay as they were built:
    the bind only covers its empty mount point (and its digest does not count it)."""
    if _same_directory(rootfs / GUEST_PACKAGE_DIR.lstrip("/"), source):
        return
    target = _mount_point(rootfs)
    if target is None:
        return  # a broken image: the sandbox's start reports it
    with host_mount_lock():
        _detach(target, unless=source)
        if not is_mount_point(target):
            _bind_read_only(source, target)


def release_guest_package(rootfs: Path) -> None:
    """Detach the package from an image root that is about to be removed."""
    target = _mount_point(rootfs)
    if target is not None:
        with host_mount_lock():
            _detach(target)


def _mount_point(rootfs: Path) -> Path | None:
    """The image root's mount point for the package; None if it has none. Never a path that
    leads out of the root (a symlink in the image): a mount there would cover the host's."""
    target = rootfs / GUEST_PACKAGE_DIR.lstrip("/")
    if not target.is_dir():
        return None
    if os.path.realpath(target) != os.path.join(
        os.path.realpath(rootfs), target.relative_to(rootfs)
    ):
        raise RuntimeUnavailable(f"{target} leads out of the image root: the image is broken")
    return target


def _detach(target: Path, unless: Path | None = None) -> None:
    """Detach what is mounted at `target` (stacked mounts too), unless it is `unless`."""
    while is_mount_point(target) and not (unless and _same_directory(target, unless)):
        _checked(umount(target, MNT_DETACH), f"detach {target}")


def _bind_read_only(source: Path, target: Path) -> None:
    _checked(mount(source, target, flags=MS_BIND), f"bind {target}")
    # A bind takes flags only so, in a second call.
    err = mount(None, target, flags=MS_REMOUNT | MS_BIND | READ_ONLY)
    if err:
        umount(target, MNT_DETACH)  # never left writable
    _checked(err, f"make {target} read-only")


def _same_directory(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _checked(err: int, what: str) -> None:
    if err:
        raise RuntimeUnavailable(f"cannot {what} for the guest package: {os.strerror(err)}")


def guest_binds(spec: SandboxSpec) -> list[tuple[Path, str]]:
    """(host source, guest destination) pairs, each to be bind-mounted read-only (bwrap)."""
    binds = [(GUEST_SOURCE, GUEST_PACKAGE_DIR)]
    if spec.guest_channel is not None:
        binds.append((spec.guest_channel, GUEST_CHANNEL_DIR))
    return binds


def needs_host_sockets(spec: SandboxSpec) -> bool:
    """Whether the guest must connect to a host unix socket it has mounted (runsc --host-uds).

    The egress proxy's socket and the guest channel's are the only ones a bundle ever mounts.
    """
    return spec.egress is not None or spec.guest_channel is not None


def oci_guest_mounts(spec: SandboxSpec) -> list[dict[str, Any]]:
    """The sandbox's own guest mounts under gVisor: only the channel, read-only, nosuid, nodev,
    noexec. The package comes with the image root: call ensure_guest_package first."""
    if spec.guest_channel is None:
        return []
    options = ["rbind", "ro", "nosuid", "nodev", "noexec"]
    source = str(spec.guest_channel)
    return [
        {"destination": GUEST_CHANNEL_DIR, "type": "bind", "source": source, "options": options}
    ]
