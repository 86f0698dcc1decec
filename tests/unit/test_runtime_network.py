"""What the runtimes ask of runsc and bwrap for a job with and without egress (none is started)."""

from dataclasses import replace
from pathlib import Path
from typing import Any

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.egress import GUEST_CA_BUNDLE, GUEST_SOCKET_DIR, EgressAttachment
from sandcell.ports.runtime import SandboxSpec
from sandcell.runtime import bwrap_run
from sandcell.runtime.bundle import NOFILE, READY_PRINTF, oci_config, program
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.network import BRIDGE_MEMORY_MB, bwrap_egress_launch
from sandcell.runtime.runsc import Runsc
from sandcell.runtime.sandbox import cgroup_limits
from sandcell.runtime.scratch import Scratch

IMAGE = Image("python", "2", "sha256:0", Path("/images/python/2/rootfs"))
ATTACHMENT = EgressAttachment(Path("/state/egress/j-1/sock"), Path("/state/egress/j-1/ca.pem"))
RUN = (Path("/bundle"), "j-1", Path("/log"))  # run_argv's bundle, sandbox id, log


JOB_ENV = {"HOME": "/workspace"}  # a job always has HOME: runsc adds none


def config(egress: EgressAttachment | None) -> dict[str, Any]:
    spec = SandboxSpec("j-1", IMAGE, [IMAGE.python, "/job/main.py"], JOB_ENV, Limits(pids=4))
    return oci_config(replace(spec, egress=egress), Scratch(Path("/state/sandboxes/j-1")))


def nproc(cfg: dict[str, Any]) -> int:
    limits = {r["type"]: r["hard"] for r in cfg["process"]["rlimits"]}
    return int(limits["RLIMIT_NPROC"])


def test_without_egress_nothing_of_it_is_in_the_bundle() -> None:
    cfg = config(None)
    destinations = {m["destination"] for m in cfg["mounts"]}
    assert GUEST_SOCKET_DIR not in destinations and GUEST_CA_BUNDLE not in destinations
    python, flag, script, main = cfg["process"]["args"]  # the as_script bootstrap, no bridge
    assert (python, flag, main) == (IMAGE.python, "-c", "/job/main.py")
    assert script.endswith("\nstart()\n") and "-I -S" not in script
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


# --- bwrap ---------------------------------------------------------------------------------

SCRATCH = Scratch(Path("/state/bwrap/sandboxes/j-1"))
SECCOMP_FD, CA_FD, ARGS_FD = 3, 4, 5
HELPER = "/run/sandcell/launch-0"


def bwrap_launch(egress: EgressAttachment | None) -> tuple[list[str], list[str]]:
    """bwrap's own options (from its memfd) and the launch chain, as BwrapRun builds them."""
    spec = SandboxSpec("j-1", IMAGE, [IMAGE.python, "/job/main.py"], {}, Limits(pids=4))
    spec = replace(spec, egress=egress)
    ca_fd = CA_FD if egress else None
    options = bwrap_run.bwrap_args(spec, SCRATCH, SECCOMP_FD, ca_fd)
    mount_point = bwrap_run.egress_mount_point(SCRATCH)
    step = bwrap_egress_launch(egress, mount_point) if egress else None
    cgroup = SandboxCgroup("sandcell/k/j-1")
    chain = bwrap_run.launcher(
        HELPER, cgroup, 1_000_000_001, spec.limits, ARGS_FD, bwrap_run.command(spec), step
    )
    return options, chain


def launch_steps(chain: list[str]) -> list[tuple[str, str]]:
    """The steps the chain's first program, the launch helper, takes before its `--`."""
    assert chain[0] == HELPER
    steps = chain[1 : chain.index("--")]
    return list(zip(steps[::2], steps[1::2], strict=True))


def launch_rlimits(chain: list[str]) -> dict[str, int]:
    return {step: int(value) for step, value in launch_steps(chain) if step not in ("join", "uid")}


def test_bwrap_without_egress_has_no_mount_step_no_bridge_and_no_extra_task() -> None:
    options, chain = bwrap_launch(None)
    assert GUEST_SOCKET_DIR not in options and GUEST_CA_BUNDLE not in options
    assert "unshare" not in chain and "mount" not in " ".join(chain)
    # pids + bwrap's two tasks + the tripwire slot; the file size cap is the disk's
    disk_bytes = Limits().disk_mb * 1024 * 1024
    assert launch_rlimits(chain) == {"nofile": NOFILE, "core": 0, "fsize": disk_bytes, "nproc": 7}
    steps = launch_steps(chain)  # every cgroup joined, then limits, then the uid, then bwrap
    assert [step for step, _ in steps].count("join") == len(SandboxCgroup("x").procs_files())
    assert steps[-1] == ("uid", "1000000001") and chain[chain.index("--") + 1] == "bwrap"
    script = chain[chain.index("/bin/sh", chain.index("bwrap")) + 2]
    assert script.startswith(READY_PRINTF) and "-I" not in script


def test_bwrap_with_egress_binds_the_socket_dir_as_root_and_starts_the_bridge_first() -> None:
    options, chain = bwrap_launch(ATTACHMENT)
    mount_point = str(SCRATCH.root / "egress")
    at = options.index(GUEST_SOCKET_DIR)
    assert options[at - 2 : at + 1] == ["--ro-bind", mount_point, GUEST_SOCKET_DIR]
    at = options.index(GUEST_CA_BUNDLE)
    assert options[at - 2 : at + 1] == ["--ro-bind-data", str(CA_FD), GUEST_CA_BUNDLE]
    # bwrap never sees the egress state directory: the chain binds it while still root, in a
    # mount namespace of its own, before dropping to the sandbox's uid.
    assert str(ATTACHMENT.socket_dir) not in options and str(ATTACHMENT.ca_bundle) not in options
    unshare = chain.index("unshare")
    assert chain[unshare : unshare + 5] == ["unshare", "--mount", "--propagation", "slave", "--"]
    assert chain[unshare + 9 : unshare + 11] == [str(ATTACHMENT.socket_dir), mount_point]
    assert ("uid", "1000000001") not in launch_steps(chain)  # root until the mount is made
    again = chain.index(HELPER, unshare)
    assert chain.index("--") < unshare < again < chain.index("bwrap")
    assert chain[again : again + 4] == [HELPER, "uid", "1000000001", "--"]
    assert launch_rlimits(chain)["nproc"] == 8  # the bridge's task on top
    script = chain[chain.index("/bin/sh", chain.index("bwrap")) + 2]
    bridge_at, ready_at = script.index(f"{IMAGE.python} -I -S -c"), script.index(READY_PRINTF)
    assert bridge_at < ready_at and "127.0.0.1 3128 /run/sandcell/egress/proxy.sock" in script


def test_bwrap_adds_the_bridge_memory_and_task_to_the_cgroup() -> None:
    limits = Limits(memory_mb=100, pids=4)
    without = bwrap_run.cgroup_limits(limits, 16)
    with_egress = bwrap_run.cgroup_limits(limits, 16, egress=True)
    assert with_egress.memory_bytes - without.memory_bytes == BRIDGE_MEMORY_MB * 1024 * 1024
    assert (without.pids_max, with_egress.pids_max) == (4 + 2, 4 + 2 + 1)


def test_only_a_jobs_own_code_with_home_skips_the_shell_wrapper() -> None:
    """The bootstrap runs `python /job/main.py` itself; everything else execs from the shell."""
    job = SandboxSpec("j-1", IMAGE, [IMAGE.python, "/job/main.py"], JOB_ENV, Limits())
    assert program(job)[:2] == [IMAGE.python, "-c"]
    others = [
        replace(job, argv=[IMAGE.python, "-c", "print(1)"]),  # a command of the tenant's
        replace(job, argv=["/usr/bin/env", IMAGE.python, "/job/main.py"]),
        replace(job, env={}),  # runsc would add HOME; only the shell's exec drops it
        replace(job, egress=ATTACHMENT),  # the bridge starts before the ready line
    ]
    for spec in others:
        argv = program(spec)
        assert argv[:2] == ["/bin/sh", "-c"] and argv[-len(spec.argv) :] == spec.argv
