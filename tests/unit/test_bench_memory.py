"""The bench's memory of a sandbox counts every process of it, the unnamed ones too."""

import os
import signal
import subprocess
import uuid
from pathlib import Path

from bench._baselines import pss_mib

# A child whose command line names nothing of its parent's, holding 64 MiB of its own.
CHILD = "import time; b = b'x' * (64 << 20); print('ready', flush=True); time.sleep(60)"


def pss_kib(pid: int) -> int:
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    return next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))


def test_the_children_of_a_named_process_count_though_their_command_lines_do_not_name_it() -> None:
    # As gVisor's ptrace stubs: forked by the sentry, with nothing of its command line.
    marker = f"/tmp/bench-marker-{uuid.uuid4().hex}/"
    script = 'exec -a unnamed /usr/bin/python3.11 -c "$1" & wait'
    with subprocess.Popen(["bash", "-c", script, marker, CHILD], stdout=subprocess.PIPE) as parent:
        assert parent.stdout is not None
        children = []
        try:
            assert parent.stdout.readline() == b"ready\n"
            children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
            assert len(children) == 1
            child = int(children[0])
            assert marker.encode() not in Path(f"/proc/{child}/cmdline").read_bytes()

            total_mib, processes = pss_mib(marker)

            assert processes == 2
            assert total_mib >= 64
            assert abs(total_mib - (pss_kib(parent.pid) + pss_kib(child)) / 1024) < 2
        finally:
            for pid in map(int, children):
                os.kill(pid, signal.SIGKILL)
            parent.kill()
