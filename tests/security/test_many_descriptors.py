"""A worker at its busiest holds hundreds of descriptors: a sandbox started when their numbers
have passed 1024 is still watched to its end, on every runtime (select(2) refused them)."""

import os
import resource
from collections.abc import Iterator

import pytest

from tests.security.conftest import RunCode

FILLER = 1100


@pytest.fixture
def descriptors_past_1024() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= FILLER + 64:
        pytest.skip(f"RLIMIT_NOFILE's hard limit {hard} is too low")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, FILLER + 64), hard))
    held = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(FILLER)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_sandbox_is_watched_to_its_end_past_1024_descriptors(
    descriptors_past_1024: None, run_code: RunCode
) -> None:
    ran = run_code("print('still watched')")
    assert ran.result.reason is None and ran.result.exit_code == 0, ran.result.detail
    assert ran.sink.stdout == "still watched\n"
