"""What the launch helper's own start costs, against a static C program's that only execs.

    .venv/bin/python -m bench.launch_step [--runs 1000]

Three ways to run `/usr/bin/true`, taking turns run by run (this VM's speed drifts):

- `true`: alone, the part every way shares;
- `launch`: behind the launch helper (runtime/launch.c) with a bwrap job's rlimit steps;
- `static_libc`: behind a static binary linked with the C library that only execs (compiled
  here), as the helper was until session 35.

Each start's CPU (user + system) is the process's own, from wait4. A C library's start-up
asks the CPU about its caches, some seventy cpuid instructions, and in a VM each is an exit
to the hypervisor; the helper has no C library. Needs root (the helper is root's) and `cc`.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from sandcell.runtime.launch import launch_helper

TARGET = "/usr/bin/true"
EXEC_ONLY = b"#include <unistd.h>\nint main(int c, char **v) { (void)c; execv(v[1], v + 1); }\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs), indent=2))


def measure(runs: int) -> dict[str, object]:
    steps = ["nofile", "1024", "core", "0", "fsize", str(1 << 30), "nproc", "80"]
    with tempfile.TemporaryDirectory() as scratch:
        static_libc = str(Path(scratch, "exec-only"))
        subprocess.run(
            ["cc", "-static", "-O2", "-x", "c", "-", "-o", static_libc],
            input=EXEC_ONLY,
            check=True,
        )
        ways = {
            "true": [TARGET],
            "launch": [launch_helper(), *steps, "--", TARGET],
            "static_libc": [static_libc, TARGET],
        }
        cpu_us: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(runs + 1):  # the first round: page cache
            for way, argv in ways.items():
                cpu_us[way].append(_start_cpu_us(argv))
    alone = statistics.median(cpu_us["true"][1:])
    own = {way: statistics.median(cpu_us[way][1:]) - alone for way in ("launch", "static_libc")}
    return {
        "runs": runs,
        "true_us": round(alone, 1),
        **{f"{way}_own_us": round(us, 1) for way, us in own.items()},
        "static_libc_vs_launch": round(own["static_libc"] / max(own["launch"], 1.0), 1),
    }


def _start_cpu_us(argv: list[str]) -> float:
    pid = os.posix_spawn(argv[0], argv, {"PATH": "/usr/bin:/bin"})
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed: {status}")
    return (usage.ru_utime + usage.ru_stime) * 1e6


if __name__ == "__main__":
    main()
