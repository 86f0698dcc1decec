"""The kernel's wires on the host (no sandbox): what the output pump's `drain` promises a
cell's end, and the order the channel keeps its lines in."""

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sandcell.guest import wire
from sandcell.guest.wire import CHUNK, Channel, OutputPump


def _pump(sink_s: float = 0.0) -> tuple[OutputPump, int, list[str]]:
    """A pump on a new pipe whose sink takes `sink_s` per read; the pipe's write end."""
    read_end, write_end = os.pipe()
    received: list[str] = []

    def sink(stream: str, text: str) -> None:
        time.sleep(sink_s)
        received.append(text)

    return OutputPump("stdout", read_end, sink), write_end, received


def test_drain_returns_once_every_byte_written_was_handed_on() -> None:
    pump, write_end, received = _pump()
    text = "é" * (3 * CHUNK)  # more than one read, and more than a pipe holds: a blocked writer
    writer = threading.Thread(target=os.write, args=(write_end, text.encode()))
    writer.start()
    writer.join(10)
    assert pump.drain(10)
    assert "".join(received) == text
    for n in range(200):  # short writes, each drained before the next: none is left behind
        os.write(write_end, f"{n}\n".encode())
        assert pump.drain(10)
        assert received[-1].endswith(f"{n}\n")
    os.close(write_end)


def test_drain_gives_up_at_its_timeout_while_output_is_still_pending() -> None:
    pump, write_end, received = _pump(sink_s=0.05)
    # The whole output in the pipe at once, so that it never runs dry before the timeout: the
    # pump finds more after every read (as it did when it starved the drain of its lock).
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 16 * CHUNK)
    data = b"x" * (16 * CHUNK)
    assert os.write(write_end, data) == len(data)
    assert not pump.drain(0.2)  # 16 reads at 50 ms each: 0.8 s at the least
    assert pump.drain(30)
    assert sum(map(len, received)) == len(data)
    os.close(write_end)


def test_a_pump_whose_write_ends_are_all_closed_stops() -> None:
    pump, write_end, received = _pump()
    os.write(write_end, b"last words\n")
    os.close(write_end)  # the user closed fd 1: EOF, which must not spin the pump forever
    assert pump.drain(10)
    assert received == ["last words\n"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        t.name == "pump-stdout" for t in threading.enumerate()
    ):
        time.sleep(0.01)
    assert not any(t.name == "pump-stdout" for t in threading.enumerate())


@contextmanager
def _channel() -> Iterator[tuple[Channel, int]]:
    """A channel writing to a new pipe (its requests from another, never written); the pipe's
    read end."""
    requests_read, requests_write = os.pipe()
    answers_read, answers_write = os.pipe()
    channel = Channel(requests_read, answers_write)
    try:
        yield channel, answers_read
    finally:
        channel.reader.close()
        for fd in (requests_write, answers_read, answers_write):
            os.close(fd)


def _lines(read_end: int, count: int) -> list[dict[str, object]]:
    data = b""
    while data.count(b"\n") < count:
        data += os.read(read_end, 1 << 20)
    return [json.loads(line) for line in data.splitlines()]


def test_an_answer_on_an_idle_channel_is_written_by_the_thread_that_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writers: list[str] = []

    class Os:  # the wire's view of os, noting which thread writes
        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        def write(self, fd: int, data: bytes) -> int:
            writers.append(threading.current_thread().name)
            return os.write(fd, data)

    monkeypatch.setattr(wire, "os", Os())
    with _channel() as (channel, read_end):
        channel.send({"id": "1", "event": "stdout", "text": "out"})
        assert _lines(read_end, 1)[0]["text"] == "out"
        deadline = time.monotonic() + 10  # the writer's task_done comes just after its write
        while channel.outbox.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.001)
        channel.send_idle({"id": "1", "result": {"ok": True}})
        assert _lines(read_end, 1) == [{"id": "1", "result": {"ok": True}}]
        channel.close()
    assert writers == ["wire-out", threading.current_thread().name]


def test_an_answer_never_overtakes_the_lines_queued_before_it() -> None:
    with _channel() as (channel, read_end):
        channel.close()  # the writer thread stops: lines queued now wait for the next one
        channel.send({"id": "1", "event": "stdout", "text": "last"})
        channel.send_idle({"id": "1", "result": {}})
        threading.Thread(target=channel._write_loop, name="wire-out").start()
        lines = _lines(read_end, 2)
        channel.close()
    assert lines == [{"id": "1", "event": "stdout", "text": "last"}, {"id": "1", "result": {}}]
