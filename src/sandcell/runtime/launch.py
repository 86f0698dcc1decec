"""The launch helper (launch.c): joins a sandbox's cgroups, sets its rlimits, becomes its uid.

Both runtimes start their sandboxes through it: bwrap behind every step, runsc behind the
cgroup joins alone (runsc needs root; it sets its own limits inside).

A bwrap sandbox used to get these from dash's builtins and then setpriv(1): two process
starts before bwrap's own, ~1.6 ms of the machine's CPU a job on this VM. One static binary
does the same in one start, ~1 ms less (bench/RESULTS.md, session 29); one without a C
library, whose start-up asks the CPU about its caches at a VM exit a question, 0.7 ms less
again (session 35).

It is compiled by the host's C compiler (as the images' statx_compat.c is), once per boot and
source, into sandcell's own tmpfs (volatile.RUN_ROOT): root's, and writable by root only, as
anything the worker runs as root must be.
"""

import hashlib
import os
import subprocess
import threading
from functools import cache
from pathlib import Path

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.volatile import RUN_ROOT, ensure_tmpfs

SOURCE = Path(__file__).with_name("launch.c")
# No C library (launch.c says why): its own entry point and system calls, linked static at a
# fixed address, with nothing the compiler would otherwise take from a C library's runtime.
COMPILE = (
    *("cc", "-static", "-nostdlib", "-fno-pie", "-no-pie", "-ffreestanding"),
    *("-fno-stack-protector", "-fno-tree-loop-distribute-patterns"),
    *("-O2", "-Wall", "-Wextra", "-Werror", "-x", "c", "-"),
)
COMPILE_TIMEOUT_S = 120
FAILED_EXIT = 125  # a step failed: nothing of the sandbox ran


def launch_helper(root: Path = RUN_ROOT) -> str:
    """The helper's path, compiled first if this boot has not compiled this source yet (or
    it is gone: one stat a sandbox)."""
    path = _helper_path(root)
    if not os.path.exists(path):
        if root == RUN_ROOT:
            ensure_tmpfs(root)
        _compile(_source(), Path(path))
    return path


def join_steps(cgroup: SandboxCgroup) -> list[str]:
    """The helper's steps that move it into every controller of `cgroup`."""
    return [arg for procs in cgroup.procs_files() for arg in ("join", str(procs))]


def in_cgroup(cgroup: SandboxCgroup, argv: list[str]) -> list[str]:
    """`argv`, started inside every controller of `cgroup` by the helper, which joins them
    and then execs it (status FAILED_EXIT, and `argv` never runs, if a join fails). A shell
    did this for runsc before: a start of dash and of its C library, 0.8 ms of the
    machine's CPU a sandbox here against the helper's own (session 36)."""
    return [launch_helper(), *join_steps(cgroup), "--", *argv]


@cache
def _helper_path(root: Path) -> str:
    """Named by a digest of the source and the compiler's arguments."""
    digest = hashlib.sha256(_source() + "\0".join(COMPILE).encode()).hexdigest()
    return str(root / f"launch-{digest[:16]}")


@cache
def _source() -> bytes:
    return SOURCE.read_bytes()


def _compile(source: bytes, path: Path) -> None:
    # Built under a name of its own and renamed into place: another process may be at it too.
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        done = subprocess.run(
            [*COMPILE, "-o", str(partial)],
            input=source,
            capture_output=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        if done.returncode != 0:
            error = done.stderr.decode(errors="replace").strip()[-500:]
            raise RuntimeUnavailable(f"cannot compile the launch helper: {error}")
        partial.chmod(0o700)
        partial.rename(path)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeUnavailable(f"cannot compile the launch helper: {exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
