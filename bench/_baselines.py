"""Baselines measured in the same run: a bare interpreter, a cold `runsc run`, a raw `bwrap`;
and the tools every benchmark shares (timing, summaries, rates, memory of a process set)."""

import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import SandboxSpec
from sandcell.runtime.bundle import oci_config, write_config
from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.bwrap_run import LAUNCH_ENV, args_memfd, isolation_args, launcher, memfd_with
from sandcell.runtime.bwrap_run import cgroup_limits as bwrap_cgroup_limits
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.launch import in_cgroup, launch_helper
from sandcell.runtime.one_shot import EXIT_WAIT_S
from sandcell.runtime.sandbox import cgroup_limits as runsc_cgroup_limits
from sandcell.runtime.scratch import Scratch

PYTHON = "/usr/bin/python3.11"
MiB = 1024 * 1024


def timed(action: Callable[[], object], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[max(0, int(len(ordered) * 0.9 + 0.5) - 1)], 1),
        "runs": len(ordered),
    }


def rate(action: Callable[[], object], total: int, concurrency: int) -> float:
    """Actions per second with `concurrency` threads doing `total` actions between them."""
    left = iter(range(total))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop() -> None:
        while True:
            with lock:
                if next(left, None) is None:
                    return
            try:
                action()
            except BaseException as exc:  # reported after the run, not lost in a thread
                errors.append(exc)
                return

    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return round(total / (time.perf_counter() - started), 2)


HZ = os.sysconf("SC_CLK_TCK")


def busy_cpu_s() -> float:
    """CPU seconds this machine has spent busy (every core, every process, the kernel) since
    boot: the difference over a run is what the run cost, whoever paid for it. Steal (time the
    hypervisor gave another guest: 2-30% here, varying by the minute) is not ours, and guest
    time is already in user time."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, *_ = map(int, stat.readline().split()[1:])
    return (user + nice + system + irq + softirq) / HZ


def process_cpu_s(marker: str) -> dict[str, float]:
    """Own CPU seconds (not their reaped children's) of the sandcell processes whose
    environment names `marker` (a scratch data dir): the API process and its worker."""
    found: dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if (
                b"sandcell.cli.main" not in argv
                or marker.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
            ):
                continue
            fields = _stat_fields(pid)
        except OSError:
            continue
        role = "worker" if b"worker" in argv else "api"
        found[role] = found.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / HZ
    if not found:
        raise LookupError(f"no sandcell process runs with {marker} in its environment")
    return found


def cpu_spent_s(before: dict[str, float], marker: str) -> dict[str, float]:
    """CPU seconds each role found now has spent since `before` (a `process_cpu_s`). The
    kernel counts in clock ticks (10 ms): a few jobs may fall short of one."""
    after = process_cpu_s(marker)
    return {role: after[role] - before.get(role, 0.0) for role in sorted(after)}


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parens):
    [0] the state, [1] the parent's pid, [11] and [12] user and system CPU in ticks."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def bare_python(runs: int) -> list[float]:
    return timed(bare_python_once, runs)


def bare_python_once() -> None:
    subprocess.run([PYTHON, "-c", "print(1)"], check=True, capture_output=True)


def bare_python_printing(code: str) -> None:
    """A bare python running `code`, its output read from a pipe."""
    subprocess.run([PYTHON, "-c", code], check=True, capture_output=True)


@contextmanager
def runsc_launcher(rootfs: Path) -> Iterator[Callable[[], None]]:
    """A function that does one cold `runsc run` of a minimal bundle over `rootfs`, printing 1."""
    with tempfile.TemporaryDirectory() as scratch:
        bundle = Path(scratch)
        subprocess.run(["runsc", "spec"], cwd=bundle, check=True)
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"] = {"path": str(rootfs), "readonly": True}
        spec["process"].update(terminal=False, args=[PYTHON, "-c", "print(1)"])
        (bundle / "config.json").write_text(json.dumps(spec))
        counter = count()

        def once() -> None:
            name = f"bench-{os.getpid()}-{time.monotonic_ns()}-{next(counter)}"
            argv = ["runsc", "--root", f"{scratch}/state", "--network=none", "run"]
            subprocess.run(
                [*argv, "--bundle", str(bundle), name],
                check=True,
                capture_output=True,
                stdin=subprocess.DEVNULL,
            )

        yield once


def cold_runsc(rootfs: Path, runs: int) -> list[float]:
    with runsc_launcher(rootfs) as once:
        return timed(once, runs)


def raw_bwrap(rootfs: Path) -> list[str]:
    """A raw `bwrap` over the image root (sandcell's namespaces; none of its volume, cgroups,
    seccomp or uid switch), before its own options and the program."""
    return [
        *("bwrap", "--unshare-all", "--unshare-user", "--die-with-parent"),
        *("--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev"),
    ]


def raw_bwrap_once(rootfs: Path) -> Callable[[], None]:
    """One raw `bwrap` over the image, printing 1."""
    argv = [*raw_bwrap(rootfs), PYTHON, "-c", "print(1)"]

    def once() -> None:
        subprocess.run(argv, check=True, capture_output=True)

    return once


FLOOR_ENV = {"PATH": "/usr/bin:/bin"}


def _contract_dirs(root: Path) -> Scratch:
    """Plain directories for the contract's /job, /input, /workspace and /output (a floor has
    no scratch disk); the two writable ones for whatever uid a floor sandbox runs as."""
    scratch = Scratch(root)
    for path in (scratch.bundle, scratch.job, scratch.input, scratch.workspace, scratch.output):
        path.mkdir(parents=True)
    for path in (scratch.workspace, scratch.output):
        path.chmod(0o777)
    return scratch


@contextmanager
def isolated_bwrap_launcher(
    rootfs: Path, disk_mb: int | None = None
) -> Iterator[Callable[[], None]]:
    """A function that starts `print(1)` in a bwrap sandbox with only what issue 6 and the
    contract ask of that tier, launched as the runtime launches a job: a cgroup with the
    default job limits, rlimits, a host uid of its own without capabilities, every namespace,
    the seccomp filter, the image root read-only and the contract's four directories. No
    ready line, no watch, no service: what no job on this tier can beat. With `disk_mb`, each
    start also gets a job's scratch disk of that size, as the bwrap runtime gets it (a kept
    one, emptied after, or a blank image's copy, loop-mounted); without it, plain
    directories."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as state:
        Path(state).chmod(0o711)
        runtime = BwrapRuntime(Path(state))
        runtime.ensure_dirs()  # where its disks are kept
        plain = _contract_dirs(Path(state) / "floor")
        limits = Limits()
        counter = count()
        helper = launch_helper()

        def once() -> None:
            n, uid = next(counter), runtime.uids.take()
            disk = Path(state) / f"disk-{n}"
            scratch = plain if disk_mb is None else _scratch_disk(runtime, disk, uid, disk_mb)
            cgroup = SandboxCgroup(f"{runtime.cgroup_parent}/floor-{n}")
            cgroup.create(bwrap_cgroup_limits(limits, runtime.overhead_mb))
            seccomp_fd = memfd_with("sandcell-seccomp", runtime.seccomp_filter())
            args_fd = args_memfd([*isolation_args(seccomp_fd), *_floor_binds(rootfs, scratch)])
            try:
                done = subprocess.run(
                    launcher(helper, cgroup, uid, limits, args_fd, [PYTHON, "-c", "print(1)"]),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    env=LAUNCH_ENV,
                    pass_fds=(seccomp_fd, args_fd),
                    start_new_session=True,
                )
            finally:
                os.close(seccomp_fd)
                os.close(args_fd)
            gone = cgroup.remove()  # as the runtime: only then may the disk be kept
            left = [] if scratch is plain else scratch.teardown(reusable=gone)
            if done.stdout != b"1\n" or not gone or left:
                raise RuntimeError(f"isolated bwrap failed: {done.stderr[-500:]!r} {left}")
            runtime.uids.give_back(uid)

        try:
            yield once
        finally:
            runtime.close()


def _scratch_disk(runtime: BwrapRuntime, root: Path, uid: int, disk_mb: int) -> Scratch:
    """A job's scratch as BwrapRun prepares it: its code, and the disk for /workspace and
    /output (from the runtime's shelf of kept disks), owned by the sandbox's uid."""
    scratch = Scratch(root, runtime.blanks, shelf=runtime.shelf)
    scratch.claim()
    scratch.let_through()
    scratch.create(b"print(1)\n", [], disk_mb)
    for path in (scratch.workspace, scratch.output):
        os.chown(path, uid, uid)
    return scratch


def _floor_binds(rootfs: Path, dirs: Scratch) -> list[str]:
    return [
        *("--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev"),
        *("--ro-bind", str(dirs.job), "/job", "--ro-bind", str(dirs.input), "/input"),
        *("--bind", str(dirs.workspace), "/workspace", "--bind", str(dirs.output), "/output"),
        *("--chdir", "/workspace", "--clearenv", "--setenv", "PATH", FLOOR_ENV["PATH"]),
    ]


@contextmanager
def contract_runsc_launcher(image: Image) -> Iterator[Callable[[], None]]:
    """A function that runs `print(1)` under `runsc run` with only what the contract asks of a
    gVisor job, as the runtime launches one: its OCI bundle (uid 65534 without capabilities,
    no_new_privs, rlimits, the io_uring-denying seccomp filter, the image root read-only, the
    contract's four directories) and runsc flags, in a cgroup with the default job limits. No
    scratch disk, no ready line, no helper mounts, no watch, no service."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as state:
        runtime = GVisorRuntime(Path(state))
        dirs = _contract_dirs(Path(state) / "floor")
        spec = SandboxSpec("floor", image, [image.python, "-c", "print(1)"], FLOOR_ENV, Limits())
        config = oci_config(spec, dirs)
        config["process"]["args"] = spec.argv  # the program itself, not the ready wrapper
        write_config(config, dirs.bundle)
        counter = count()

        def once() -> None:
            name = f"floor-{next(counter)}"
            cgroup = SandboxCgroup(f"{runtime.cgroup_parent}/{name}")
            cgroup.create(runsc_cgroup_limits(spec.limits, runtime.overhead_mb))
            run = runtime.runsc.run_argv(dirs.bundle, name, Path(state) / f"{name}.log")
            done = subprocess.run(
                in_cgroup(cgroup, run),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                start_new_session=True,
            )
            if done.stdout != b"1\n" or not cgroup.remove(EXIT_WAIT_S):
                raise RuntimeError(f"contract runsc failed: {done.stderr[-500:]!r}")

        try:
            yield once
        finally:
            runtime.close()


def pss_mib(marker: str) -> tuple[float, int]:
    """Proportional set size (MiB) of every process whose command line contains `marker` and
    of every descendant of one, and how many processes there were. The descendants count:
    under gVisor's ptrace platform the sandboxed program runs in stub processes the sentry
    forks, with an empty command line, and its memory is mapped there. PSS splits shared pages
    fairly (the sentry maps the same memory file as its stubs), so sums do not double count."""
    children: dict[int, list[int]] = {}
    named = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            parent = int(_stat_fields(pid)[1])
        except OSError:  # gone meanwhile
            continue
        children.setdefault(parent, []).append(pid)
        if marker.encode() in cmdline:
            named.append(pid)
    total, found, seen = 0, 0, set()
    while named:
        pid = named.pop()
        if pid in seen:
            continue
        seen.add(pid)
        named += children.get(pid, [])
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        found += 1
        total += next(int(line.split()[1]) for line in rollup.splitlines() if line[:4] == "Pss:")
    return round(total * 1024 / MiB, 1), found


# What the interpreter alone holds once the modules named in its arguments are imported.
INTERPRETER_MEMORY = """
import gc, importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
gc.collect()
rollup = dict(line.split(":") for line in list(open("/proc/self/smaps_rollup"))[1:])
print(*(int(rollup[key].split()[0]) for key in ("Rss", "Pss_Anon")))
"""


def interpreter_alone_mib(rootfs: Path, modules: tuple[str, ...]) -> dict[str, float]:
    """The image's python with `modules` imported, outside any sandbox but for a raw bwrap
    over the image root (it has the modules; the host may not): its RSS, and of that its
    private anonymous memory, which no sandbox of any kind could share or leave out."""
    argv = [
        *raw_bwrap(rootfs),
        *("--tmpfs", "/tmp", "--setenv", "MPLCONFIGDIR", "/tmp"),
        *(PYTHON, "-c", INTERPRETER_MEMORY, *modules),
    ]
    done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
    rss_kib, anon_kib = map(int, done.stdout.split())
    return {"rss_mib": round(rss_kib / 1024, 1), "anonymous_mib": round(anon_kib / 1024, 1)}
