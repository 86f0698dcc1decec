"""The pool runner's exit line, found in a pipe however the reads split it."""

import os

import pytest

from sandcell.runtime.streams import ExitLine, Streams

LINE = b"\x1esandcell-exit 3\n"


def feed_in_pieces(data: bytes, size: int) -> tuple[bytes, int | None]:
    line = ExitLine()
    delivered = b"".join(line.feed(data[i : i + size]) for i in range(0, len(data), size))
    return delivered + line.feed(b"", eof=True), line.status


@pytest.mark.parametrize("size", [1, 2, 5, 16, 17, 1000])
def test_the_exit_line_is_found_across_any_split(size: int) -> None:
    delivered, status = feed_in_pieces(b"out\x1eput" + LINE + b"not the program's", size)
    assert (delivered, status) == (b"out\x1eput", 3)


@pytest.mark.parametrize(
    "data",
    [b"ends with \x1esandcell-ex", b"\x1esandcell-exit 12", b"\x1esandcell-exit x\n", b"\x1e"],
)
def test_a_tail_that_never_becomes_an_exit_line_is_delivered_at_eof(data: bytes) -> None:
    assert feed_in_pieces(data, 3) == (data, None)


def test_a_held_back_tail_is_delivered_once_it_cannot_be_the_line() -> None:
    line = ExitLine()
    assert line.feed(b"a\x1esand") == b"a"
    assert line.feed(b"box\n") == b"\x1esandbox\n"
    assert line.status is None


def test_streams_end_when_both_pipes_gave_their_exit_lines() -> None:
    class Sink:
        def __init__(self) -> None:
            self.out: list[tuple[str, bytes]] = []

        def ready(self) -> None: ...

        def output(self, stream: str, data: bytes) -> None:
            self.out.append((stream, data))

        def output_file(self, *_: object) -> None: ...

    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    sink = Sink()
    streams = Streams(os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"), sink, 1 << 20, True)
    streams.start()
    os.write(out_w, b"\x1esandcell-ready\nhello\n" + LINE)
    assert not streams.ended.wait(0.2) and streams.exit_status is None  # stderr's is missing
    os.write(err_w, b"oops\n" + LINE + b"after")
    assert streams.ended.wait(5) and streams.exit_status == 3
    assert sorted(sink.out) == [("stderr", b"oops\n"), ("stdout", b"hello\n")]
    os.write(out_w, b"more")  # after its exit line a pipe is drained, never delivered
    for fd in (out_w, err_w):
        os.close(fd)
    assert streams.join(5) and len(sink.out) == 2
