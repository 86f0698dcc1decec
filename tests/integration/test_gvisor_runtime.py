"""The gVisor runtime against real runsc and the real `python` image.

Every run also asserts (in `run_code`) that nothing of the sandbox is left on the host: scratch
dir, runsc state, cgroup, loop device, and any host process mentioning the sandbox id.
"""

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import InputFile, SandboxSpec
from sandcell.runtime.cgroups import CONTROLLERS, children
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.outputs import collect_outputs
from tests.integration.conftest import (
    GUEST_ENV,
    IMAGE_DIR,
    RecordingSink,
    RunCode,
    assert_released,
    host_processes_mentioning,
)

pytestmark = pytest.mark.gvisor


# --- lifecycle and reasons ------------------------------------------------------------------


def test_print_reaches_the_sink_after_ready(run_code: RunCode) -> None:
    ran = run_code("print('hello from gvisor')")
    assert ran.result.reason is None and ran.result.exit_code == 0
    assert ran.result.released
    assert ran.sink.events[0] == ("ready", b"")
    assert ran.sink.stdout == "hello from gvisor\n"  # the ready line is stripped
    assert ran.sink.stderr == ""
    usage = ran.result.usage
    assert usage["output_bytes"] == len("hello from gvisor\n")
    assert usage["max_memory_bytes"] > 0 and usage["cpu_s"] > 0 and usage["wall_s"] > 0


def test_nonzero_exit_is_exit_code(run_code: RunCode) -> None:
    ran = run_code("import sys; print('bye', file=sys.stderr); sys.exit(3)")
    assert (ran.result.reason, ran.result.exit_code) == (Reason.EXIT_CODE, 3)
    assert ran.sink.events[0] == ("ready", b"")  # first, even when stderr speaks first
    assert ran.sink.stderr == "bye\n" and ran.sink.stdout == ""


def test_wall_clock_limit_is_timeout(run_code: RunCode) -> None:
    ran = run_code("import time; print('sleeping'); time.sleep(60)", timeout_s=1)
    assert ran.result.reason is Reason.TIMEOUT and ran.result.exit_code is None
    assert ran.sink.stdout == "sleeping\n"
    assert ran.result.usage["wall_s"] < 6


def test_allocating_far_beyond_memory_mb_is_memory(run_code: RunCode) -> None:
    ran = run_code("x = bytearray(512 * 2**20); print('survived')", memory_mb=64)
    assert ran.result.reason is Reason.MEMORY
    assert "survived" not in ran.sink.stdout


def test_memory_within_the_budget_is_usable(run_code: RunCode) -> None:
    ran = run_code("x = bytearray(100 * 2**20); print(len(x))", memory_mb=160)
    assert ran.result.reason is None and ran.sink.stdout == f"{100 * 2**20}\n"


FORK_BOMBS = {
    "dies-on-eagain": "import os\nwhile True: os.fork()",
    "retries-forever": "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
}


@pytest.mark.parametrize("bomb", FORK_BOMBS.values(), ids=FORK_BOMBS.keys())
def test_fork_bomb_is_pids(run_code: RunCode, bomb: str) -> None:
    ran = run_code(bomb, pids=16, timeout_s=20)
    assert ran.result.reason is Reason.PIDS, ran.result
    assert ran.result.usage["wall_s"] < 10


def test_processes_up_to_the_pids_budget_are_fine(run_code: RunCode) -> None:
    code = """
import os, time
kids = []
for _ in range(15):  # 15 children + this process = the budget of 16
    pid = os.fork()
    if pid == 0:
        time.sleep(0.3)
        os._exit(0)
    kids.append(pid)
print(sum(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids))
"""
    ran = run_code(code, pids=16)
    assert ran.result.reason is None and ran.sink.stdout == "0\n"


@pytest.mark.parametrize(
    "filler",
    [
        "with open('/workspace/big', 'wb') as f:\n    while True: f.write(b'x' * 2**20)",
        "i = 0\nwhile True:\n    open(f'/output/f{i}', 'w').close(); i += 1",  # inodes
    ],
    ids=["blocks", "inodes"],
)
def test_filling_the_scratch_disk_is_disk(run_code: RunCode, filler: str) -> None:
    ran = run_code(filler, disk_mb=8)
    assert ran.result.reason is Reason.DISK and ran.result.exit_code == 1
    assert "No space left on device" in ran.sink.stderr


def test_output_over_budget_is_cut_marked_and_output_limit(run_code: RunCode) -> None:
    cap = int(0.01 * 1024 * 1024)
    ran = run_code("import sys\nwhile True: sys.stdout.write('y' * 1000)", output_mb=0.01)
    assert ran.result.reason is Reason.OUTPUT_LIMIT
    marker = f"\n[sandcell: output truncated at {cap} bytes]\n"
    out = ran.sink.stdout
    assert out.endswith(marker) and out.count("[sandcell:") == 1
    assert len(out) - len(marker) == cap == ran.result.usage["output_bytes"]


def test_stdout_and_stderr_share_the_output_budget(run_code: RunCode) -> None:
    code = "import sys\nfor _ in range(50): print('o' * 500); print('e' * 500, file=sys.stderr)"
    ran = run_code(code, output_mb=0.02)
    assert ran.result.reason is Reason.OUTPUT_LIMIT
    delivered = b"".join(d for s, d in ran.sink.events if s != "ready")
    assert len(delivered) - len(b"\n[sandcell: output truncated at 20971 bytes]\n") == 20971


STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # double fork: reparented, own session, ignores SIGTERM
        print("grandchild", os.getpid(), flush=True)
        while True:
            time.sleep(1)
    os._exit(0)
print("parent", flush=True)
while True:
    time.sleep(1)
"""


def test_cancel_kills_a_stubborn_double_forked_program(run_code: RunCode) -> None:
    cancel, sink = threading.Event(), RecordingSink()
    seen_on_host: list[str] = []

    def cancel_once_both_run() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if "grandchild" in sink.stdout and "parent" in sink.stdout:
                seen_on_host.extend(host_processes_mentioning("t-test_cancel"))
                break
            time.sleep(0.05)
        cancel.set()

    watcher = threading.Thread(target=cancel_once_both_run)
    watcher.start()
    ran = run_code(STUBBORN, cancel=cancel, sink=sink, timeout_s=30)
    watcher.join()
    assert seen_on_host, "the sandbox's runsc processes were never seen on the host"
    assert ran.result.reason is Reason.CANCELLED and ran.result.released
    assert ran.result.usage["wall_s"] < 15
    assert not host_processes_mentioning(ran.spec.sandbox_id)  # and run_code checked the rest


@pytest.mark.parametrize(("signal_name", "code"), [("SIGKILL", 137), ("SIGSEGV", 139)])
def test_death_by_signal_is_exit_code_128_plus_n(
    run_code: RunCode, signal_name: str, code: int
) -> None:
    ran = run_code(f"import os, signal; os.kill(os.getpid(), signal.{signal_name})")
    assert (ran.result.reason, ran.result.exit_code) == (Reason.EXIT_CODE, code)


def test_cpu_quota_throttles_the_program_but_not_the_boot(run_code: RunCode) -> None:
    # gVisor's own start and exit, at this host's speed (0.2-0.75 CPU-s seen on two-core VMs).
    idle = run_code("pass", cpu=0.2)
    busy = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.5: pass"
    ran = run_code(busy, cpu=0.2)
    assert ran.result.reason is None
    assert ran.result.usage["start_s"] < 1.5  # boot ran at a full core
    # 1.5 s of busy loop at 0.2 cores is 0.3 CPU-s; unthrottled it would be 1.5.
    assert ran.result.usage["cpu_s"] - idle.result.usage["cpu_s"] < 0.8


def test_every_host_process_of_the_sandbox_is_in_its_cgroup_in_every_controller(
    run_code: RunCode, gvisor: GVisorRuntime
) -> None:
    """runsc is started behind the launch helper's cgroup joins: while the program runs, each
    host process of the sandbox (the runsc CLI, gofer, sentry) is in all four controllers."""
    seen: dict[str, set[int]] = {}
    runsc: dict[int, str] = {}  # host processes naming the sandbox: pid -> executable
    ready = threading.Event()

    class Watching(RecordingSink):
        def ready(self) -> None:
            super().ready()
            ready.set()

    def look() -> None:
        if not ready.wait(60):
            return
        [sandbox_id] = children(gvisor.cgroup_parent)  # the one sandbox running
        for controller in CONTROLLERS:
            procs = Path("/sys/fs/cgroup", controller, gvisor.cgroup_parent, sandbox_id)
            seen[controller] = {int(p) for p in (procs / "cgroup.procs").read_text().split()}
        for line in host_processes_mentioning(sandbox_id):
            pid = int(line.split(":")[0])
            runsc[pid] = os.readlink(f"/proc/{pid}/exe")

    looker = threading.Thread(target=look)
    looker.start()
    ran = run_code("import time; time.sleep(2)", sink=Watching())
    looker.join()
    assert ran.result.reason is None, ran.result
    assert set(seen) == set(CONTROLLERS)
    pids = seen["pids"]
    assert all(found == pids for found in seen.values())  # the same processes in each
    assert runsc and set(runsc) <= pids  # the CLI, gofer, sentry, all inside
    assert all(exe.endswith("runsc") for exe in runsc.values()), runsc  # the helper exec'd


def test_a_runsc_failure_is_runtime_error_and_released(
    gvisor: GVisorRuntime, python_image: Image
) -> None:
    broken = replace(python_image, rootfs=Path("/nonexistent-rootfs"))
    spec = SandboxSpec("t-broken-image", broken, ["/bin/true"], GUEST_ENV, Limits())
    result = gvisor.run(spec, RecordingSink(), threading.Event())
    assert result.reason is Reason.RUNTIME_ERROR and result.released
    assert "runsc failed to start" in result.detail
    assert_released(gvisor, spec.sandbox_id)


# --- what the guest is and is not allowed -----------------------------------------------------


def test_guest_is_nobody_without_capabilities_and_with_no_new_privs(run_code: RunCode) -> None:
    code = """
import ctypes
print(open('/proc/self/status').read())
libc = ctypes.CDLL(None, use_errno=True)
print('NoNewPrivs:', libc.prctl(39, 0, 0, 0, 0))  # PR_GET_NO_NEW_PRIVS; gVisor's status lacks it
print('Groups:', *__import__('os').getgroups())
"""
    ran = run_code(code)
    status = dict(line.split(":", 1) for line in ran.sink.stdout.splitlines() if ":" in line)
    assert status["Uid"].split() == ["65534"] * 4 and status["Gid"].split() == ["65534"] * 4
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd"):  # gVisor shows no CapAmb
        assert int(status[cap], 16) == 0, cap
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Groups"].split() in ([], ["65534"])


def test_root_filesystem_is_read_only(run_code: RunCode) -> None:
    code = """
import errno, os
try:
    open('/var/tmp/x', 'w')  # world-writable in the image: only read-only stops it
    print('wrote')
except OSError as e:
    print(errno.errorcode[e.errno])
mounts = {line.split()[1]: line.split()[3].split(',') for line in open('/proc/self/mounts')}
print('ro' in mounts['/'])
open('/tmp/scratch', 'w').write('tmp is writable')
print(open('/tmp/scratch').read())
"""
    ran = run_code(code)
    assert ran.sink.stdout.splitlines() == ["EROFS", "True", "tmp is writable"]


def test_inputs_are_readable_and_read_only(run_code: RunCode, tmp_path: Path) -> None:
    host_file = tmp_path / "in.csv"
    host_file.write_text("a,b\n1,2\n")
    code = """
import os, stat
path = '/input/data/in.csv'
print(open(path).read(), end='')
st = os.stat(path)
print(oct(stat.S_IMODE(st.st_mode)), st.st_uid)
mounts = {line.split()[1]: line.split()[3].split(',') for line in open('/proc/self/mounts')}
print('ro' in mounts['/input'])
for attempt in (lambda: open(path, 'a'), lambda: open('/input/new', 'w')):
    try:
        attempt()
        print('writable')
    except OSError as e:
        print(type(e).__name__)
"""
    ran = run_code(code, inputs=[InputFile(host_file, "data/in.csv")])
    lines = ran.sink.stdout.splitlines()
    assert lines[:4] == ["a,b", "1,2", "0o644 0", "True"]
    assert "writable" not in lines[4:] and len(lines) == 6


def fs_type(path: Path) -> str:
    found = subprocess.run(["findmnt", "-no", "FSTYPE", "-T", str(path)], capture_output=True)
    return found.stdout.decode().strip()


@dataclass
class FilesystemsAtReady(RecordingSink):
    """The filesystem each of `paths` is on, while the sandbox runs (at its ready line)."""

    paths: dict[str, Path] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def ready(self) -> None:
        self.types = {name: fs_type(path) for name, path in self.paths.items()}
        super().ready()


def test_a_sandboxs_small_files_are_on_a_tmpfs_its_disk_and_inputs_on_the_state_dirs(
    gvisor: GVisorRuntime, python_image: Image, tmp_path: Path
) -> None:
    host_file = tmp_path / "in.csv"
    host_file.write_text("x\n")
    sandbox_id = "t-where-files-live"
    scratch, spill = gvisor.sandboxes_dir / sandbox_id, gvisor.disks_dir / sandbox_id
    sink = FilesystemsAtReady(
        paths={
            "scratch": scratch,
            "runsc state": gvisor.runsc.root,
            "disk image": spill / "disk.img",
            "inputs": spill / "input",
            "workspace": scratch / "disk" / "workspace",
        }
    )
    code = b"print(open('/input/in.csv').read(), end='')"
    argv = [python_image.python, "/job/main.py"]
    spec = SandboxSpec(sandbox_id, python_image, argv, GUEST_ENV, Limits(), code=code)
    spec = replace(spec, inputs=[InputFile(host_file, "in.csv")])
    result = gvisor.run(spec, sink, threading.Event())
    assert (result.exit_code, sink.stdout) == (0, "x\n")
    on_disk = fs_type(gvisor.state_dir)
    assert sink.types == {
        "scratch": "tmpfs",
        "runsc state": "tmpfs",
        "disk image": on_disk,
        "inputs": on_disk,
        "workspace": "ext4",  # the sandbox's own size-limited disk
    }
    assert_released(gvisor, sandbox_id)


def test_workspace_runs_scripts_and_output_does_not(run_code: RunCode) -> None:
    code = """
import os, subprocess
print(os.getcwd())
for d in ('/workspace', '/output'):
    path = f'{d}/tool.sh'
    with open(path, 'w') as f:
        f.write('#!/bin/sh\\necho ran\\n')
    os.chmod(path, 0o755)
    try:
        print(subprocess.run([path], capture_output=True, text=True).stdout.strip())
    except PermissionError:
        print('noexec')
    os.unlink(path)
"""
    ran = run_code(code)
    assert ran.sink.stdout.splitlines() == ["/workspace", "ran", "noexec"]


def test_host_files_are_not_visible(run_code: RunCode) -> None:
    token = secrets.token_hex(8)
    canaries = [Path(f"/root/sandcell-canary-{token}"), Path(f"/tmp/sandcell-canary-{token}")]
    try:
        for canary in canaries:
            canary.write_text(token)
        code = f"""
import os
paths = {[str(c) for c in canaries]!r}
print([os.path.exists(p) for p in paths])
print(any({token!r} in name for d in ('/tmp', '/', '/workspace') for name in os.listdir(d)))
"""
        ran = run_code(code)
    finally:
        for canary in canaries:
            canary.unlink()
    assert ran.sink.stdout.splitlines() == ["[False, False]", "False"]


def test_host_processes_are_not_visible(run_code: RunCode) -> None:
    code = """
import json, os
procs = {}
for pid in filter(str.isdigit, os.listdir('/proc')):
    procs[pid] = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')[0].decode()
print(json.dumps(procs))
"""
    ran = run_code(code)
    procs = json.loads(ran.sink.stdout)
    assert procs == {"1": "/usr/bin/python3.11"}  # the program is pid 1 and alone


@pytest.fixture
def host_loopback_server() -> Iterator[tuple[int, list[object]]]:
    """A TCP server on the HOST's 127.0.0.1 that records every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def test_no_network_no_host_loopback_no_dns(
    run_code: RunCode, host_loopback_server: tuple[int, list[object]]
) -> None:
    port, accepted = host_loopback_server
    code = f"""
import socket
lines = open('/proc/net/dev').read().splitlines()[2:]
print(sorted(line.split(':')[0].strip() for line in lines))
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2)
    print('connected')
except OSError as e:
    print('refused', type(e).__name__)
try:
    socket.getaddrinfo('localhost-test.invalid', 80)
    print('resolved')
except OSError:
    print('no dns')
print(repr(open('/etc/resolv.conf').read()))
"""
    ran = run_code(code)
    lines = ran.sink.stdout.splitlines()
    assert lines[0] == "['lo']"
    assert lines[1].startswith("refused")
    assert lines[2:] == ["no dns", "''"]
    assert accepted == []


def test_io_uring_is_denied(run_code: RunCode) -> None:
    code = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
print(libc.syscall(425, 8, params), ctypes.get_errno())  # io_uring_setup(8, &params)
"""
    ran = run_code(code)
    result, errno_value = map(int, ran.sink.stdout.split())
    assert result == -1 and errno_value != 0


def test_environment_is_exactly_the_specs(run_code: RunCode) -> None:
    env = {"PATH": "/usr/bin:/bin", "SANDCELL_JOB_ID": "job_x", "WEIRD": "a b=c"}
    os.environ["SANDCELL_HOST_ONLY_SECRET"] = "must-not-leak"
    try:
        # /proc/self/environ: what the program was started with (Python may coerce the locale).
        code = "print(open('/proc/self/environ', 'rb').read().decode())"
        ran = run_code(code, env=env)
    finally:
        del os.environ["SANDCELL_HOST_ONLY_SECRET"]
    started_with = dict(v.split("=", 1) for v in ran.sink.stdout.rstrip("\n").split("\0") if v)
    assert started_with == env


def test_output_files_are_reported_but_never_symlinks_or_fifos(run_code: RunCode) -> None:
    code = """
import os
os.makedirs('/output/sub/deeper')
open('/output/a.txt', 'w').write('hello')
open('/output/sub/deeper/b.bin', 'wb').write(bytes(range(256)) * 100)
os.symlink('/etc/passwd', '/output/passwd-link')
os.symlink('/etc', '/output/etc-link')
os.mkfifo('/output/fifo')
open('/workspace/not-an-output.txt', 'w').write('scratch')
"""
    ran = run_code(code)
    assert ran.result.reason is None
    assert ran.sink.files == {"a.txt": b"hello", "sub/deeper/b.bin": bytes(range(256)) * 100}
    assert ran.sink.sizes == {"a.txt": 5, "sub/deeper/b.bin": 25600}
    # gVisor keeps a FIFO made on a bind mount inside the sentry, so the host may not even
    # see it; the symlinks are on the host and are skipped (see also the host-side test).
    assert ran.result.usage["output_files"] == 2 and ran.result.usage["skipped_outputs"] >= 1


def test_output_walk_on_the_host_skips_links_fifos_and_sockets(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ok.txt").write_bytes(b"ok")
    (tmp_path / "passwd").symlink_to("/etc/passwd")
    (tmp_path / "etc").symlink_to("/etc")
    os.mkfifo(tmp_path / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        sink = RecordingSink()
        collected = collect_outputs(tmp_path, sink)
    assert sink.files == {"sub/ok.txt": b"ok"}
    assert (collected.files, collected.skipped) == (1, 3)


def test_outputs_are_collected_after_a_failure_too(run_code: RunCode) -> None:
    ran = run_code("open('/output/partial.txt', 'w').write('so far'); raise SystemExit(2)")
    assert ran.result.reason is Reason.EXIT_CODE and ran.sink.files == {"partial.txt": b"so far"}


CRASHING_WORKER = """
import sys, threading
from pathlib import Path
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import SandboxSpec
from sandcell.runtime.cgroups import CONTROLLERS
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.images import FilesystemImageCatalog
from tests.integration.conftest import RecordingSink

state_dir, sandbox_id, image_dir = sys.argv[1:]
image = FilesystemImageCatalog(Path(image_dir)).get("python")
argv = [image.python, "-c", "import time; time.sleep(120)"]
spec = SandboxSpec(sandbox_id, image, argv, {}, Limits(timeout_s=120))
GVisorRuntime(Path(state_dir)).run(spec, RecordingSink(), threading.Event())
"""


def test_reap_removes_everything_a_crashed_worker_left(
    gvisor: GVisorRuntime, python_image: Image, tmp_path: Path
) -> None:
    state_dir, sandbox_id = tmp_path / "crashed-state", "t-crashed-worker"
    worker = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WORKER, str(state_dir), sandbox_id, str(IMAGE_DIR)],
        cwd=Path(__file__).parents[2],
    )
    runtime = GVisorRuntime(state_dir)
    try:
        deadline = time.monotonic() + 20
        while not runtime.runsc.has_state(sandbox_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # let the sandbox boot fully
    finally:
        worker.kill()  # the worker dies; runsc, its cgroup, mount and loop device stay
        worker.wait()
    assert host_processes_mentioning(sandbox_id), "the sandbox should outlive its worker"
    removed = runtime.reap()
    for expected in (
        f"runsc container {sandbox_id}",
        f"cgroup {runtime.cgroup_parent}/{sandbox_id}",
        f"mount {runtime.sandboxes_dir / sandbox_id / 'disk'}",
        f"scratch {sandbox_id}",
        f"disk {sandbox_id}",
    ):
        assert expected in removed
    assert any(item.startswith("loop device /dev/loop") for item in removed)
    assert_released(runtime, sandbox_id)
    assert runtime.reap() == []
    runtime.close()  # its parent cgroup and its directory under /run/sandcell


def test_close_removes_the_parent_cgroup_once_nothing_is_under_it(
    python_image: Image, tmp_path: Path
) -> None:
    """Each state dir has its own parent cgroup; without close, every scratch data dir (a test,
    a bench) left one on the host for good."""
    runtime = GVisorRuntime(tmp_path / "state")
    runtime.check()
    spec = SandboxSpec("t-closing", python_image, ["/bin/true"], GUEST_ENV, Limits())
    assert runtime.run(spec, RecordingSink(), threading.Event()).exit_code == 0
    parents = [Path("/sys/fs/cgroup", c, runtime.cgroup_parent) for c in CONTROLLERS]
    assert all(parent.is_dir() for parent in parents) and runtime.run_dir.is_dir()
    still_running = [parent / "t-still-running" for parent in parents]
    for cgroup in still_running:
        cgroup.mkdir()
    try:
        runtime.close()  # a cgroup under it: the parent stays, the child is untouched
        assert all(cgroup.is_dir() for cgroup in still_running)
    finally:
        for cgroup in still_running:
            cgroup.rmdir()
    runtime.close()
    assert not any(parent.exists() for parent in parents)
    assert not runtime.run_dir.exists()  # nor is its volatile directory left on the tmpfs


def test_check_fails_closed_without_runsc(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable, match="runsc not found"):
        GVisorRuntime(tmp_path, runsc="/nonexistent/runsc").check()


def test_a_failed_check_leaves_nothing_behind(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the check makes cgroups and a loop disk")
    refused = GVisorRuntime(tmp_path, runsc="/bin/false")  # found, but answers nothing
    with pytest.raises(RuntimeUnavailable):
        refused.check()
    assert not refused.run_dir.exists()  # nothing of it is left on the tmpfs
    parents = [Path("/sys/fs/cgroup", c, refused.cgroup_parent) for c in CONTROLLERS]
    assert not any(parent.exists() for parent in parents)


def test_kvm_platform_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        GVisorRuntime(tmp_path, platform="kvm")


def test_version_names_runsc(gvisor: GVisorRuntime) -> None:
    assert re.fullmatch(r"runsc \S+", gvisor.version())


def test_a_second_run_of_a_live_id_is_refused_and_leaves_the_first_alone(
    gvisor: GVisorRuntime, python_image: Image
) -> None:
    argv = [python_image.python, "-c", "import time; time.sleep(1); print('first')"]
    spec = SandboxSpec("t-same-id", python_image, argv, GUEST_ENV, Limits())
    first_sink = RecordingSink()
    first = threading.Thread(target=gvisor.run, args=(spec, first_sink, threading.Event()))
    first.start()
    while first_sink.ready_at is None and first.is_alive():
        time.sleep(0.02)
    second = gvisor.run(spec, RecordingSink(), threading.Event())
    first.join()
    assert second.reason is Reason.RUNTIME_ERROR and "already in use" in second.detail
    assert first_sink.stdout == "first\n"
    assert_released(gvisor, spec.sandbox_id)


def test_a_hostile_sandbox_id_is_refused_before_touching_the_host(
    gvisor: GVisorRuntime, python_image: Image
) -> None:
    spec = SandboxSpec("../../etc", python_image, ["/bin/true"], GUEST_ENV, Limits())
    result = gvisor.run(spec, RecordingSink(), threading.Event())
    assert result.reason is Reason.RUNTIME_ERROR and result.released
    assert result.detail == "invalid sandbox id"
