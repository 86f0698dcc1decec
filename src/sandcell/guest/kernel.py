"""The session kernel: one IPython shell inside the sandbox, driven over JSON lines.

The session runtime starts it as PID 1 of the sandbox (see sandcell.runtime.session):

    /usr/bin/python3.11 -I -u -c "import sys; sys.path.insert(0, '/opt'); ..."

with this directory mounted read-only at /opt/sandcell. Only the stdlib and IPython are used:
shell.py points IPython's own machinery at the wire, wire.py moves the bytes, relay.py serves
preview requests. After `runsc restore`, the wire's fds are the restoring runsc's new pipes.

Wire protocol, one JSON object per line. Host → kernel, on the sandbox's stdin:

    {"id": str, "op": "execute", "code": str, "output_limit": int}
    {"id": str, "op": "http", "port": int, "request": base64, "timeout_s": float,
     "max_bytes": int}
    {"id": str, "op": "ping"}                    {"id": str, "op": "shutdown"}
    {"id": str, "op": "preload", "modules": [str]}      a session pool's kernel, before its
    {"id": str, "op": "environ", "set": {str: str}}     session: imports, then the session's env

Kernel → host, on the sandbox's original stdout (moved to a private fd):

    {"event": "ready", "pid": int, "python": str, "ipython": str}      once, at start
    {"id", "event": "stdout" | "stderr", "text": str}                   while its cell runs
    {"id", "event": "display", "data": {mime: str}}                     rich output (base64
                                                                        for binary mimes)
    {"id", "result": {...}}                                             last, once per request

An execute's result is {"result": text/plain of the last expression or null, "error":
{"ename", "evalue", "traceback": [str]} or null, "execution_count", "interrupted",
"truncated"}. Cells run one at a time on the main thread; ping and http are answered by other
threads, so they work while a cell runs.

Interrupt: SIGINT to this process raises KeyboardInterrupt in the running cell. Between cells it
is ignored, so an interrupt that arrives late can never hit the kernel's own bookkeeping.
"""

import contextlib
import importlib
import os
import queue
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from . import batched_output, memory_fonts
from .relay import relay
from .wire import Channel, Message, OutputPump, capture

if TYPE_CHECKING:
    from .shell import SessionShell

DEFAULT_OUTPUT_LIMIT = 10 << 20  # characters of stdout+stderr per cell
OUTPUTS = (("stdout", 1), ("stderr", 2))
DRAIN_S = 2.0  # how long a cell's end waits for output still in the pipes
# Figures go through IPython's display machinery (shown, or left open at the end of a cell).
# Set in the environment so that it costs nothing until the user imports matplotlib.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
# HOME is not writable for uid 65534: caches go to the sandbox's /tmp (in its memory).
ENV_DEFAULTS = {"MPLCONFIGDIR": "/tmp/.matplotlib", "IPYTHONDIR": "/tmp/.ipython"}


class Kernel:
    def __init__(self, channel: Channel, shell: "SessionShell") -> None:
        self.channel, self.shell = channel, shell
        self.cells: queue.Queue[Message | None] = queue.Queue()
        self.pumps: list[OutputPump] = []
        self.std: list[batched_output.BatchedStream] = []  # ours, even if the user swaps them
        self.in_cell = False
        self.fonts_in_memory = False  # see memory_fonts.py: charts lay out text far faster

    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.in_cell:
            raise KeyboardInterrupt

    def on_output(self, stream: str, text: str) -> None:
        cell = self.shell.current
        if cell is not None:  # output between cells (a background server's log) is dropped
            cell.output(stream, text)

    def read_requests(self) -> None:
        for request in self.channel.requests():
            self.dispatch(request)
        os._exit(0)  # the host closed the wire: the session is over

    def dispatch(self, request: Message) -> None:
        op, request_id = request.get("op"), request.get("id")
        if op in ("execute", "shutdown", "preload", "environ"):
            self.cells.put(request)  # on the main thread, between cells
        elif op == "ping":
            self.reply(request_id, {"pong": True, "busy": self.shell.current is not None})
        elif op == "http":
            answer = lambda: self.reply(request_id, relay(request))  # noqa: E731
            threading.Thread(target=answer, name="relay", daemon=True).start()
        else:
            self.reply(request_id, {"error": f"unknown op {op!r}"})

    def reply(self, request_id: Any, result: dict[str, Any]) -> None:
        self.channel.send({"id": request_id, "result": result})

    def answer(self, request_id: Any, result: dict[str, Any]) -> None:
        """A reply from the main thread between cells, where SIGINT is ignored."""
        self.channel.send_idle({"id": request_id, "result": result})

    def serve(self) -> None:
        while (request := self.cells.get()) is not None:
            op = request.get("op")
            if op == "shutdown":
                self.answer(request.get("id"), {"bye": True})
                return
            handler = {"preload": self.preload, "environ": self.environ}.get(str(op))
            self.answer(request.get("id"), (handler or self.execute)(request))

    def preload(self, request: Message) -> dict[str, Any]:
        """Import modules ahead of any cell: into sys.modules, not the user's namespace."""
        failed = []
        for name in request.get("modules") or []:
            try:
                importlib.import_module(str(name))
            except Exception:
                failed.append(str(name))
        # IPython's first cell pays for its own lazy set-up (~10 ms): paid here, unseen (no
        # current cell takes its output) and uncounted (no history, no execution count).
        self.shell.run_cell("None", store_history=False)
        # And the first result its display formatter renders (~5 ms more): rendered here
        # directly, so nothing reaches the displayhook (`_`, `_1`, `Out`).
        self.shell.display_formatter.format(0)
        self.fonts_in_memory = memory_fonts.install()
        return {"failed": failed}

    def environ(self, request: Message) -> dict[str, Any]:
        """The environment of the session this pooled kernel now serves (its children's too)."""
        values = request.get("set") or {}
        os.environ.update({str(name): str(value) for name, value in values.items()})
        return {"set": sorted(values)}

    def execute(self, request: Message) -> dict[str, Any]:
        limit = request.get("output_limit")
        cell = self.shell.new_cell(str(request.get("id")), limit or DEFAULT_OUTPUT_LIMIT)
        try:
            count = self.run(str(request.get("code", "")))
        finally:
            self.settle_output()
            self.shell.current = None
        if not self.fonts_in_memory:  # the session's first cell may have imported matplotlib
            self.fonts_in_memory = memory_fonts.install()
        return {
            "result": cell.result,
            "error": cell.error,
            "execution_count": count,
            "interrupted": bool(cell.error and cell.error["ename"] == "KeyboardInterrupt"),
            "truncated": cell.truncated,
        }

    def run(self, code: str) -> int:
        """Run the cell; a KeyboardInterrupt anywhere in it becomes the cell's error."""
        count = int(self.shell.execution_count)
        try:
            self.in_cell = True
            try:
                self.shell.run_cell(code, store_history=True)
            finally:
                self.in_cell = False
        except KeyboardInterrupt:  # outside IPython's own handling (e.g. in a display hook)
            self.in_cell = False
            self.shell.showtraceback()
        return count

    def settle_output(self) -> None:
        """Everything the cell wrote reaches the host before its result (or display) does."""
        for stream in (sys.stdout, sys.stderr, *self.std):
            with contextlib.suppress(OSError, ValueError):  # the user closed or replaced it
                stream.flush()
        for pump in self.pumps:
            pump.drain(DRAIN_S)


def main() -> None:
    # The wire first: from here on, nothing but the channel writes to the host's stdout.
    wire_in, wire_out = os.dup(0), os.dup(1)  # dup'd fds are close-on-exec: children lack them
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # input() and children get EOF, never a protocol line
    os.close(devnull)
    channel = Channel(wire_in, wire_out)
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    sys.path.insert(0, "")  # like IPython's own apps: modules in the cwd (/workspace) import
    kernel = Kernel(channel, load_shell(channel))
    # Startup errors above still went to the original stderr (runsc's, kept by the host).
    kernel.pumps = [OutputPump(name, capture(fd), kernel.on_output) for name, fd in OUTPUTS]
    kernel.std = batched_output.install()
    kernel.shell.before_display = kernel.settle_output
    signal.signal(signal.SIGINT, kernel.on_sigint)
    threading.Thread(target=kernel.read_requests, name="wire-in", daemon=True).start()
    python, ipython = sys.version.split()[0], str(sys.modules["IPython"].__version__)
    channel.send({"event": "ready", "pid": os.getpid(), "python": python, "ipython": ipython})
    kernel.serve()
    channel.close()
    os._exit(0)


def load_shell(channel: Channel) -> "SessionShell":
    """Import IPython (hiding jedi from it) and make the shell."""
    # IPython imports jedi for tab completion, which this kernel never offers: hidden, it
    # saves ~8 MB and 100 modules per session. Unhidden afterwards, so user code may import it.
    hidden = "jedi" not in sys.modules
    if hidden:
        sys.modules["jedi"] = None  # type: ignore[assignment]
    try:
        shell = importlib.import_module(".shell", __package__)
    finally:
        if hidden:
            del sys.modules["jedi"]
    made: SessionShell = shell.make_shell(channel)
    return made
