"""Deferred calls for every job of the process, by one thread: in due order, not before their
time, never once cancelled; a failing call ends no other; the thread ends when idle."""

import threading
import time

import pytest

from sandcell.services import later as later_module
from sandcell.services.later import Later


def test_calls_run_in_due_order_in_one_thread_and_not_early() -> None:
    later, ran = Later(), []
    done = threading.Event()
    asked = time.monotonic()

    def record(name: str) -> None:
        ran.append((name, time.monotonic() - asked, threading.current_thread().name))
        if len(ran) == 3:
            done.set()

    later.call_in(0.15, lambda: record("c"))
    later.call_in(0.05, lambda: record("a"))
    later.call_in(0.10, lambda: record("b"))
    assert done.wait(5)
    assert [name for name, _, _ in ran] == ["a", "b", "c"]
    for (_, at, _), due in zip(ran, (0.05, 0.10, 0.15), strict=True):
        assert at >= due
    assert {thread for _, _, thread in ran} == {"later"}


def test_a_cancelled_call_is_never_made_and_a_failing_one_stops_no_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    later, ran = Later(), threading.Event()
    cancelled = later.call_in(0.02, lambda: pytest.fail("cancelled, yet called"))

    def fail() -> None:
        raise RuntimeError("boom")

    later.call_in(0.03, fail)
    later.call_in(0.05, ran.set)
    cancelled.cancel()
    assert ran.wait(5)
    assert "a deferred call failed" in caplog.text


def test_the_thread_ends_when_idle_and_starts_again_on_need(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(later_module, "IDLE_S", 0.05)
    later, ran = Later(), threading.Event()
    later.call_in(0.01, lambda: None)
    deadline = time.monotonic() + 5
    while later._running:  # its thread has ended
        assert time.monotonic() < deadline
        time.sleep(0.01)
    later.call_in(0.01, ran.set)
    assert ran.wait(5)
