"""The bwrap runtime's lifecycle and reasons against real bwrap and the real `python` image.

What it must not let a program reach is in test_isolation.py (shared with gVisor); this file is
about how runs end, what they report, and failing closed.
"""

import contextlib
import os
import re
import signal
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
from sandcell.ports.egress import EgressAttachment
from sandcell.ports.runtime import InputFile, SandboxSpec
from sandcell.runtime.bundle import NOFILE
from sandcell.runtime.bwrap import UID_BASE, BwrapRuntime, UidPool
from sandcell.runtime.cgroups import CONTROLLERS
from sandcell.runtime.reap import mounts_under
from tests.integration.conftest import GUEST_ENV, IMAGE_DIR, RecordingSink
from tests.security.conftest import (
    RunCode,
    assert_released,
    processes_in_cgroup,
    processes_of_uid,
)

pytestmark = pytest.mark.bwrap

GETFLAGS, SETFLAGS = 0x80086601, 0x40086602  # FS_IOC_GETFLAGS, FS_IOC_SETFLAGS (chattr)
# SYNC, NODUMP, NOATIME, DIRSYNC, TOPDIR: the inode flags a directory's owner may set itself
OWNER_FLAGS = 0x8 | 0x40 | 0x80 | 0x10000 | 0x20000


def test_print_reaches_the_sink_after_ready(run_bwrap: RunCode) -> None:
    ran = run_bwrap("print('hello from bwrap')")
    assert ran.result.reason is None and ran.result.exit_code == 0
    assert ran.sink.events[0] == ("ready", b"")
    assert ran.sink.stdout == "hello from bwrap\n" and ran.sink.stderr == ""
    usage = ran.result.usage
    assert usage["output_bytes"] == len("hello from bwrap\n")
    assert usage["max_memory_bytes"] > 0 and usage["cpu_s"] > 0 and usage["wall_s"] > 0


def test_nonzero_exit_is_exit_code(run_bwrap: RunCode) -> None:
    ran = run_bwrap("import sys; print('bye', file=sys.stderr); sys.exit(3)")
    assert (ran.result.reason, ran.result.exit_code) == (Reason.EXIT_CODE, 3)
    assert ran.sink.events[0] == ("ready", b"") and ran.sink.stderr == "bye\n"


@pytest.mark.parametrize(("signal_name", "code"), [("SIGKILL", 137), ("SIGSEGV", 139)])
def test_death_by_signal_is_exit_code_128_plus_n(
    run_bwrap: RunCode, signal_name: str, code: int
) -> None:
    ran = run_bwrap(f"import os, signal; os.kill(os.getpid(), signal.{signal_name})")
    assert (ran.result.reason, ran.result.exit_code) == (Reason.EXIT_CODE, code)


def test_wall_clock_limit_is_timeout(run_bwrap: RunCode) -> None:
    ran = run_bwrap("import time; print('sleeping', flush=True); time.sleep(60)", timeout_s=0.5)
    assert ran.result.reason is Reason.TIMEOUT and ran.result.exit_code is None
    assert ran.sink.stdout == "sleeping\n" and ran.result.usage["wall_s"] < 3


def test_output_over_budget_is_cut_marked_and_output_limit(run_bwrap: RunCode) -> None:
    cap = int(0.01 * 1024 * 1024)
    ran = run_bwrap("import sys\nwhile True: sys.stdout.write('y' * 1000)", output_mb=0.01)
    assert ran.result.reason is Reason.OUTPUT_LIMIT
    marker = f"\n[sandcell: output truncated at {cap} bytes]\n"
    assert ran.sink.stdout.endswith(marker) and len(ran.sink.stdout) - len(marker) == cap


def test_processes_up_to_the_pids_budget_are_fine(run_bwrap: RunCode) -> None:
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
    ran = run_bwrap(code, pids=16)
    assert ran.result.reason is None and ran.sink.stdout == "0\n"


def test_rlimits_are_set_soft_and_hard_and_cannot_be_raised(run_bwrap: RunCode) -> None:
    code = """
import resource as r
kinds = (r.RLIMIT_NOFILE, r.RLIMIT_CORE, r.RLIMIT_FSIZE, r.RLIMIT_NPROC)
print([r.getrlimit(kind) for kind in kinds])
try:
    r.setrlimit(r.RLIMIT_NOFILE, (4096, 4096))
except (ValueError, OSError) as exc:
    print(type(exc).__name__)
"""
    ran = run_bwrap(code, pids=16, disk_mb=8)
    limits, raised = ran.sink.stdout.splitlines()
    fsize, nproc = 8 * 1024 * 1024, 16 + 2 + 1  # the disk; pids + bwrap's two + the tripwire
    assert limits == repr([(NOFILE, NOFILE), (0, 0), (fsize, fsize), (nproc, nproc)])
    assert raised == "ValueError"  # "not allowed to raise maximum limit"


def test_inode_flood_is_disk(run_bwrap: RunCode) -> None:
    ran = run_bwrap("i = 0\nwhile True:\n    open(f'/output/f{i}', 'w').close(); i += 1", disk_mb=4)
    assert ran.result.reason is Reason.DISK and ran.result.exit_code == 1


@pytest.mark.parametrize("pwd", [True, False], ids=["as-is", "wrapped"])
def test_environment_is_exactly_the_specs(run_bwrap: RunCode, pwd: bool) -> None:
    # With PWD (as jobs have it) the program runs as it is; without, the wrapper must take
    # out the PWD that bwrap sets.
    env = GUEST_ENV if pwd else {k: v for k, v in GUEST_ENV.items() if k != "PWD"}
    os.environ["SANDCELL_HOST_ONLY_SECRET"] = "must-not-leak"
    try:
        ran = run_bwrap("print(open('/proc/self/environ', 'rb').read().decode())", env=env)
    finally:
        del os.environ["SANDCELL_HOST_ONLY_SECRET"]
    started_with = dict(v.split("=", 1) for v in ran.sink.stdout.rstrip("\n").split("\0") if v)
    assert started_with == env


def test_no_file_descriptor_or_host_path_leaks_in(run_bwrap: RunCode) -> None:
    code = """
import os
print(sorted(os.listdir('/proc/self/fd')))
print(open('/proc/1/cmdline', 'rb').read().replace(b'\\0', b' ').decode())
"""
    fds, pid1 = run_bwrap(code).sink.stdout.splitlines()
    assert fds == "['0', '1', '2', '3']"  # stdio and the listing itself: no memfd, no pipe
    assert "/var/" not in pid1 and "sandboxes" not in pid1 and pid1.startswith("bwrap --args")


def test_outputs_are_collected_but_never_symlinks(run_bwrap: RunCode) -> None:
    code = """
import os
os.makedirs('/output/sub')
open('/output/sub/a.txt', 'w').write('hello')
os.symlink('/etc/passwd', '/output/passwd-link')
os.mkfifo('/output/fifo')
"""
    ran = run_bwrap(code)
    assert ran.sink.files == {"sub/a.txt": b"hello"}
    assert ran.result.usage["skipped_outputs"] == 2


def test_cpu_quota_applies(run_bwrap: RunCode) -> None:
    busy = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1: pass"
    ran = run_bwrap(busy, cpu=0.2)
    assert ran.result.reason is None and ran.result.usage["cpu_s"] < 0.5


@pytest.mark.parametrize("own_code", [False, True], ids=["wrapped", "as-is"])
def test_a_broken_image_is_runtime_error_and_released(
    bwrap: BwrapRuntime, python_image: Image, own_code: bool
) -> None:
    # As it is (a job's own code), no ready line tells a sandbox that never started: bwrap's
    # status does, by the exit code it reports only for a program it ran.
    broken = replace(python_image, rootfs=Path("/nonexistent-rootfs"))
    argv = [broken.python, "/job/main.py"] if own_code else ["/bin/true"]
    spec = SandboxSpec("b-broken-image", broken, argv, GUEST_ENV, Limits(), code=b"print(1)")
    result = bwrap.run(spec, RecordingSink(), threading.Event())
    assert result.reason is Reason.RUNTIME_ERROR and result.released
    assert "bwrap failed to start" in result.detail and "nonexistent-rootfs" in result.detail
    assert_released(bwrap, spec.sandbox_id)


@contextlib.contextmanager
def unix_echo(path: Path) -> Iterator[list[bytes]]:
    """A host unix socket at `path` (0666, like the proxy's) answering b"pong:" + what it got."""
    received: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        path.chmod(0o666)
        listener.listen(4)
        listener.settimeout(0.1)
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    received.append(_read_to_eof(conn))
                    conn.sendall(b"pong:" + received[-1])

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield received
        finally:
            stop.set()
            thread.join(5)


def _read_to_eof(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass
class HostMountsAtReady(RecordingSink):
    """Records the host's mounts below `prefix` while the sandbox runs (at its ready line)."""

    prefix: str = "/"
    mounts: list[str] = field(default_factory=list)

    def ready(self) -> None:
        self.mounts = mounts_under(self.prefix)
        super().ready()


def test_egress_comes_through_the_bridge_and_is_never_mounted_on_the_host(
    bwrap: BwrapRuntime, run_bwrap: RunCode, tmp_path: Path
) -> None:
    # As with the real proxy: the socket's directory sits in a 0700 directory (so is tmp_path
    # itself), which the sandbox's host uid cannot walk through.
    private = tmp_path / "egress"
    socket_dir = private / "sock"
    socket_dir.mkdir(parents=True)
    private.chmod(0o700)
    socket_dir.chmod(0o711)
    ca_bundle = private / "ca-bundle.pem"
    ca_bundle.write_bytes(b"job CA\n")
    ca_bundle.chmod(0o644)
    code = """
import os, socket
with socket.create_connection(("127.0.0.1", 3128), timeout=5) as s:
    s.sendall(b"ping")
    s.shutdown(socket.SHUT_WR)
    print(b"".join(iter(lambda: s.recv(100), b"")).decode())
print(open("/etc/sandcell/ca-bundle.pem").read().strip())
try:
    os.listdir("/run/sandcell/egress")
except PermissionError:
    print("not listable")
print(sorted(os.listdir("/proc/self/fd")))
"""
    sink = HostMountsAtReady(prefix=f"{bwrap.sandboxes_dir}/")
    with unix_echo(socket_dir / "proxy.sock") as received:
        ran = run_bwrap(code, egress=EgressAttachment(socket_dir, ca_bundle), sink=sink)
    assert ran.result.reason is None, (ran.result, ran.sink.stderr)
    assert ran.sink.stdout.splitlines() == [
        "pong:ping",
        "job CA",
        "not listable",
        "['0', '1', '2', '3']",
    ]
    assert received == [b"ping"]  # and no memfd (the CA bundle's) was left open in there
    # While it ran, the host saw the scratch disk mounted and nothing else: the socket directory
    # was bound in the launch chain's own mount namespace, which ended with the sandbox.
    disks = [Path(m) for m in sink.mounts]  # the job's, and those kept for others (disk_shelf)
    assert disks and all(d.name == "disk" and d.parent.name.startswith(".disk-") for d in disks)
    assert not mounts_under(str(private))


def test_an_egress_socket_directory_that_cannot_be_bound_is_runtime_error(
    bwrap: BwrapRuntime, python_image: Image, tmp_path: Path
) -> None:
    ca_bundle = tmp_path / "ca.pem"
    ca_bundle.write_bytes(b"")
    egress = EgressAttachment(socket_dir=tmp_path / "missing", ca_bundle=ca_bundle)
    spec = SandboxSpec("b-no-socket-dir", python_image, ["/bin/true"], GUEST_ENV, Limits())
    result = bwrap.run(replace(spec, egress=egress), RecordingSink(), threading.Event())
    assert result.reason is Reason.RUNTIME_ERROR and result.released, result
    assert "bwrap failed to start the sandbox (exit 125)" in result.detail
    assert str(tmp_path / "missing") in result.detail  # mount(8) names what it could not bind
    assert_released(bwrap, spec.sandbox_id)


@pytest.mark.parametrize("sandbox_id", ["../../etc", "", "a/b", "-flag"])
def test_a_hostile_sandbox_id_is_refused(
    bwrap: BwrapRuntime, python_image: Image, sandbox_id: str
) -> None:
    spec = SandboxSpec(sandbox_id, python_image, ["/bin/true"], GUEST_ENV, Limits())
    result = bwrap.run(spec, RecordingSink(), threading.Event())
    assert result.reason is Reason.RUNTIME_ERROR and result.detail == "invalid sandbox id"


def test_version_names_bubblewrap(bwrap: BwrapRuntime) -> None:
    assert re.fullmatch(r"bubblewrap \d+\.\d+\.\d+", bwrap.version())


def test_check_fails_closed_without_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match="not on PATH: bwrap"):
        BwrapRuntime(tmp_path).check()


def test_check_fails_closed_on_a_state_dir_bwrap_cannot_reach(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    tmp_path.chmod(0o700)
    refused = BwrapRuntime(tmp_path / "state")
    with pytest.raises(RuntimeUnavailable, match="not traversable"):
        refused.check()
    assert not refused.run_dir.exists()  # nothing of it is left on the tmpfs
    parents = [Path("/sys/fs/cgroup", c, refused.cgroup_parent) for c in CONTROLLERS]
    assert not any(parent.exists() for parent in parents)


def test_check_fails_closed_without_libseccomp(
    bwrap: BwrapRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # `import pyseccomp` now fails
    with pytest.raises(RuntimeUnavailable, match="seccomp"):
        BwrapRuntime(bwrap.state_dir).check()


CRASHING_WORKER = """
import sys, threading
from pathlib import Path
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import InputFile, SandboxSpec
from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.images import FilesystemImageCatalog
from tests.integration.conftest import RecordingSink

state_dir, sandbox_id, image_dir = sys.argv[1:]
image = FilesystemImageCatalog(Path(image_dir)).get("python")
argv = [image.python, "-c", "import os, time; os.fork(); time.sleep(120)"]
spec = SandboxSpec(sandbox_id, image, argv, {}, Limits(timeout_s=120))
BwrapRuntime(Path(state_dir)).run(spec, RecordingSink(), threading.Event())
"""


def test_reap_removes_everything_a_killed_worker_left(bwrap: BwrapRuntime) -> None:
    state_dir, sandbox_id = bwrap.state_dir / "crashed", "b-crashed-worker"
    worker = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WORKER, str(state_dir), sandbox_id, str(IMAGE_DIR)],
        cwd=Path(__file__).parents[2],
    )
    runtime = BwrapRuntime(state_dir)
    relpath = f"{runtime.cgroup_parent}/{sandbox_id}"
    try:
        deadline = time.monotonic() + 20
        while len(processes_in_cgroup(relpath)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGKILL)  # --die-with-parent takes the sandbox down with it
        worker.wait()
    removed = runtime.reap()
    assert f"cgroup {relpath}" in removed and f"scratch {sandbox_id}" in removed
    assert any(item.startswith(f"mount {runtime.sandboxes_dir}/.disk-") for item in removed)
    assert not mounts_under(f"{runtime.state_dir}/") + mounts_under(f"{runtime.sandboxes_dir}/")
    assert_released(runtime, sandbox_id)
    assert not processes_of_uid(runtime.uids.first)
    assert runtime.reap() == []
    runtime.close()  # its parent cgroup and its directory under /run/sandcell


def test_a_uid_a_process_still_runs_as_is_never_handed_out_again() -> None:
    """The /proc scan behind UidPool, against a real process of the uid: as if one had got out
    of its sandbox's cgroup, or an earlier worker had left it."""
    first = UID_BASE - 16  # below every runtime's range: nothing else runs as these
    pool = UidPool(first, 3)
    escaped, clean = pool.take(), pool.take()
    as_uid = ("setpriv", f"--reuid={escaped}", f"--regid={escaped}", "--clear-groups")
    proc = subprocess.Popen([*as_uid, "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while processes_of_uid(escaped) != [proc.pid] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert processes_of_uid(escaped) == [proc.pid]
        pool.give_back(escaped)
        pool.give_back(clean)
        pool.verify()
        assert pool.quarantined == {escaped}
        assert [pool.take(), pool.take()] == [first + 2, clean]
        assert UidPool(first, 3).take() == first + 1  # a new worker's pool skips it too
    finally:
        proc.kill()
        proc.wait()


def test_close_removes_the_parent_cgroup(bwrap: BwrapRuntime, python_image: Image) -> None:
    runtime = BwrapRuntime(bwrap.state_dir / "closing")
    runtime.check()
    spec = SandboxSpec("b-closing", python_image, ["/bin/true"], GUEST_ENV, Limits())
    assert runtime.run(spec, RecordingSink(), threading.Event()).exit_code == 0
    parents = [Path("/sys/fs/cgroup", c, runtime.cgroup_parent) for c in CONTROLLERS]
    assert all(parent.is_dir() for parent in parents)
    runtime.close()
    assert not any(parent.exists() for parent in parents)


def test_the_next_job_on_a_kept_disk_finds_nothing_of_the_last(
    bwrap: BwrapRuntime, run_bwrap: RunCode
) -> None:
    hostile = f"""
import fcntl, os, struct
for top in ("/workspace", "/output"):
    with open(f"{{top}}/secret", "w") as f:
        f.write("job 1")
    os.makedirs(f"{{top}}/deep/er")
    os.symlink("/etc/passwd", f"{{top}}/link")
    os.setxattr(top, "user.mark", b"job 1")
    os.chmod(f"{{top}}/deep", 0)
    fd = os.open(top, os.O_RDONLY)  # chattr +SADdT: every inode flag its owner may set
    flags = struct.unpack("i", fcntl.ioctl(fd, {GETFLAGS}, bytes(4)))[0]
    fcntl.ioctl(fd, {SETFLAGS}, struct.pack("i", flags | {OWNER_FLAGS}))
    flags = struct.unpack("i", fcntl.ioctl(fd, {GETFLAGS}, bytes(4)))[0]
    print(flags & {OWNER_FLAGS} == {OWNER_FLAGS})
    os.close(fd)
    os.utime(top, (0, 0))
os.chmod("/output", 0o777)
"""
    first = run_bwrap(hostile)
    assert first.result.exit_code == 0, first.sink.stderr
    assert first.sink.stdout == "True\nTrue\n"  # the flags took
    kept = bwrap.shelf.kept()
    assert kept >= 1  # its disk was kept, emptied, for the next job
    looks = f"""
import fcntl, os, struct
for top in ("/workspace", "/output"):
    st = os.stat(top)
    mine = st.st_uid == os.getuid()
    print(top, os.listdir(top), os.listxattr(top), oct(st.st_mode & 0o777), mine)
    fd = os.open(top, os.O_RDONLY)
    flags = struct.unpack("i", fcntl.ioctl(fd, {GETFLAGS}, bytes(4)))[0]
    print(flags & {OWNER_FLAGS}, st.st_mtime > 0, st.st_atime > 0)
"""
    second = run_bwrap(looks)
    assert bwrap.shelf.kept() == kept  # it took a kept disk and gave it back
    assert second.sink.stdout.splitlines() == [
        "/workspace [] [] 0o755 True",
        "0 True True",
        "/output [] [] 0o755 True",
        "0 True True",
    ], second.sink.stderr


@dataclass
class _DisksSeenAtReady(RecordingSink):
    """What the state dir's disks held while the sandbox ran (its `ready`)."""

    disks_dir: Path = Path()
    seen: list[str] = field(default_factory=list)

    def ready(self) -> None:
        self.seen = sorted(p.name for p in self.disks_dir.iterdir() if not p.name.startswith("."))
        super().ready()


def test_a_job_without_inputs_makes_nothing_on_the_state_dirs_disk(
    bwrap: BwrapRuntime, run_bwrap: RunCode, tmp_path: Path
) -> None:
    """Its whole scratch is on the tmpfs (the kept disk aside); with inputs, they spill."""
    code = "import os; print(os.listdir('/input'), os.access('/input', os.W_OK))"
    plain = run_bwrap(code, sink=_DisksSeenAtReady(disks_dir=bwrap.disks_dir))
    assert plain.sink.stdout == "[] False\n", plain.sink.stderr
    assert isinstance(plain.sink, _DisksSeenAtReady) and plain.sink.seen == []
    host_file = tmp_path / "in.csv"
    host_file.write_text("a,b\n")
    given = [InputFile(host_file, "in.csv")]
    spilled = run_bwrap(code, inputs=given, sink=_DisksSeenAtReady(disks_dir=bwrap.disks_dir))
    assert spilled.sink.stdout == "['in.csv'] False\n", spilled.sink.stderr
    assert isinstance(spilled.sink, _DisksSeenAtReady)
    assert spilled.sink.seen == [spilled.spec.sandbox_id]  # the inputs' spill, removed after
    assert not (bwrap.disks_dir / spilled.spec.sandbox_id).exists()
