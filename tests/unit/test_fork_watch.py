"""The fork watch counts the sentry's refused forks, and nothing else, from its FIFO."""

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from sandcell.runtime import fork_watch
from sandcell.runtime.fork_watch import ForkWatch

REFUSED = (
    b"I1202 17:23:53.145475    5133 strace.go:611] [  10:  10] python3.11 X clone("
    b"CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|0x11, 0x0, 0x0, 0x7f7d1b56a310, 0x0)"
    b" = 0 (0x0) errno=11 (try again) (601.347\xc2\xb5s)\n"
)
FORKED = b"I1202 17:23:53.1 strace.go:611] [   3:   3] python3.11 X clone(0x11) = 7 (0x7) (1ms)\n"
ENTRY = b"I1202 17:23:53.1 strace.go:611] [   3:   3] python3.11 E clone(0x11)\n"
# A process may name itself anything; its name alone is not a refused fork.
NAMED = b"I1202 17:23:53.1 strace.go:611] [   4:   4] errno=11 ( X clone(0x11) = 5 (0x5) (1ms)\n"


def test_counts_only_refused_forks_including_lines_split_across_writes(tmp_path: Path) -> None:
    watch = ForkWatch(tmp_path / "forks.fifo")
    watch.start()
    writer = os.open(watch.fifo, os.O_WRONLY)
    os.write(writer, ENTRY + FORKED + NAMED + REFUSED[:50])
    os.write(writer, REFUSED[50:] + REFUSED)
    os.close(writer)
    assert watch.stop() == 2


def test_no_lines_is_no_refusal_and_stop_is_idempotent(tmp_path: Path) -> None:
    watch = ForkWatch(tmp_path / "forks.fifo")
    watch.start()
    assert watch.stop() == 0
    assert watch.stop() == 0


def test_stop_wakes_a_watch_blocked_on_a_silent_fifo(tmp_path: Path) -> None:
    """The watch waits without a timeout (no wake-ups while nothing happens): stop() alone
    must end that wait, and the lines written before it still count."""
    watch = ForkWatch(tmp_path / "forks.fifo")
    watch.start()
    writer = os.open(watch.fifo, os.O_WRONLY)
    os.write(writer, REFUSED)
    time.sleep(0.3)  # read, and blocked again on silence
    counted: list[int] = []
    stopper = threading.Thread(target=lambda: counted.append(watch.stop()), daemon=True)
    stopper.start()
    stopper.join(5)
    os.close(writer)
    assert not stopper.is_alive() and counted == [1]


def test_flags_send_boot_strace_of_the_fork_family_to_the_fifo(tmp_path: Path) -> None:
    flags = ForkWatch(tmp_path / "f").runsc_flags()
    assert "--strace" in flags and "--strace-syscalls=clone,fork,vfork" in flags
    assert f"--debug-log={tmp_path / 'f'}" in flags and "--debug-command=boot" in flags


def test_a_burst_of_writes_is_read_in_one_wake_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runsc writes its boot log a line per write (~50 of them): the watch lets them gather
    rather than waking for each, and still counts every refusal. (A long gather here, so that
    the 50 writes surely fall inside it.)"""
    monkeypatch.setattr(fork_watch, "GATHER_S", 5.0)
    drains: list[int] = []

    class Counting(ForkWatch):
        def _drain(self) -> bytes:
            data = super()._drain()
            drains.append(len(data))
            return data

    watch = Counting(tmp_path / "forks.fifo")
    watch.start()
    writer = os.open(watch.fifo, os.O_WRONLY)
    for _ in range(50):
        os.write(writer, REFUSED)
    os.close(writer)
    assert watch.stop() == 50  # stop() ends the gather at once
    assert [n for n in drains if n] == [50 * len(REFUSED)]


def test_the_fifo_holds_what_runsc_writes_while_lines_gather(tmp_path: Path) -> None:
    """A fork bomb's lines (megabytes a second) must not stall the sentry's log writes for
    long, nor be lost: the FIFO is enlarged, and everything written is counted."""
    watch = ForkWatch(tmp_path / "forks.fifo")
    watch.start()
    assert watch._fd is not None
    assert fcntl.fcntl(watch._fd, fcntl.F_GETPIPE_SZ) >= 1 << 20
    writer = os.open(watch.fifo, os.O_WRONLY)
    os.write(writer, REFUSED * 4000)  # ~640 KB in one write: more than a default pipe holds
    os.close(writer)
    assert watch.stop() == 4000
