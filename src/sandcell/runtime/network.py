"""The one way out of a sandbox whose job may use the network: its own egress proxy.

The sandbox keeps `--network=none` (a loopback interface and nothing else). What it gets on top:

- the job's proxy socket directory, bind-mounted read-only at GUEST_SOCKET_DIR. `--host-uds=open`
  lets the guest connect to host sockets it can see through its mounts (it can create none);
  the image root and the job's scratch hold no sockets, so the proxy's is the only one;
- the job's CA bundle (image roots + job CA), read-only at GUEST_CA_BUNDLE;
- the bridge (bridge.py), started by the wrapper before the ready line, so ordinary HTTP clients
  reach the proxy at 127.0.0.1:PROXY_PORT through HTTP(S)_PROXY. Code that ignores the proxy
  variables has no route anywhere: there is no other interface and no resolver.
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
