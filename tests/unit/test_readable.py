"""readable(): a descriptor's readiness whatever its number (select.select stops at 1024)."""

import os
import resource
from collections.abc import Iterator

import pytest

from sandcell.runtime.hand_over import read_line
from sandcell.runtime.readable import readable

HIGH_FD = 1500


@pytest.fixture
def high_pipe() -> Iterator[tuple[int, int]]:
    """A pipe whose read end is HIGH_FD."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH_FD:
        pytest.skip(f"RLIMIT_NOFILE's hard limit {hard} is below {HIGH_FD}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH_FD + 1), hard))
    read_end, write_end = os.pipe()
    os.dup2(read_end, HIGH_FD)
    os.close(read_end)
    try:
        yield HIGH_FD, write_end
    finally:
        os.close(HIGH_FD)
        os.close(write_end)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_descriptor_past_1024_is_waited_for(high_pipe: tuple[int, int]) -> None:
    read_end, write_end = high_pipe
    assert not readable(read_end, 0)
    assert not readable(read_end, 0.01)
    os.write(write_end, b"x")
    assert readable(read_end, 0) and readable(read_end, None)


def test_the_peers_end_counts_as_readable() -> None:
    read_end, write_end = os.pipe()
    try:
        os.close(write_end)
        assert readable(read_end, 1.0)  # EOF: a read would not block
    finally:
        os.close(read_end)


def test_a_warm_sandboxs_line_is_read_past_1024(high_pipe: tuple[int, int]) -> None:
    read_end, write_end = high_pipe
    os.write(write_end, b"\x1esandcell-warm {}\nnext")
    assert read_line(read_end, 1.0) == b"\x1esandcell-warm {}\n"  # and nothing after it
    assert read_line(read_end, 0.01) == b"next"  # no newline before the timeout
