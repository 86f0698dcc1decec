"""The host's end of the kernel wire (the protocol is described in sandcell.guest.kernel).

Everything the kernel says is untrusted: the session's code runs in the kernel's process and
can write to the wire itself. So lines are bounded, malformed ones are dropped, answers are
matched to requests by id, and every field of a cell's result is checked before it is used.
"""

import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

from sandcell.ports.sessions import CellEvent, CellResult
from sandcell.runtime.bundle import READY_MARKER

MAX_LINE = 48 << 20  # a PNG or a relayed 10 MB response, base64-encoded, fits
DISPLAY_MIMES = (
    *("text/plain", "text/html", "text/markdown", "text/latex", "image/svg+xml"),
    *("image/png", "image/jpeg", "image/gif", "application/json"),
)
DISPLAY_CAP = 64 << 20  # characters of rich output kept per cell
SLACK = 4096  # the kernel's own truncation marker comes on top of the output limit


class Call:
    """One request in flight; `answer` stays None if the kernel went away first."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None] | None) -> None:
        self.on_event = on_event
        self.answer: dict[str, Any] | None = None
        self.done = threading.Event()

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(timeout_s)


class KernelChannel:
    def __init__(self, stdin: IO[bytes], stdout: IO[bytes], on_close: Callable[[], None]) -> None:
        self.stdin, self.stdout, self.on_close = stdin, stdout, on_close
        self.hello: dict[str, Any] = {}  # the kernel's ready line
        self.ready, self.closed = threading.Event(), threading.Event()
        self._calls: dict[str, Call] = {}
        self._ids = itertools.count(1)
        self._lock, self._write_lock = threading.Lock(), threading.Lock()
        threading.Thread(target=self._read_loop, name="kernel-wire", daemon=True).start()

    def call(
        self, op: str, on_event: Callable[[dict[str, Any]], None] | None = None, **fields: Any
    ) -> Call:
        request_id = f"h{next(self._ids)}"
        call = Call(on_event)
        with self._lock:
            if self.closed.is_set():
                call.done.set()
                return call
            self._calls[request_id] = call
        self._write({"id": request_id, "op": op, **fields})
        return call

    def close(self) -> None:
        """End the wire from our side: the kernel reads EOF and exits."""
        with self._write_lock, contextlib.suppress(OSError):
            self.stdin.close()

    def _write(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._write_lock:
            try:
                self.stdin.write(line)
                self.stdin.flush()
            except (OSError, ValueError):
                pass  # the kernel is gone: the reader sees EOF and fails every call

    def _read_loop(self) -> None:
        try:
            for line in bounded_lines(self.stdout, MAX_LINE):
                self._dispatch(line)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                self.stdout.close()
            with self._lock:
                self.closed.set()
                calls, self._calls = list(self._calls.values()), {}
            self.on_close()  # first: a waiting caller then finds out why the calls failed
            for call in calls:
                call.done.set()

    def _dispatch(self, line: bytes) -> None:
        if line == READY_MARKER:  # the bundle's shell wrapper says the sandbox is up
            return
        try:
            message = json.loads(line)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if message.get("event") == "ready" and "id" not in message:
            self.hello = message
            self.ready.set()
            return
        self._route(message)

    def _route(self, message: dict[str, Any]) -> None:
        request_id = str(message.get("id"))
        with self._lock:
            call = self._calls.get(request_id)
            if call is not None and "result" in message:
                del self._calls[request_id]
        if call is None:
            return
        if "result" in message:
            result = message["result"]
            call.answer = result if isinstance(result, dict) else {}
            call.done.set()
        elif call.on_event is not None:
            call.on_event(message)


def bounded_lines(stream: IO[bytes], limit: int) -> Iterator[bytes]:
    """Lines of `stream`; any line longer than `limit` is skipped whole."""
    while line := stream.readline(limit + 1):
        if len(line) <= limit and line.endswith(b"\n"):
            yield line
            continue
        while line and not line.endswith(b"\n"):  # the rest of the oversized line
            line = stream.readline(limit)


class CellCollector:
    """A cell's events: passed on as CellEvents, and gathered for its CellResult."""

    def __init__(self, on_event: Callable[[CellEvent], None] | None, output_cap: int) -> None:
        self.on_event = on_event
        self.output_left, self.display_left = output_cap + SLACK, DISPLAY_CAP
        self.streams: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.display: list[dict[str, str]] = []
        self.truncated = False
        self.failure: Exception | None = None  # raised by on_event; the caller's to handle

    def __call__(self, message: dict[str, Any]) -> None:
        kind = message.get("event")
        if kind in self.streams:
            self._output(str(kind), message.get("text"))
        elif kind == "display" and isinstance(message.get("data"), dict):
            for mime, data in message["data"].items():
                self._display(mime, data)

    def _output(self, stream: str, text: Any) -> None:
        if not isinstance(text, str) or not text:
            return
        if len(text) > self.output_left:
            text, self.truncated = text[: self.output_left], True
        if text:
            self.output_left -= len(text)
            self.streams[stream].append(text)
            self._emit({"type": stream, "text": text})

    def _display(self, mime: Any, data: Any) -> None:
        if mime not in DISPLAY_MIMES or not isinstance(data, str):
            return
        if len(data) > self.display_left:
            self.truncated = True
            return
        self.display_left -= len(data)
        self.display.append({"mime": mime, "data": data})
        self._emit({"type": "display", "mime": mime, "data": data})

    def _emit(self, event: CellEvent) -> None:
        if self.on_event is None or self.failure is not None:
            return
        try:
            self.on_event(event)
        except Exception as exc:  # kept, and raised by the caller after the cell
            self.failure = exc

    def result(self, answer: dict[str, Any], duration_ms: float, timed_out: bool) -> CellResult:
        count = answer.get("execution_count")
        result = answer.get("result")
        return {
            "stdout": "".join(self.streams["stdout"]),
            "stderr": "".join(self.streams["stderr"]),
            "result": result if isinstance(result, str) else None,
            "display": self.display,
            "error": cell_error(answer.get("error")),
            "execution_count": count if isinstance(count, int) else 0,
            "duration_ms": round(duration_ms, 1),
            "timed_out": timed_out,
            "interrupted": timed_out or answer.get("interrupted") is True,
            "truncated": self.truncated or answer.get("truncated") is True,
        }


def cell_error(error: Any) -> dict[str, Any] | None:
    if not isinstance(error, dict):
        return None
    traceback = error.get("traceback")
    lines = traceback if isinstance(traceback, list) else []
    return {
        "ename": str(error.get("ename", "Error")),
        "evalue": str(error.get("evalue", "")),
        "traceback": [str(line) for line in lines],
    }
