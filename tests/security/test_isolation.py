"""Hostile programs against every runtime: what they must not reach, and how they end.

Each test runs once per runtime (gvisor, bwrap) through `Runtime.run`; `run_code` also checks
that the sandbox left nothing on the host.
"""

import json
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.domain.states import Reason
from sandcell.ports.runtime import InputFile
from tests.integration.conftest import RecordingSink
from tests.security.conftest import AnyRuntime, RunCode, cgroup_relpath, processes_in_cgroup

# --- what the program can see -----------------------------------------------------------------


def test_host_canary_files_cannot_be_read(run_code: RunCode, tmp_path: Path) -> None:
    token = secrets.token_hex(8)
    canaries = [Path(f"/root/sandcell-canary-{token}"), tmp_path / f"canary-{token}"]
    for canary in canaries:
        canary.write_text(token)
    code = f"""
import os
found = []
for path in {[str(c) for c in canaries]!r} + ['/proc/1/root/root/sandcell-canary-{token}']:
    try:
        found.append(open(path).read())
    except OSError:
        pass
for top in ('/', '/tmp', '/root', '/workspace', '/proc/1/root'):
    try:
        found += [name for name in os.listdir(top) if {token!r} in name]
    except OSError:
        pass
print(found)
"""
    try:
        ran = run_code(code)
    finally:
        for canary in canaries:
            canary.unlink()
    assert ran.result.reason is None, ran.sink.stderr
    assert ran.sink.stdout == "[]\n"


@pytest.fixture
def host_process() -> Iterator[str]:
    """A host process whose command line carries a token the sandbox must never see."""
    token = f"sandcell-host-canary-{secrets.token_hex(6)}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", token])
    yield token
    proc.kill()
    proc.wait()


def test_host_processes_are_not_visible(run_code: RunCode, host_process: str) -> None:
    code = """
import json, os
procs = {}
for pid in filter(str.isdigit, os.listdir('/proc')):
    procs[pid] = open(f'/proc/{pid}/cmdline', 'rb').read().decode('utf-8', 'replace')
print(json.dumps(procs))
"""
    ran = run_code(code)
    procs = json.loads(ran.sink.stdout)
    assert host_process not in ran.sink.stdout
    # gVisor: the program is pid 1 and alone; bwrap: its reaper is pid 1, the program pid 2.
    assert len(procs) <= 2 and any("/job/main.py" in cmd for cmd in procs.values()), procs


def test_guest_is_nobody_without_capabilities_and_with_no_new_privs(run_code: RunCode) -> None:
    code = """
import ctypes, json, os
status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
libc = ctypes.CDLL(None, use_errno=True)
print(json.dumps({
    'uid': status['Uid'].split(), 'gid': status['Gid'].split(), 'groups': os.getgroups(),
    'caps': {k: int(v, 16) for k, v in status.items() if k.startswith('Cap')},
    'no_new_privs': libc.prctl(39, 0, 0, 0, 0),  # PR_GET_NO_NEW_PRIVS
}))
"""
    seen = json.loads(run_code(code).sink.stdout)
    assert seen["uid"] == ["65534"] * 4 and seen["gid"] == ["65534"] * 4
    assert seen["groups"] in ([], [65534])
    assert seen["caps"] and not any(seen["caps"].values()), seen["caps"]
    assert seen["no_new_privs"] == 1


def test_root_filesystem_is_read_only_and_tmp_is_not(run_code: RunCode) -> None:
    code = """
import errno
for path in ('/var/tmp/x', '/usr/bin/evil', '/etc/passwd'):
    try:
        open(path, 'a')
        print('wrote', path)
    except OSError as e:
        print(errno.errorcode[e.errno])
mounts = {line.split()[1]: line.split()[3].split(',') for line in open('/proc/self/mounts')}
print('ro' in mounts['/'])
open('/tmp/scratch', 'w').write('tmp is writable')
print(open('/tmp/scratch').read())
"""
    ran = run_code(code)
    lines = ran.sink.stdout.splitlines()
    assert lines[0] == "EROFS"  # /var/tmp is world-writable in the image: only ro stops it
    assert not any(line.startswith("wrote") for line in lines)
    assert lines[3:] == ["True", "tmp is writable"]


def test_input_is_read_only(run_code: RunCode, tmp_path: Path) -> None:
    host_file = tmp_path / "in.csv"
    host_file.write_text("a,b\n")
    code = """
path = '/input/data/in.csv'
print(open(path).read(), end='')
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
    assert lines[:2] == ["a,b", "True"] and len(lines) == 4
    assert "writable" not in lines
    assert host_file.read_text() == "a,b\n"


# --- network --------------------------------------------------------------------------------


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
    socket.getaddrinfo('sandcell-test.invalid', 80)
    print('resolved')
except OSError:
    print('no dns')
"""
    ran = run_code(code)
    assert ran.sink.stdout.splitlines()[0] == "['lo']"
    assert ran.sink.stdout.splitlines()[1].startswith("refused")
    assert ran.sink.stdout.splitlines()[2] == "no dns"
    assert accepted == []


# --- kernel surface -------------------------------------------------------------------------

SYSCALL = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def syscall(nr, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return result, ctypes.get_errno()
"""


def test_io_uring_is_denied(run_code: RunCode) -> None:
    code = SYSCALL + "params = ctypes.create_string_buffer(120)\n"
    code += "print(*syscall(425, 8, ctypes.addressof(params)))  # io_uring_setup\n"
    ran = run_code(code)
    result, errno_value = map(int, ran.sink.stdout.split())
    assert result == -1 and errno_value != 0


def test_mount_fails(run_code: RunCode) -> None:
    code = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())
"""
    ran = run_code(code)
    result, errno_value = map(int, ran.sink.stdout.split())
    assert result == -1 and errno_value != 0


# --- limits ---------------------------------------------------------------------------------


def test_fork_bomb_is_pids(run_code: RunCode) -> None:
    ran = run_code("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", pids=16)
    assert ran.result.reason is Reason.PIDS, ran.result
    assert ran.result.usage["wall_s"] < 15


def test_memory_hog_is_memory(run_code: RunCode) -> None:
    ran = run_code("x = bytearray(512 * 2**20); print('survived')", memory_mb=64)
    assert ran.result.reason is Reason.MEMORY, ran.result
    assert "survived" not in ran.sink.stdout


def test_disk_fill_is_disk(run_code: RunCode) -> None:
    code = "with open('/workspace/big', 'wb') as f:\n    while True: f.write(b'x' * 2**20)"
    ran = run_code(code, disk_mb=8)
    assert ran.result.reason is Reason.DISK, ran.result
    assert "No space left on device" in ran.sink.stderr


STUBBORN = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # double fork: reparented, own session, ignores SIGTERM
        print("grandchild", flush=True)
        while True:
            time.sleep(1)
    os._exit(0)
print("parent", flush=True)
while True:
    time.sleep(1)
"""


def test_cancel_leaves_no_process_of_a_stubborn_double_forked_program(
    runtime: AnyRuntime, run_code: RunCode
) -> None:
    cancel, sink = threading.Event(), RecordingSink()
    sandbox_id = f"s-stubborn-{runtime.name}"
    seen_on_host: list[int] = []

    def cancel_once_both_run() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not seen_on_host:
            if "grandchild" in sink.stdout and "parent" in sink.stdout:
                seen_on_host.extend(processes_in_cgroup(cgroup_relpath(runtime, sandbox_id)))
            time.sleep(0.05)
        cancel.set()

    watcher = threading.Thread(target=cancel_once_both_run)
    watcher.start()
    ran = run_code(STUBBORN, cancel=cancel, sink=sink, sandbox_id=sandbox_id, timeout_s=30)
    watcher.join()
    assert len(seen_on_host) >= 2, "the sandbox's processes were never seen on the host"
    assert ran.result.reason is Reason.CANCELLED and ran.result.released
    assert ran.result.usage["wall_s"] < 15
    assert not [pid for pid in seen_on_host if is_live(pid)]


def is_live(pid: int) -> bool:
    """A process that can still run: a zombie left for the host's init to reap is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
