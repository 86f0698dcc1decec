"""The OCI runtime spec (config.json) that runsc boots for one sandbox.

Everything the sandbox may see or do is written down here: a read-only image root, uid 65534
with no capabilities and no_new_privs, five namespaces, an io_uring-denying seccomp filter,
rlimits, and exactly four host directories (/job, /input, /workspace, /output) — plus, for a
job with egress, its proxy socket directory and CA bundle (see network.py), and for a job the
guest helper's package and channel (guest_mounts.py, added by sandbox.py).
"""

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from sandcell.domain.limits import Limits
from sandcell.ports.runtime import SandboxSpec
from sandcell.runtime.guest_mounts import GUEST_SOURCE
from sandcell.runtime.network import BRIDGE_TASKS, egress_mounts, start_bridge
from sandcell.runtime.scratch import GUEST_UID, Scratch

# The first line the sandbox writes on stdout; the guest cannot write before it, because the
# shell prints it and only then `exec`s the program. The runtime strips it from the output.
READY_MARKER = b"\x1esandcell-ready\n"
READY_PRINTF = 'printf "\\036sandcell-ready\\n"; '
MAIN = "/job/main.py"  # a job's code
# Variables that appear without the spec asking: runsc adds HOME, the shell exports PWD.
ADDED_BY_THE_WRAPPING = ("HOME", "PWD")
NOFILE = 1024
CAPABILITY_SETS = ("bounding", "effective", "inheritable", "permitted", "ambient")
NAMESPACES = ("pid", "network", "ipc", "uts", "mount")
# This runsc lets io_uring through unless an OCI seccomp filter denies it (--oci-seccomp).
DENIED_SYSCALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register")


def nproc_limit(limits: Limits, egress: bool = False) -> int:
    """RLIMIT_NPROC inside gVisor, which counts the sandbox's tasks (threads included).

    One above the budget: the extra slot is the tripwire the runtime watches for, so a program
    that uses exactly `pids` tasks runs, and one that tries for more is caught (reason pids).
    With egress, the bridge's task is added on top: it is ours, not the program's.
    """
    return limits.pids + 1 + (BRIDGE_TASKS if egress else 0)


def oci_config(spec: SandboxSpec, scratch: Scratch) -> dict[str, Any]:
    mounts = _mounts(scratch) + (egress_mounts(spec.egress) if spec.egress else [])
    return {
        "ociVersion": "1.0.2",
        "process": _process(spec),
        "root": {"path": str(spec.image.rootfs), "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": ns} for ns in NAMESPACES],
            "seccomp": {
                "defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [{"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO"}],
            },
        },
    }


def write_config(config: dict[str, Any], bundle: Path) -> None:
    path = bundle / "config.json"
    path.write_text(json.dumps(config, indent=1))
    path.chmod(0o600)


def require_mount_points(config: dict[str, Any], rootfs: Path) -> None:
    """Raise ValueError unless the image has every mount point the bundle names.

    runsc makes a missing one itself, in the host's image directory, despite the read-only
    root: the image would change under its recorded digest. Images make them at build time.
    A missing root is left to runsc, which refuses it (and says so).
    """
    if not rootfs.is_dir():
        return
    missing = [
        mount["destination"]
        for mount in config["mounts"]
        if not os.path.lexists(rootfs / mount["destination"].lstrip("/"))
    ]
    if missing:
        raise ValueError(f"the image has no mount point for {missing}; rebuild it")


def check_env(env: dict[str, str]) -> None:
    """Raise ValueError for a variable the OCI runtime would mangle or reject."""
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"invalid environment variable {key!r}")


def _process(spec: SandboxSpec) -> dict[str, Any]:
    limits = spec.limits
    disk_bytes = limits.disk_mb * 1024 * 1024
    return {
        "terminal": False,
        "user": {"uid": GUEST_UID, "gid": GUEST_UID, "additionalGids": []},
        "args": program(spec),
        "env": [f"{key}={value}" for key, value in spec.env.items()],  # exactly the spec's
        "cwd": "/workspace",
        "noNewPrivileges": True,
        # `runsc spec` would grant AUDIT_WRITE, KILL and NET_BIND_SERVICE even to uid 65534,
        # and gVisor honours them: every set is spelled out empty.
        "capabilities": {name: [] for name in CAPABILITY_SETS},
        "rlimits": [
            _rlimit("RLIMIT_NOFILE", NOFILE),
            _rlimit("RLIMIT_CORE", 0),
            _rlimit("RLIMIT_FSIZE", disk_bytes),
            _rlimit("RLIMIT_NPROC", nproc_limit(limits, spec.egress is not None)),
        ],
    }


def program(spec: SandboxSpec) -> list[str]:
    """The sandbox's first process: it prints the ready line, then becomes the program.

    A job's own code, `python /job/main.py`, is started as the image's python running the
    guest's `as_script` bootstrap, which prints the line and runs the script in the same
    process: one exec fewer than the shell wrapper, which costs a new address space under
    gVisor (~17 ms of the job's wall time). Any other program gets the shell wrapper; so
    does a job whose egress bridge starts first, and a spec without HOME: runsc would add
    one, and only an exec takes it out of the process's /proc/self/environ (jobs always have
    HOME). bwrap needs neither: it runs a job's own code as it is (bwrap_run.command). On the
    host kernel the bootstrap would cost more than even the shell's exec: its compile() is the
    process's first, which builds the interpreter's AST types (13.6 ms of CPU a start, against
    the wrapper's 12.8 and a bare script's 12.1: `python -m bench.first_process`).
    """
    bridge = spec.image.python if spec.egress is not None else None
    if runs_own_code(spec) and "HOME" in spec.env:
        return [spec.image.python, "-c", f"{_as_script_source()}\nstart()\n", MAIN]
    return [*ready_wrapper(spec.env, bridge), *spec.argv]


def runs_own_code(spec: SandboxSpec) -> bool:
    """Whether the sandbox runs a job's own code, `python /job/main.py`, with no egress
    bridge to start first: its first process can be the program itself."""
    return spec.egress is None and spec.argv == [spec.image.python, MAIN]


@cache
def _as_script_source() -> str:
    return (GUEST_SOURCE / "as_script.py").read_text()


def ready_wrapper(env: dict[str, str], bridge_python: str | None = None) -> list[str]:
    """The shell that prints the ready line, then becomes the program with exactly `env`.

    With `bridge_python` (a job with egress), the egress bridge runs under that interpreter
    first, and the ready line comes only once it listens.
    """
    unset = [name for name in ADDED_BY_THE_WRAPPING if name not in env]
    script = start_bridge(bridge_python) if bridge_python else ""
    script += READY_PRINTF + (f"unset {' '.join(unset)}; " if unset else "") + 'exec "$@"'
    return ["/bin/sh", "-c", script, "sh"]


def _rlimit(kind: str, value: int) -> dict[str, Any]:
    return {"type": kind, "hard": value, "soft": value}


def _mounts(scratch: Scratch) -> list[dict[str, Any]]:
    ro, rw = ["rbind", "ro", "nosuid", "nodev"], ["rbind", "rw", "nosuid", "nodev"]
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        # In the sentry's memory, so bounded by the memory limit.
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777"],
        },
        # POSIX semaphores and shared memory (multiprocessing's Pool and Lock, shared_memory):
        # gVisor's own /dev/shm is root's alone. The same memory bound as /tmp.
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "nodev", "noexec", "mode=1777"],
        },
        _bind("/job", scratch.job, ro),
        _bind("/input", scratch.input, ro),
        _bind("/workspace", scratch.workspace, rw),
        _bind("/output", scratch.output, [*rw, "noexec"]),  # results are data, not programs
    ]


def _bind(destination: str, source: Path, options: list[str]) -> dict[str, Any]:
    return {"destination": destination, "type": "bind", "source": str(source), "options": options}
