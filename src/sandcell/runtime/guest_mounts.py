"""What every job sandbox gets for the guest helper (`import sandcell_guest`), on any runtime.

- the guest package (src/sandcell/guest), read-only at GUEST_PACKAGE_DIR; the worker puts that
  directory on PYTHONPATH. It holds code only, no sockets and nothing secret;
- the attempt's guest channel directory (commit_stage, once), read-only at GUEST_CHANNEL_DIR.
  Read-only is enough to connect(2) to the socket in it and keeps the guest from creating
  anything in the host directory. Its socket is served by the worker for this attempt only.

Both mount points are made in the image at build time (a read-only root cannot get new ones).
"""

from pathlib import Path
from typing import Any

import sandcell.guest
from sandcell.ports.runtime import GUEST_CHANNEL_DIR, SandboxSpec
from sandcell.ports.sessions import GUEST_PACKAGE_DIR

GUEST_SOURCE = Path(sandcell.guest.__file__).parent


def guest_binds(spec: SandboxSpec) -> list[tuple[Path, str]]:
    """(host source, guest destination) pairs, each to be bind-mounted read-only."""
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
    """The guest binds as OCI mounts (gVisor); nosuid/nodev/noexec: only Python reads them."""
    options = ["rbind", "ro", "nosuid", "nodev", "noexec"]
    return [
        {"destination": destination, "type": "bind", "source": str(source), "options": options}
        for source, destination in guest_binds(spec)
    ]
