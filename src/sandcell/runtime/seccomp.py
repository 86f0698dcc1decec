"""The seccomp policy of the bwrap runtime, compiled once to a classic BPF program.

The bwrap tier shares the host kernel, so this filter is what keeps the kernel's riskiest
interfaces out of reach. It is a deny list on top of "allow": every syscall family below gets
EPERM (clone3 gets ENOSYS so that libc falls back to clone, whose flags a filter can read),
and syscall numbers newer than the table reviewed here get ENOSYS, so a kernel upgrade never
widens the surface on its own. Syscalls of any other ABI (i386 via int 0x80, x32) kill the
process: the filter only speaks x86_64.

Compiled with libseccomp (Debian's libseccomp2, through the `pyseccomp` ctypes binding), which
handles the architecture check and the 64-bit argument comparisons. Integer arguments are
compared through a 32-bit mask, because the kernel truncates them: 0x1_0000_0028 is AF_VSOCK
to the kernel and must be to the filter too.
"""

import errno
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandcell.domain.errors import RuntimeUnavailable

if TYPE_CHECKING:
    import pyseccomp

DENIED = (
    # Kernel attack surface a sandbox never needs.
    *("io_uring_setup", "io_uring_enter", "io_uring_register"),
    *("bpf", "userfaultfd", "perf_event_open"),
    *("keyctl", "add_key", "request_key"),
    # Reaching into other processes.
    *("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise"),
    # Mounts and namespaces: the sandbox's view of the world is fixed before it starts.
    *("mount", "umount2", "pivot_root", "chroot", "mount_setattr"),
    *("move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick"),
    *("unshare", "setns"),
    # The host itself: kernels, modules, clocks, swap, accounting, the kernel log.
    *("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"),
    *("reboot", "swapon", "swapoff", "acct", "syslog", "settimeofday", "clock_settime"),
    *("iopl", "ioperm", "quotactl", "quotactl_fd", "lookup_dcookie", "uselib", "vhangup"),
    # File handles bypass the mount namespace ("shocker"); fanotify watches whole mounts.
    *("open_by_handle_at", "name_to_handle_at", "fanotify_init"),
)
ENOSYS_SYSCALLS = ("clone3",)  # its flags sit in memory a filter cannot read
# x86_64 syscalls up to this number were reviewed for this table; later ones (open_tree_attr,
# 467, is a mount syscall) are ENOSYS until someone reviews them. 512 and up are not x86_64.
LAST_REVIEWED_NR, FIRST_NON_X86_64_NR = 462, 512

CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# Socket families a Python program needs; netlink only for NETLINK_ROUTE (getaddrinfo and
# if_nameindex use it). Everything else (AF_VSOCK, AF_PACKET, AF_ALG, AF_KEY, ...) is denied.
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_MAX = 1, 2, 10, 16, 46
ALLOWED_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
NETLINK_ROUTE = 0
SOCK_TYPE_MASK, SOCK_RAW, SOCK_PACKET = 0xF, 3, 10
# personality() flags that weaken the address space: no ASLR for children, executable data,
# a mappable page 0, legacy layouts. Plain PER_LINUX / PER_LINUX32 stay allowed.
PERSONALITY_TRICKS = {
    "UNAME26": 0x0020000,
    "ADDR_NO_RANDOMIZE": 0x0040000,
    "FDPIC_FUNCPTRS": 0x0080000,
    "MMAP_PAGE_ZERO": 0x0100000,
    "ADDR_COMPAT_LAYOUT": 0x0200000,
    "READ_IMPLIES_EXEC": 0x0400000,
    "ADDR_LIMIT_32BIT": 0x0800000,
    "SHORT_INODE": 0x1000000,
    "WHOLE_SECONDS": 0x2000000,
    "STICKY_TIMEOUTS": 0x4000000,
    "ADDR_LIMIT_3GB": 0x8000000,
}
INT_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class ArgRule:
    """Deny `syscall` when every (arg index, comparison, value[, mask]) matches."""

    syscall: str
    args: tuple[tuple[int, str, int, int], ...]  # (index, "masked_eq"|"ne"|"ge", value, mask)
    error: int = errno.EPERM


def argument_rules() -> list[ArgRule]:
    """The rules that look at arguments: clone flags, socket families and types, personality."""
    rules = [
        ArgRule("clone", ((0, "masked_eq", flag, flag),)) for flag in CLONE_NAMESPACE_FLAGS.values()
    ]
    rules += [
        ArgRule("socket", ((0, "masked_eq", family, INT_MASK),))
        for family in range(AF_MAX)
        if family not in ALLOWED_FAMILIES
    ]
    rules.append(ArgRule("socket", ((0, "ge", AF_MAX, 0),)))  # families newer kernels add
    rules.append(
        ArgRule("socket", ((0, "masked_eq", AF_NETLINK, INT_MASK), (2, "ne", NETLINK_ROUTE, 0)))
    )
    # Raw and packet sockets of any family but netlink (whose route sockets are SOCK_RAW).
    rules += [
        ArgRule("socket", ((0, "ne", AF_NETLINK, 0), (1, "masked_eq", kind, SOCK_TYPE_MASK)))
        for kind in (SOCK_RAW, SOCK_PACKET)
    ]
    rules += [
        ArgRule("personality", ((0, "masked_eq", bit, bit),)) for bit in PERSONALITY_TRICKS.values()
    ]
    return rules


def compile_filter() -> bytes:
    """The policy as a BPF program for `bwrap --seccomp FD`; RuntimeUnavailable if it cannot be."""
    try:
        return _export(_build())
    # The binding loads libseccomp.so.2 on import: a missing library is one of these too.
    except (ImportError, OSError, RuntimeError) as exc:
        raise RuntimeUnavailable(f"cannot compile the seccomp filter (libseccomp): {exc}") from exc


def _build() -> "pyseccomp.SyscallFilter":
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)  # a binary tree: ~150 rules, few checks per call
    for name in DENIED:
        flt.add_rule(sc.ERRNO(errno.EPERM), name)
    for name in ENOSYS_SYSCALLS:
        flt.add_rule(sc.ERRNO(errno.ENOSYS), name)
    for number in range(LAST_REVIEWED_NR + 1, FIRST_NON_X86_64_NR):
        flt.add_rule(sc.ERRNO(errno.ENOSYS), number)
    for rule in argument_rules():
        flt.add_rule(sc.ERRNO(rule.error), rule.syscall, *map(_arg, rule.args))
    return flt


def _arg(arg: tuple[int, str, int, int]) -> "pyseccomp.Arg":
    import pyseccomp as sc

    index, op, value, mask = arg
    if op == "masked_eq":
        return sc.Arg(index, sc.MASKED_EQ, mask, value)
    return sc.Arg(index, {"ne": sc.NE, "ge": sc.GE}[op], value)


def _export(flt: "pyseccomp.SyscallFilter") -> bytes:
    """libseccomp writes the program to a file descriptor: a memfd keeps it off the disk."""
    fd = os.memfd_create("sandcell-seccomp", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as program:
        flt.export_bpf(program)
        program.seek(0)
        return program.read()
