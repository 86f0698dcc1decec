"""The kernel's output pump on the host (no sandbox): what `drain` promises a cell's end."""

import os
import threading
import time

from sandcell.guest.wire import CHUNK, OutputPump


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


def test_drain_gives_up_at_its_timeout_while_output_keeps_coming() -> None:
    pump, write_end, received = _pump(sink_s=0.02)  # ~1 s for 48 reads of a full pipe
    data = b"x" * (48 * CHUNK)
    writer = threading.Thread(target=os.write, args=(write_end, data))
    writer.start()
    deadline = time.monotonic() + 10
    while not received and time.monotonic() < deadline:  # the writer has begun
        time.sleep(0.001)
    assert not pump.drain(0.2)
    writer.join(30)
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
