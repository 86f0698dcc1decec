"""What a job's scratch disk costs the host: made, mounted and torn down, CPU per sandbox.

    .venv/bin/python -m bench.scratch_disk [--runs 40] [--disk-mb 256]

Three ways side by side, in one run: formatted in place (mkfs.ext4, as a scratch without
blank images does), copied from a blank image made once per size (what the gVisor runtime
does) and kept from the last sandbox, emptied (what the bwrap runtime does, disk_shelf.py).
CPU is this process's and its children's (mkfs), and, beside it, the machine's: the kernel's
own threads (loop devices, the filesystem's) do part of the work. The loop device is bound
the same way in all three. Needs root (loop devices, mounts).
"""

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench._baselines import busy_cpu_s
from sandcell.runtime.disk_shelf import DiskShelf
from sandcell.runtime.ext4 import BlankDisks
from sandcell.runtime.scratch import Scratch, scratch_blanks


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measure(
    base: Path, blanks: BlankDisks | None, runs: int, disk_mb: int, shelf: DiskShelf | None = None
) -> dict[str, float]:
    base.mkdir()
    create = teardown = wall = machine = 0.0
    for n in range(runs + 1):  # the first: page cache, and the blank image made
        scratch = Scratch(base / f"s{n}", blanks, shelf=shelf)
        scratch.claim()
        started, began, busy = cpu_s(), time.perf_counter(), busy_cpu_s()
        scratch.create(b"print(1)", [], disk_mb)
        (scratch.workspace / "result.txt").write_text("a job's file\n")
        made, made_at = cpu_s(), time.perf_counter()
        if scratch.teardown(reusable=True):
            raise SystemExit(f"scratch {scratch.root} was not released")
        if n:
            create += made - started
            teardown += cpu_s() - made
            wall += made_at - began
            machine += busy_cpu_s() - busy
    return {
        "create_cpu_ms": round(create / runs * 1000, 2),
        "create_wall_ms": round(wall / runs * 1000, 2),
        "teardown_cpu_ms": round(teardown / runs * 1000, 2),
        "machine_cpu_ms": round(machine / runs * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--disk-mb", type=int, default=256)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sandcell-bench-disk-", dir="/var/tmp"))
    blanks = scratch_blanks(base / "blanks")
    for name in ("kept-mounts", "kept-images"):
        (base / name).mkdir()
    shelf = DiskShelf(base / "kept-mounts", base / "kept-images", blanks)
    try:
        report = {
            "formatted_in_place": measure(base / "mkfs", None, args.runs, args.disk_mb),
            "copied_from_blank": measure(base / "blank", blanks, args.runs, args.disk_mb),
            "kept_and_emptied": measure(base / "kept", blanks, args.runs, args.disk_mb, shelf),
        }
    finally:
        shelf.close()
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"disk_mb": args.disk_mb, "runs": args.runs, **report}, indent=2))


if __name__ == "__main__":
    main()
