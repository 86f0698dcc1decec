"""The launch helper (runtime/launch.c), run as root as the worker runs it: what the program
it starts is left with, and that any step it cannot take stops it before the program runs."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.runtime.cgroups import CONTROLLERS, CgroupLimits, SandboxCgroup
from sandcell.runtime.launch import FAILED_EXIT, join_steps, launch_helper

pytestmark = pytest.mark.bwrap

UID = 1_999_999_001  # outside every runtime's uid range (bwrap.UID_BASE + blocks)
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def helper() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root: the helper joins cgroups and changes uid")
    return launch_helper()


@pytest.fixture
def cgroup() -> Iterator[SandboxCgroup]:
    made = SandboxCgroup(f"sandcell/test-launch/{os.getpid()}")
    made.create(CgroupLimits(64 * MiB, 1.0, 16))
    yield made
    made.kill_all()
    assert made.remove()
    SandboxCgroup("sandcell/test-launch").remove()


def launch(helper: str, *steps: str, program: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    argv = [helper, *steps, "--", *program]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin"}
    )


def status(text: str) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def test_the_program_runs_in_every_cgroup_within_its_limits_as_its_uid_without_privileges(
    helper: str, cgroup: SandboxCgroup
) -> None:
    joins = join_steps(cgroup)
    limits = ["nofile", "64", "core", "0", "fsize", str(MiB), "nproc", "40"]
    show = "cat /proc/self/status; echo; cat /proc/self/limits; echo; cat /proc/self/cgroup"
    done = launch(helper, *joins, *limits, "uid", str(UID), program=("/bin/sh", "-c", show))
    assert done.returncode == 0, done.stderr
    proc_status, proc_limits, proc_cgroups = done.stdout.split("\n\n")
    fields = status(proc_status)
    assert fields["Uid"].split() == [str(UID)] * 4 and fields["Gid"].split() == [str(UID)] * 4
    assert fields["Groups"] == ""
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(fields[capability_set], 16) == 0, capability_set
    assert fields["NoNewPrivs"] == "1"
    rows = {line[:26].strip(): line[26:].split()[:2] for line in proc_limits.splitlines()[1:]}
    assert rows["Max open files"] == ["64", "64"] and rows["Max core file size"] == ["0", "0"]
    assert rows["Max file size"] == [str(MiB)] * 2 and rows["Max processes"] == ["40", "40"]
    paths = {}  # controller -> the process's cgroup in that hierarchy
    for line in proc_cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        paths.update(dict.fromkeys(controllers.split(","), path))
    assert all(paths[c] == f"/{cgroup.relpath}" for c in CONTROLLERS), paths


@pytest.mark.parametrize(
    "steps",
    [
        ("join", "/sys/fs/cgroup/pids/no-such-cgroup/cgroup.procs"),
        ("nofile", "many"),
        ("nofile", "-1"),
        ("fsize", ""),
        ("seccomp", "0"),  # no such step
        ("uid",),  # a step without its value
    ],
)
def test_a_step_it_cannot_take_ends_it_before_the_program_runs(
    helper: str, tmp_path: Path, steps: tuple[str, ...]
) -> None:
    marker = tmp_path / "ran"
    done = launch(helper, *steps, program=("/usr/bin/touch", str(marker)))
    assert done.returncode == FAILED_EXIT and done.stderr.startswith("sandcell-launch: ")
    assert not marker.exists()


def test_once_it_left_root_neither_the_helper_nor_root_is_within_reach(helper: str) -> None:
    assert os.stat(helper).st_uid == 0 and os.stat(helper).st_mode & 0o077 == 0
    again = (helper, "uid", "0", "--", "/usr/bin/id", "-u")
    done = launch(helper, "uid", str(UID), program=again)
    assert done.returncode == FAILED_EXIT and "Permission denied" in done.stderr
    setuid = "import os\ntry: os.setresuid(0, 0, 0)\nexcept PermissionError: print('refused')"
    done = launch(helper, "uid", str(UID), program=("/usr/bin/python3.11", "-c", setuid))
    assert done.stdout == "refused\n", done.stderr


def test_it_is_compiled_where_asked_and_again_once_gone(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: as the worker")
    path = launch_helper(tmp_path)
    assert Path(path).parent == tmp_path and os.stat(path).st_mode & 0o777 == 0o700
    os.unlink(path)
    assert launch_helper(tmp_path) == path and os.access(path, os.X_OK)
    assert sorted(os.listdir(tmp_path)) == [Path(path).name]  # no partial build left
