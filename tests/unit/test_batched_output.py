"""The session kernel's batched stdout on the host (no sandbox, no audit hook installed): what
it keeps back, and when it writes."""

import fcntl
import os
import threading
from collections.abc import Iterator

import pytest

from sandcell.guest.batched_output import BATCH_BYTES, BatchedStream


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4 * BATCH_BYTES)  # a batch fits, unread
    yield read_end, write_end
    os.close(read_end)
    os.close(write_end)


def batched(write_end: int, encoding: str = "utf-8") -> BatchedStream:
    return BatchedStream(write_end, "<stdout>", encoding, "strict", threading.Event())


def written(read_end: int) -> bytes:
    try:
        return os.read(read_end, 1 << 20)
    except BlockingIOError:
        return b""


def test_text_waits_in_memory_until_a_flush_and_goes_in_one_write(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    wake = threading.Event()
    stream = BatchedStream(write_end, "<stdout>", "utf-8", "strict", wake)
    print("a", file=stream)
    assert wake.is_set()  # the flusher is told of the first text held back
    wake.clear()
    print("é", file=stream)
    stream.buffer.write(b"bytes\n")  # in order with the text
    assert not wake.is_set() and written(read_end) == b""
    stream.flush()
    assert written(read_end) == "a\né\nbytes\n".encode()


def test_a_full_batch_is_written_without_a_flush(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    stream = batched(write_end)
    stream.write("x" * (BATCH_BYTES - 1))
    assert written(read_end) == b""
    stream.write("yz")
    assert written(read_end) == b"x" * (BATCH_BYTES - 1) + b"yz"


def test_line_buffering_writes_each_text_at_once_in_the_new_encoding(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    stream = batched(write_end, "ascii")
    stream.write("kept ")
    stream.reconfigure(encoding="utf-8", line_buffering=True)  # what code for a tty asks
    assert written(read_end) == b"kept "
    stream.write("ü\n")
    assert written(read_end) == "ü\n".encode()
    assert (stream.encoding, stream.line_buffering, stream.fileno()) == ("utf-8", True, write_end)


def test_a_forked_childs_stream_drops_the_parents_queue_and_writes_at_once(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    stream = batched(write_end)
    stream.write("the parent's, written by the parent\n")
    stream.unbatch()
    stream.write("the child's\n")
    assert written(read_end) == b"the child's\n"


def test_a_closed_stream_refuses_text_and_a_bad_argument_is_a_type_error(
    pipe: tuple[int, int],
) -> None:
    read_end, write_end = pipe
    stream = batched(write_end)
    with pytest.raises(TypeError):
        stream.write(b"bytes")  # type: ignore[arg-type]
    stream.write("last\n")
    stream.close()
    assert written(read_end) == b"last\n"
    with pytest.raises(ValueError, match="closed"):
        print("more", file=stream)
