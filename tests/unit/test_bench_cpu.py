"""The bench's CPU of a service: each of its processes found by role, and none found is an error."""

import os
import subprocess
import uuid

import pytest
from bench._baselines import cpu_spent_s, process_cpu_s

# Spins for ~0.2 s of CPU once told to on its stdin, then waits to be killed.
SPIN = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
end = time.process_time() + 0.2
while time.process_time() < end:
    pass
print("spun", flush=True)
sys.stdin.readline()
"""


def test_a_role_is_found_by_its_command_line_and_environment_and_charged_its_own_cpu() -> None:
    marker = f"/tmp/bench-cpu-{uuid.uuid4().hex}"
    # The argv the bench matches on: `sandcell.cli.main` and, for the worker, `worker`.
    argv = ["/usr/bin/python3.11", "-c", SPIN, "sandcell.cli.main", "worker"]
    env = os.environ | {"SANDCELL_DATA_DIR": marker}
    with subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as spinner:
        assert spinner.stdin is not None and spinner.stdout is not None
        try:
            assert spinner.stdout.readline() == b"ready\n"
            before = process_cpu_s(marker)
            spinner.stdin.write(b"go\n")
            spinner.stdin.flush()
            assert spinner.stdout.readline() == b"spun\n"

            spent = cpu_spent_s(before, marker)

            assert list(spent) == ["worker"]
            assert 0.15 <= spent["worker"] <= 0.5
        finally:
            spinner.kill()


def test_no_process_with_the_marker_is_an_error_not_zero_cpu() -> None:
    with pytest.raises(LookupError, match="no sandcell process"):
        process_cpu_s(f"/tmp/bench-cpu-{uuid.uuid4().hex}")
