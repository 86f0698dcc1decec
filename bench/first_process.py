"""What a job's first process costs on the host kernel, the way each runtime could start it.

    .venv/bin/python -m bench.first_process [--runs 200]

`print(1)` as /job/main.py in the `python` image, three ways, taking turns run by run (this
VM's speed drifts by the minute):

- `script`: a bare `python /job/main.py`, the baseline no wrapper can beat;
- `shell_wrapper`: behind the shell that prints the ready line first (bwrap_run.command);
- `as_script`: the guest's bootstrap, which prints it and runs the script in its own process
  (bundle.program, what gVisor starts).

Each start's CPU is its own and its reaped children's, from wait4: no sandbox around it, only
a chroot into the image root, so that what differs is the first process alone. /job is a bind
of a scratch directory in a mount namespace of this process's own; the image is not touched.
Needs root and the built `python` image.
"""

import argparse
import ctypes
import json
import os
import statistics
import tempfile
from pathlib import Path

from bench._server import IMAGE_DIR
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import SandboxSpec
from sandcell.runtime.bundle import MAIN, program
from sandcell.runtime.bwrap_run import command
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.runtime.mounts import MS_BIND, MS_PRIVATE, MS_REC, mount
from sandcell.services.worker import BASE_ENV

CLONE_NEWNS = 0x20000
_libc = ctypes.CDLL(None, use_errno=True)  # for unshare(2), which Python 3.11's os lacks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs), indent=2))


def measure(runs: int) -> dict[str, object]:
    image = FilesystemImageCatalog(IMAGE_DIR).get("python")
    spec = SandboxSpec("first-process", image, [image.python, MAIN], BASE_ENV, Limits())
    ways = {"script": spec.argv, "shell_wrapper": command(spec), "as_script": program(spec)}
    cpu_ms: dict[str, list[float]] = {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as job:
        Path(job, "main.py").write_text("print(1)\n")
        _own_mount_namespace()
        _checked(mount(job, image.rootfs / "job", flags=MS_BIND))
        for _ in range(runs + 1):  # the first round: page cache
            for way, argv in ways.items():
                cpu_ms[way].append(_start_cpu_ms(image.rootfs, argv, spec.env))
    base = statistics.median(cpu_ms["script"][1:])
    out: dict[str, object] = {"runs": runs}
    for way, samples in cpu_ms.items():
        median = statistics.median(samples[1:])
        out[way] = {
            "median_cpu_ms": round(median, 2),
            "mean_cpu_ms": round(statistics.mean(samples[1:]), 2),
            "vs_script": round(median / base, 3),
        }
    return out


def _own_mount_namespace() -> None:
    """A mount namespace of this process's own, whose mounts the host never sees."""
    _checked(0 if _libc.unshare(CLONE_NEWNS) == 0 else ctypes.get_errno())
    _checked(mount("none", Path("/"), flags=MS_REC | MS_PRIVATE))


def _start_cpu_ms(root: Path, argv: list[str], env: dict[str, str]) -> float:
    pid = os.fork()
    if pid == 0:  # the child: only system calls until the exec
        try:
            os.chroot(root)
            os.chdir("/workspace")
            devnull = os.open("/dev/null", os.O_WRONLY)
            os.dup2(devnull, 1)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        raise SystemExit(f"{argv[:2]} ended with status {status:#x}")
    return (usage.ru_utime + usage.ru_stime) * 1000


def _checked(err: int) -> None:
    if err:
        raise OSError(err, os.strerror(err))


if __name__ == "__main__":
    main()
