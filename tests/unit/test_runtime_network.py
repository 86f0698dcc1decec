"""What the gVisor runtime asks of runsc for a job with and without egress (no sandbox started)."""

from dataclasses import replace
from pathlib import Path
from typing import Any

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.egress import GUEST_CA_BUNDLE, GUEST_SOCKET_DIR, EgressAttachment
from sandcell.ports.runtime import SandboxSpec
from sandcell.runtime.bundle import READY_PRINTF, oci_config
from sandcell.runtime.network import BRIDGE_MEMORY_MB
from sandcell.runtime.runsc import Runsc
from sandcell.runtime.sandbox import cgroup_limits
from sandcell.runtime.scratch import Scratch

IMAGE = Image("python", "2", "sha256:0", Path("/images/python/2/rootfs"))
ATTACHMENT = EgressAttachment(Path("/state/egress/j-1/sock"), Path("/state/egress/j-1/ca.pem"))
RUN = (Path("/bundle"), "j-1", Path("/log"))  # run_argv's bundle, sandbox id, log


def config(egress: EgressAttachment | None) -> dict[str, Any]:
    spec = SandboxSpec("j-1", IMAGE, [IMAGE.python, "/job/main.py"], {}, Limits(pids=4))
    return oci_config(replace(spec, egress=egress), Scratch(Path("/state/sandboxes/j-1")))


def nproc(cfg: dict[str, Any]) -> int:
    limits = {r["type"]: r["hard"] for r in cfg["process"]["rlimits"]}
    return int(limits["RLIMIT_NPROC"])


def test_without_egress_nothing_of_it_is_in_the_bundle() -> None:
    cfg = config(None)
    destinations = {m["destination"] for m in cfg["mounts"]}
    assert GUEST_SOCKET_DIR not in destinations and GUEST_CA_BUNDLE not in destinations
    script = cfg["process"]["args"][2]
    assert script.startswith(READY_PRINTF) and "-I" not in script
    assert nproc(cfg) == 4 + 1
    assert not any("host-uds" in arg for arg in Runsc("runsc", Path("/r")).run_argv(*RUN))


def test_with_egress_two_read_only_mounts_the_bridge_first_and_its_task_slot() -> None:
    cfg = config(ATTACHMENT)
    mounts = {m["destination"]: m for m in cfg["mounts"]}
    assert mounts[GUEST_SOCKET_DIR]["source"] == str(ATTACHMENT.socket_dir)
    assert mounts[GUEST_CA_BUNDLE]["source"] == str(ATTACHMENT.ca_bundle)
    for destination in (GUEST_SOCKET_DIR, GUEST_CA_BUNDLE):
        assert "ro" in mounts[destination]["options"] and "rw" not in mounts[destination]["options"]
    script = cfg["process"]["args"][2]
    bridge_at, ready_at = script.index(f"{IMAGE.python} -I -S -c"), script.index(READY_PRINTF)
    assert bridge_at < ready_at  # the ready line only once the bridge listens
    assert "127.0.0.1 3128 /run/sandcell/egress/proxy.sock" in script
    assert nproc(cfg) == 4 + 1 + 1
    argv = Runsc("runsc", Path("/r")).run_argv(*RUN, host_uds=True)
    assert argv.index("--host-uds=open") < argv.index("run")


def test_the_bridge_memory_is_added_to_the_cgroup_not_taken_from_the_job() -> None:
    limits = Limits(memory_mb=100)
    without, with_egress = cgroup_limits(limits, 64), cgroup_limits(limits, 64, egress=True)
    assert with_egress.memory_bytes - without.memory_bytes == BRIDGE_MEMORY_MB * 1024 * 1024
