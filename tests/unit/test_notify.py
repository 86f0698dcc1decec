"""The in-process notifier, the unix-socket one between processes, and the `?wait=` waiter."""

import asyncio
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandcell.api import waiting
from sandcell.api.waiting import FALLBACK_S, EndSweep, JobEnd
from sandcell.ports.notify import ANY, JOB_DONE, JOB_LOGS, JOB_QUEUED, LocalNotifier, wake_on
from sandcell.store.notify_local import SocketNotifier


def test_local_notifier_delivers_per_channel_with_payload_until_unlistened() -> None:
    notifier = LocalNotifier()
    heard: list[tuple[str, str]] = []
    unlisten = notifier.listen(JOB_DONE, lambda p: heard.append(("done", p)))
    notifier.listen(JOB_QUEUED, lambda p: heard.append(("queued", p)))
    notifier.notify(JOB_DONE, "job_1")
    notifier.notify(JOB_QUEUED, "job_2")
    notifier.notify("elsewhere", "job_3")
    unlisten()
    unlisten()  # twice is harmless
    notifier.notify(JOB_DONE, "job_4")
    assert heard == [("done", "job_1"), ("queued", "job_2")]
    assert notifier.listeners(JOB_DONE) == 0 and notifier.listeners(JOB_QUEUED) == 1


def test_a_failing_listener_does_not_starve_the_others() -> None:
    notifier = LocalNotifier()
    heard: list[str] = []

    def broken(payload: str) -> None:
        raise RuntimeError("listener bug")

    notifier.listen(JOB_DONE, broken)
    notifier.listen(JOB_DONE, heard.append)
    notifier.notify(JOB_DONE, "job_1")  # does not raise
    assert heard == ["job_1"]


def test_wake_on_sets_an_event_from_another_thread() -> None:
    notifier = LocalNotifier()
    woken = threading.Event()
    wake_on(notifier, JOB_QUEUED, woken)
    threading.Timer(0.05, notifier.notify, args=(JOB_QUEUED, "job_1")).start()
    started = time.monotonic()
    assert woken.wait(5)
    assert time.monotonic() - started < 1


def test_socket_notifier_wakes_another_instance_and_itself(tmp_path: Path) -> None:
    api, worker = SocketNotifier(tmp_path / "notify"), SocketNotifier(tmp_path / "notify")
    try:
        at_worker, at_api = _recorder(worker, JOB_QUEUED), _recorder(api, JOB_QUEUED)
        api.notify(JOB_QUEUED, "job_1")
        assert at_worker.wait() == ["job_1"]
        assert at_api.wait() == ["job_1"]  # its own listeners directly, exactly once
        time.sleep(0.05)
        assert at_api.heard == ["job_1"]
    finally:
        api.close()
        worker.close()
    assert list((tmp_path / "notify").iterdir()) == []  # sockets removed on close


def test_socket_notifier_reaches_another_process_and_a_deep_data_dir(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d" * 30] * 4, "notify")  # beyond sun_path's 108 bytes
    listener = SocketNotifier(deep)
    try:
        heard = _recorder(listener, JOB_DONE)
        code = (
            "import sys; from pathlib import Path;"
            " from sandcell.store.notify_local import SocketNotifier;"
            " n = SocketNotifier(Path(sys.argv[1])); n.notify(sys.argv[2], 'job_9'); n.close()"
        )
        subprocess.run([sys.executable, "-c", code, str(deep), JOB_DONE], check=True)
        assert heard.wait() == ["job_9"]
    finally:
        listener.close()


def test_socket_notifier_drops_the_socket_of_a_dead_process(tmp_path: Path) -> None:
    stale = tmp_path / "4242-deadbeef.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dead:
        dead.bind(str(stale))  # closed without unlink: what a killed process leaves
    sender = SocketNotifier(tmp_path)
    try:
        sender.notify(JOB_DONE, "job_1")  # does not raise
        assert not stale.exists()
    finally:
        sender.close()


def test_a_process_that_listened_and_exits_without_closing_leaves_no_socket(
    tmp_path: Path,
) -> None:
    code = (
        "import sys; from pathlib import Path;"
        " from sandcell.store.notify_local import SocketNotifier;"
        " n = SocketNotifier(Path(sys.argv[1])); n.listen('x', print);"
        " print(len(list(Path(sys.argv[1]).iterdir())))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], check=True, capture_output=True, text=True
    )
    assert done.stdout == "1\n"  # its socket, while it ran
    assert list(tmp_path.iterdir()) == []


def test_job_end_wakes_a_waiter_at_once_and_only_for_its_job() -> None:
    async def scenario() -> tuple[float, float]:
        notifier = LocalNotifier()
        with JobEnd(notifier, "job_1") as end:
            loop = asyncio.get_running_loop()
            threading.Timer(0.05, notifier.notify, args=(JOB_DONE, "job_1")).start()
            started = loop.time()
            await end.wait(10)
            woken = loop.time() - started
            notifier.notify(JOB_DONE, "job_2")  # another job's end: not ours
            started = loop.time()
            await end.wait(0.2)
            other = loop.time() - started
        assert notifier.listeners(JOB_DONE) == 0
        return woken, other

    woken, other = asyncio.run(scenario())
    assert woken < 0.5 < FALLBACK_S
    assert other == pytest.approx(0.2, abs=0.1)


def test_a_log_follower_wakes_on_new_chunks_of_its_job_and_on_its_end() -> None:
    async def scenario() -> list[float]:
        notifier = LocalNotifier()
        woken = []
        with JobEnd(notifier, "job_1", (JOB_DONE, JOB_LOGS)) as news:
            loop = asyncio.get_running_loop()
            for channel in (JOB_LOGS, JOB_DONE):
                loop.call_later(0.05, notifier.notify, channel, "job_1")
                started = loop.time()
                await news.wait(10)
                woken.append(loop.time() - started)
        assert notifier.listeners(JOB_LOGS) == notifier.listeners(JOB_DONE) == 0
        return woken

    assert all(seconds < 0.5 < FALLBACK_S for seconds in asyncio.run(scenario()))


def test_job_end_takes_a_wake_up_for_every_job() -> None:
    async def scenario() -> float:
        notifier = LocalNotifier()
        with JobEnd(notifier, "job_1") as end:
            loop = asyncio.get_running_loop()
            loop.call_later(0.05, notifier.notify, JOB_DONE, ANY)
            started = loop.time()
            await end.wait(10)
            return loop.time() - started

    assert asyncio.run(scenario()) < 0.5


def test_a_submit_listening_before_its_job_exists_misses_no_end() -> None:
    """`POST /v1/jobs?wait=` listens before the job is accepted, so it needs no read to learn
    whether the end came first: an end heard before the id is known still counts, another
    job's does not."""

    async def scenario() -> tuple[float, float]:
        notifier = LocalNotifier()
        loop = asyncio.get_running_loop()
        with JobEnd(notifier, None) as end:
            notifier.notify(JOB_DONE, "job_2")  # while the submit runs: another job's end
            notifier.notify(JOB_DONE, "job_1")  # ...and its own, before the id is known
            await asyncio.sleep(0.05)  # delivered
            end.expect("job_1")
            started = loop.time()
            await end.wait(10)
            ours = loop.time() - started
        with JobEnd(notifier, None) as other:
            notifier.notify(JOB_DONE, "job_2")
            await asyncio.sleep(0.05)
            other.expect("job_1")
            started = loop.time()
            await other.wait(0.2)
            theirs = loop.time() - started
        return ours, theirs

    ours, theirs = asyncio.run(scenario())
    assert ours < 0.05
    assert theirs == pytest.approx(0.2, abs=0.1)


class _Heard:
    def __init__(self) -> None:
        self.heard: list[str] = []
        self.event = threading.Event()

    def __call__(self, payload: str) -> None:
        self.heard.append(payload)
        self.event.set()

    def wait(self) -> list[str]:
        assert self.event.wait(5), "no notification arrived"
        return self.heard


def _recorder(notifier: LocalNotifier | SocketNotifier, channel: str) -> _Heard:
    heard = _Heard()
    notifier.listen(channel, heard)
    return heard


def test_socket_notifier_without_a_usable_directory_still_wakes_its_own_process(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    notifier = SocketNotifier(blocker / "notify")  # cannot be made: in-process only
    try:
        heard = _recorder(notifier, JOB_QUEUED)
        notifier.notify(JOB_QUEUED, "job_1")
        assert heard.wait() == ["job_1"]
    finally:
        notifier.close()


def test_the_sweep_wakes_every_waiter_of_an_ended_job_with_one_read_a_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Notifications lost: the waiters of a job that ended hear of it at the sweep's next look;
    one read covers every awaited job; the look stops once nobody waits."""
    monkeypatch.setattr(waiting, "FALLBACK_S", 0.05)
    ended: set[str] = set()
    reads: list[list[str]] = []

    def ended_among(job_ids: list[str]) -> set[str]:
        reads.append(sorted(job_ids))
        return ended & set(job_ids)

    async def scenario() -> tuple[list[float], bool]:
        sweep, notifier = EndSweep(ended_among), LocalNotifier()  # nobody notifies
        loop = asyncio.get_running_loop()
        with (
            JobEnd(notifier, "job_1", sweep=sweep) as first,
            JobEnd(notifier, None, sweep=sweep) as second,  # a submit's: its id comes later
            JobEnd(notifier, "job_2", sweep=sweep) as other,
        ):
            second.expect("job_1")
            await asyncio.sleep(0.12)  # looks that find nothing ended wake nobody
            ended.add("job_1")
            started = loop.time()
            woken = []
            for end in (first, second):
                await end.wait(10)
                woken.append(loop.time() - started)
            started = loop.time()
            await other.wait(0.2)
            other_woken = loop.time() - started < 0.15
        reads.clear()
        await asyncio.sleep(0.2)
        return woken, other_woken

    woken, other_woken = asyncio.run(scenario())
    assert all(seconds < 1.0 for seconds in woken)  # not the 10 s they would wait for
    assert not other_woken  # job_2 has not ended: its waiter waited its whole 0.2 s
    assert reads == []  # nobody waits: no more looks


def test_each_look_reads_every_awaited_job_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "FALLBACK_S", 0.05)
    reads: list[list[str]] = []

    def ended_among(job_ids: list[str]) -> set[str]:
        reads.append(sorted(job_ids))
        return set()

    async def scenario() -> None:
        sweep, notifier = EndSweep(ended_among), LocalNotifier()
        with JobEnd(notifier, "job_1", sweep=sweep), JobEnd(notifier, "job_2", sweep=sweep):
            await asyncio.sleep(0.18)

    asyncio.run(scenario())
    assert 2 <= len(reads) <= 4 and all(ids == ["job_1", "job_2"] for ids in reads)
