"""What only the bwrap tier's seccomp filter promises: each denied syscall family, for real.

The table runs once in one bwrap sandbox (x86_64 syscall numbers, written out here rather than
taken from the policy, so the test checks the policy instead of repeating it). Many of these
would fail anyway for an unprivileged process, so `test_the_filter_alone_denies_what_root_may`
loads the same filter into a root process on the host, where the kernel would say yes: there,
only the filter can say no.
"""

import errno
import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import SandboxSpec
from sandcell.runtime.bwrap import BwrapRuntime
from tests.integration.conftest import GUEST_ENV, RecordingSink
from tests.security.conftest import RunCode, assert_released

pytestmark = pytest.mark.bwrap

EPERM, ENOSYS = errno.EPERM, errno.ENOSYS
SIGCHLD = 17
CLONE_FLAGS = {
    "newns": 0x00020000,
    "newcgroup": 0x02000000,
    "newuts": 0x04000000,
    "newipc": 0x08000000,
    "newuser": 0x10000000,
    "newpid": 0x20000000,
    "newnet": 0x40000000,
}
# label -> (syscall number, arguments, expected errno); "BUF" is a zeroed 4 KiB buffer and a
# str is a C string.
DENIED: dict[str, tuple[int, tuple[Any, ...], int]] = {
    "io_uring_setup": (425, (8, "BUF"), EPERM),
    "io_uring_enter": (426, (0, 0, 0, 0, 0, 0), EPERM),
    "io_uring_register": (427, (0, 0, 0, 0), EPERM),
    "bpf": (321, (0, "BUF", 64), EPERM),
    "userfaultfd": (323, (1,), EPERM),  # UFFD_USER_MODE_ONLY: allowed to anyone otherwise
    "perf_event_open": (298, ("BUF", 0, -1, -1, 0), EPERM),
    "keyctl": (250, (0, -3, 1), EPERM),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (248, ("user", "k", "BUF", 1, -3), EPERM),
    "request_key": (249, ("user", "k", 0, 0), EPERM),
    "ptrace": (101, (0, 0, 0, 0), EPERM),  # PTRACE_TRACEME
    "process_vm_readv": (310, (1, "BUF", 1, "BUF", 1, 0), EPERM),
    "process_vm_writev": (311, (1, "BUF", 1, "BUF", 1, 0), EPERM),
    "pidfd_getfd": (438, (0, 0, 0), EPERM),
    "process_madvise": (440, (0, 0, 0, 0, 0), EPERM),
    "mount": (165, ("none", "/tmp", "tmpfs", 0, 0), EPERM),
    "umount2": (166, ("/tmp", 0), EPERM),
    "pivot_root": (155, (".", "."), EPERM),
    "chroot": (161, ("/",), EPERM),
    "mount_setattr": (442, (-100, "/tmp", 0, "BUF", 32), EPERM),
    "move_mount": (429, (-100, "/tmp", -100, "/tmp", 0), EPERM),
    "open_tree": (428, (-100, "/tmp", 0), EPERM),  # unprivileged may do this otherwise
    "fsopen": (430, ("tmpfs", 0), EPERM),
    "fsconfig": (431, (0, 0, 0, 0, 0), EPERM),
    "fsmount": (432, (0, 0, 0), EPERM),
    "fspick": (433, (-100, "/tmp", 0), EPERM),
    "open_tree_attr (newer than the review)": (467, (-100, "/tmp", 0, 0, 0), ENOSYS),
    "unshare(0)": (272, (0,), EPERM),
    "unshare(CLONE_NEWUSER)": (272, (CLONE_FLAGS["newuser"],), EPERM),
    "setns": (308, (0, 0), EPERM),
    **{
        f"clone(CLONE_{k.upper()})": (56, (v | SIGCHLD, 0, 0, 0, 0), EPERM)
        for k, v in CLONE_FLAGS.items()
    },
    "clone3": (435, ("BUF", 88), ENOSYS),
    "kexec_load": (246, (0, 0, 0, 0), EPERM),
    "kexec_file_load": (320, (0, 0, 0, "", 0), EPERM),
    "init_module": (175, ("BUF", 0, ""), EPERM),
    "finit_module": (313, (0, "", 0), EPERM),
    "delete_module": (176, ("x", 0), EPERM),
    "reboot": (169, (0, 0, 0, 0), EPERM),
    "syslog": (103, (10, 0, 0), EPERM),  # SYSLOG_ACTION_SIZE_BUFFER
    "iopl": (172, (3,), EPERM),
    "open_by_handle_at": (304, (-100, "BUF", 0), EPERM),
    "name_to_handle_at": (303, (-100, "/tmp", "BUF", "BUF", 0), EPERM),
    "socket(AF_VSOCK)": (41, (40, 1, 0), EPERM),
    "socket(AF_VSOCK) with high bits set": (41, (0x1_0000_0028, 1, 0), EPERM),
    "socket(AF_PACKET)": (41, (17, 3, 0), EPERM),
    "socket(AF_NETLINK, NETLINK_KOBJECT_UEVENT)": (41, (16, 3, 15), EPERM),
    "socket(AF_NETLINK, NETLINK_SOCK_DIAG)": (41, (16, 3, 4), EPERM),
    "socket(AF_INET, SOCK_RAW)": (41, (2, 3, 1), EPERM),
    "socket(AF_INET6, SOCK_RAW)": (41, (10, 3, 58), EPERM),
    "socket(AF_INET, SOCK_PACKET)": (41, (2, 10, 0), EPERM),
    "socket(AF_ALG)": (41, (38, 5, 0), EPERM),
    "socket(AF_KEY)": (41, (15, 3, 2), EPERM),
    "socket(family 60)": (41, (60, 1, 0), EPERM),
    "personality(ADDR_NO_RANDOMIZE)": (135, (0x0040000,), EPERM),
    "personality(READ_IMPLIES_EXEC)": (135, (0x0400000,), EPERM),
    "personality(MMAP_PAGE_ZERO)": (135, (0x0100000,), EPERM),
}
# What a Python program needs must keep working: label -> (number, arguments).
ALLOWED: dict[str, tuple[int, tuple[Any, ...]]] = {
    "socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)": (41, (16, 3, 0)),
    "socket(AF_INET, SOCK_STREAM)": (41, (2, 1, 0)),
    "socket(AF_INET6, SOCK_DGRAM)": (41, (10, 2, 0)),
    "socket(AF_UNIX, SOCK_STREAM)": (41, (1, 1, 0)),
    "personality(PER_LINUX)": (135, (0,)),
    "clone(SIGCHLD) (fork)": (56, (SIGCHLD, 0, 0, 0, 0)),
}

RUN_TABLE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(4096)
def arg(a):
    if a == 'BUF':
        return ctypes.c_void_p(ctypes.addressof(buf))
    return ctypes.c_char_p(a.encode()) if isinstance(a, str) else ctypes.c_long(a)
results = {}
for label, (nr, args) in json.loads(sys.argv[1]).items():
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *map(arg, args))
    if nr == 56 and result == 0:
        os._exit(0)  # a clone that got through: the child leaves at once
    if nr == 56 and result > 0:
        os.waitpid(result, 0)
    results[label] = [result, ctypes.get_errno()]
print(json.dumps(results))
"""


def _rows() -> dict[str, tuple[int, tuple[Any, ...]]]:
    return {k: (nr, args) for k, (nr, args, _) in DENIED.items()} | ALLOWED


@pytest.fixture(scope="module")
def table_results(bwrap: BwrapRuntime, python_image: Image) -> dict[str, list[int]]:
    """Every row of the table, run once inside one bwrap sandbox."""
    spec = SandboxSpec(
        "s-seccomp-table",
        python_image,
        [python_image.python, "-c", RUN_TABLE, json.dumps(_rows())],
        GUEST_ENV,
        Limits(),
    )
    sink = RecordingSink()
    result = bwrap.run(spec, sink, threading.Event())
    assert result.reason is None and result.released, (result, sink.stderr)
    assert_released(bwrap, spec.sandbox_id)
    results: dict[str, list[int]] = json.loads(sink.stdout)
    return results


@pytest.mark.parametrize("label", DENIED)
def test_denied_syscall_family(table_results: dict[str, list[int]], label: str) -> None:
    expected = DENIED[label][2]
    assert table_results[label] == [-1, expected], errno.errorcode.get(table_results[label][1])


@pytest.mark.parametrize("label", ALLOWED)
def test_what_programs_need_still_works(table_results: dict[str, list[int]], label: str) -> None:
    result, error = table_results[label]
    assert result >= 0 and error == 0, errno.errorcode.get(error)


def test_ptrace_of_a_sibling_fails(run_bwrap: RunCode) -> None:
    code = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
    print(libc.ptrace(request, child, 0, 0), ctypes.get_errno())
try:
    open(f'/proc/{child}/mem', 'rb').read(1)
except OSError as e:
    print('mem', type(e).__name__)
os.kill(child, 9)
"""
    ran = run_bwrap(code)
    lines = ran.sink.stdout.splitlines()
    assert lines[:2] == [f"-1 {EPERM}"] * 2
    assert lines[2].startswith("mem")  # reading its memory fails too (offset 0 is unmapped)


def test_unshare_fails(run_bwrap: RunCode) -> None:
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for flags in (0x10000000, 0x00020000, 0x40000000):  # NEWUSER, NEWNS, NEWNET
    print(libc.unshare(flags), ctypes.get_errno())
"""
    assert run_bwrap(code).sink.stdout.splitlines() == [f"-1 {EPERM}"] * 3


def test_i386_syscalls_kill_the_process(run_bwrap: RunCode) -> None:
    """The filter speaks x86_64 only: `int 0x80` (the i386 ABI) must not get around it."""
    code = """
import ctypes, mmap
# mov eax, 26 (ptrace on i386); int 0x80; ret
machine_code = bytes([0xB8, 26, 0, 0, 0, 0xCD, 0x80, 0xC3])
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(machine_code)
call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print('calling', flush=True)
print('returned', call())
"""
    ran = run_bwrap(code)
    assert ran.sink.stdout == "calling\n"
    assert (ran.result.reason, ran.result.exit_code) == (Reason.EXIT_CODE, 128 + 31)  # SIGSYS


LOAD_AND_TRY = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
program = sys.stdin.buffer.read()
if program:
    class Fprog(ctypes.Structure):
        _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_char_p)]
    fprog = Fprog(len(program) // 8, program)
    assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP
results = {}
for label, (nr, args) in json.loads(sys.argv[1]).items():
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    results[label] = ctypes.get_errno() if result < 0 else 0
print(json.dumps(results))
"""
# Calls the kernel grants root (so a refusal can only come from the filter); all harmless.
ROOT_MAY = {
    "unshare(CLONE_NEWNS)": (272, (0x00020000,)),
    "socket(AF_PACKET)": (41, (17, 3, 0)),
    "socket(AF_VSOCK)": (41, (40, 1, 0)),
    "socket(AF_INET, SOCK_RAW)": (41, (2, 3, 1)),
    "socket(AF_NETLINK, NETLINK_KOBJECT_UEVENT)": (41, (16, 3, 15)),
    "keyctl(KEYCTL_GET_KEYRING_ID)": (250, (0, -3, 1)),
    "userfaultfd": (323, (1,)),
    "syslog(SIZE_BUFFER)": (103, (10, 0, 0)),
}


def test_the_filter_alone_denies_what_root_may(bwrap: BwrapRuntime) -> None:
    def attempt(program: bytes) -> dict[str, int]:
        argv = [sys.executable, "-c", LOAD_AND_TRY, json.dumps(ROOT_MAY)]
        done = subprocess.run(argv, input=program, capture_output=True, check=True, timeout=30)
        results: dict[str, int] = json.loads(done.stdout)
        return results

    assert attempt(b"") == dict.fromkeys(ROOT_MAY, 0)  # the kernel itself says yes
    assert attempt(bwrap.seccomp_filter()) == dict.fromkeys(ROOT_MAY, EPERM)
