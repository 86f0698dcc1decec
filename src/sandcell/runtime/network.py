"""The one way out of a sandbox whose job may use the network: its own egress proxy.

The sandbox keeps a network namespace of its own with a loopback interface and nothing else
(gVisor: `--network=none`; bwrap: `--unshare-net`, whose loopback bwrap brings up). What it gets
on top, on either runtime:

- the job's proxy socket directory, read-only at GUEST_SOCKET_DIR. The image root and the job's
  scratch hold no sockets, so the proxy's is the only host socket the guest can see (besides
  the guest channel's); it can create none. gVisor connects through it with `--host-uds=open`;
  under bwrap the guest connects itself, and abstract unix sockets are per network namespace,
  so the host's are out of reach;
- the job's CA bundle (image roots + job CA), read-only at GUEST_CA_BUNDLE;
- the bridge (bridge.py), started by the wrapper before the ready line, so ordinary HTTP clients
  reach the proxy at 127.0.0.1:PROXY_PORT through HTTP(S)_PROXY. Code that ignores the proxy
  variables has no route anywhere: there is no other interface and no resolver.

How bwrap gets the socket directory: bwrap runs as the sandbox's own host uid and resolves its
bind sources by path (even `--ro-bind-fd`), but the proxy's directory sits under the egress
state directory, which is 0700 so that no other host user can reach a job's proxy. So the
launch chain, still root, enters a mount namespace of its own and binds the socket directory
on an empty directory in the sandbox's scratch (`bwrap_egress_launch`); bwrap binds it from
there. That mount exists only in the sandbox's chain and vanishes with it: the host never sees
it, and nothing has to unmount it. The CA bundle is copied in from a memfd (`--ro-bind-data`).
"""

import functools
import shlex
from pathlib import Path
from typing import Any

from sandcell.ports.egress import (
    GUEST_CA_BUNDLE,
    GUEST_SOCKET_DIR,
    PROXY_PORT,
    SOCKET_NAME,
    EgressAttachment,
)

# The bridge's share of the job's process budget: one task (it never forks per connection).
# A job that kills its bridge could use this slot itself; it has no network left then.
BRIDGE_TASKS = 1
# Host memory the bridge adds to the sandbox (an interpreter with two C modules, ~8 MB): it is
# ours, not the tenant's, so the cgroup gets it on top of the job's memory_mb.
BRIDGE_MEMORY_MB = 16
BRIDGE_HOST = "127.0.0.1"
BRIDGE_FAILED_EXIT = 125  # before the ready line: the runtime reports it as runtime_error
_GUEST_SOCKET = f"{GUEST_SOCKET_DIR}/{SOCKET_NAME}"
# The launch chain's own mount namespace (slave: the host's unmounts still reach it), with the
# socket directory bound on the scratch's mount point; exit 125 before bwrap, like the cgroup join.
BWRAP_BIND_SCRIPT = 'mount --bind -- "$1" "$2" || exit 125; shift 2; exec "$@"'
BWRAP_MOUNT_POINT = "egress"  # in the sandbox's scratch root: empty on the host, 0700


def egress_mounts(attachment: EgressAttachment) -> list[dict[str, Any]]:
    """The proxy socket's directory and the CA bundle, both read-only for the guest.

    Read-only is enough to connect(2) to a socket; it keeps the guest from creating anything
    in the host directory.
    """
    ro = ["rbind", "ro", "nosuid", "nodev", "noexec"]
    return [
        _bind(GUEST_SOCKET_DIR, attachment.socket_dir, ro),
        _bind(GUEST_CA_BUNDLE, attachment.ca_bundle, ro),
    ]


def start_bridge(python: str) -> str:
    """Shell text that starts the bridge and returns once it listens, or ends the sandbox.

    The bridge's own stdout (its pid) is discarded; its stderr, before the ready line, becomes
    the runtime's error detail if it cannot start.
    """
    argv = [python, "-I", "-S", "-c", _bridge_source(), BRIDGE_HOST, str(PROXY_PORT)]
    command = shlex.join([*argv, _GUEST_SOCKET])
    failed = f"echo 'sandcell: the egress bridge did not start' >&2; exit {BRIDGE_FAILED_EXIT}"
    return f"{command} </dev/null >/dev/null || {{ {failed}; }}; "


@functools.cache
def _bridge_source() -> str:
    return Path(__file__).with_name("bridge.py").read_text()


def _bind(destination: str, source: Path, options: list[str]) -> dict[str, Any]:
    return {"destination": destination, "type": "bind", "source": str(source), "options": options}


def bwrap_egress_launch(attachment: EgressAttachment, mount_point: Path) -> list[str]:
    """The root step of the bwrap launch chain that makes the socket directory reachable."""
    unshare = ["unshare", "--mount", "--propagation", "slave", "--"]
    bind = ["/bin/sh", "-c", BWRAP_BIND_SCRIPT, "bind-egress"]
    return [*unshare, *bind, str(attachment.socket_dir), str(mount_point)]


def bwrap_egress_args(mount_point: Path, ca_fd: int) -> list[str]:
    """bwrap options: the bound socket directory and the CA bundle, both read-only."""
    return [
        *("--ro-bind", str(mount_point), GUEST_SOCKET_DIR),
        *("--ro-bind-data", str(ca_fd), GUEST_CA_BUNDLE),
    ]
