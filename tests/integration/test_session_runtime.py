"""The gVisor session runtime against real runsc and the real `python-data` image.

Most cells share one live session (module scope); pause, resume and stop get their own. Every
session that ends is checked like a job's sandbox: no scratch, runsc state, cgroup, loop device
or host process of it is left.
"""

import base64
import itertools
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandcell.domain.errors import PreviewUnavailable, SessionUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.sessions import CellEvent, SessionSpec
from sandcell.runtime.scratch import attached_loops
from sandcell.runtime.session import GVisorSessionRuntime
from sandcell.runtime.session_runsc import CHECKPOINT_DIR
from sandcell.runtime.session_sandbox import GVisorSession
from sandcell.runtime.session_volume import VOLUME_NAME
from tests.integration.conftest import assert_released, host_processes_mentioning

pytestmark = pytest.mark.gvisor

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/workspace"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ids = itertools.count()
StartSession = Callable[..., GVisorSession]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GVisorSessionRuntime]:
    runtime = GVisorSessionRuntime(tmp_path_factory.mktemp("session-runtime"))
    runtime.check()
    yield runtime
    runtime.reap()
    runtime.close()


@pytest.fixture(scope="module")
def new_spec(
    python_data_image: Image, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., SessionSpec]:
    def spec(state_dir: Path | None = None, **limits: Any) -> SessionSpec:
        state = state_dir or tmp_path_factory.mktemp("session-state")
        sandbox_id = f"ts-{next(ids)}-{time.time_ns() % 10**6}"
        return SessionSpec(sandbox_id, python_data_image, ENV, Limits(**limits), state)

    return spec


@pytest.fixture(scope="module")
def session(runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec]) -> Iterator[Any]:
    live = runtime.start(new_spec())
    yield live
    assert live.stop()
    assert_session_released(runtime, live)


def assert_session_released(runtime: GVisorSessionRuntime, live: GVisorSession) -> None:
    assert_released(runtime.base, live.sandbox_id)
    volume = str(live.parts.spec.state_dir / VOLUME_NAME)
    assert volume not in attached_loops().values(), "the volume is still on a loop device"


def cell(live: GVisorSession, code: str, timeout_s: float = 30) -> dict[str, Any]:
    return live.execute(code, timeout_s)


def png_size(data: str) -> tuple[int, int]:
    raw = base64.b64decode(data)
    assert raw[:8] == PNG_SIGNATURE and raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


# --- cells ----------------------------------------------------------------------------------


def test_state_is_kept_across_cells(session: GVisorSession) -> None:
    first = cell(session, "x = 41")
    second = cell(session, "x + 1")
    assert first["result"] is None and first["error"] is None
    assert second["result"] == "42"
    assert second["execution_count"] == first["execution_count"] + 1


def test_a_figure_shown_or_left_open_comes_back_as_png(session: GVisorSession) -> None:
    shown = cell(session, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()")
    left_open = cell(session, "fig, ax = plt.subplots(figsize=(3, 2)); ax.bar([1, 2], [3, 4])")
    for result in (shown, left_open):
        pngs = [d["data"] for d in result["display"] if d["mime"] == "image/png"]
        assert len(pngs) == 1, result["display"]
        width, height = png_size(pngs[0])
        assert width > 100 and height > 50
    assert "BarContainer" in left_open["result"]


def test_a_dataframe_comes_back_as_html_and_plain_text(session: GVisorSession) -> None:
    result = cell(session, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    mimes = {d["mime"]: d["data"] for d in result["display"]}
    assert "<table" in mimes["text/html"] and "dataframe" in mimes["text/html"]
    assert mimes["text/plain"] == result["result"]
    assert result["result"].split() == ["a", "b", "0", "1", "x", "1", "2", "y"]


def test_ipython_syntax_semicolons_await_magics_and_escapes(session: GVisorSession) -> None:
    """IPython's own rules, which the shell skips tokenizing and compiling for when a cell has
    no `;`, no `await`/`async` or none of the escapes that its transforms look for."""
    assert cell(session, "6 * 7;")["result"] is None
    assert cell(session, "6 * 7  # ;")["result"] == "42"  # a `;` in a comment does not hide it
    assert cell(session, "n = 6; n * 7")["result"] == "42"
    awaited = cell(session, "import asyncio\nawait asyncio.sleep(0)\n'awaited'")
    assert awaited["error"] is None and awaited["result"] == "'awaited'"
    # Cells with `async` and no `await` that need the event loop (their awaits come from here).
    helpers = cell(
        session,
        "import contextlib\n"
        "async def numbers():\n    await asyncio.sleep(0)\n    yield 5\n"
        "@contextlib.asynccontextmanager\n"
        "async def paused():\n    await asyncio.sleep(0)\n    yield 'paused'\n",
    )
    assert helpers["error"] is None
    generated = cell(session, "[n async for n in numbers()]")
    assert generated["error"] is None and generated["result"] == "[5]"
    entered = cell(session, "async with paused() as word:\n    print(word)")
    assert entered["error"] is None and entered["stdout"] == "paused\n"
    long_cell = "\n".join(f"v{i} = {i}" for i in range(3000)) + "\nv2999"
    assert cell(session, long_cell)["result"] == "2999"
    assert cell(session, "%pwd")["result"] == "'/workspace'"
    assert cell(session, "'%d' % 5")["result"] == "'5'"
    listed = cell(session, "names = !ls /\n'usr' in names")
    assert listed["result"] == "True"
    assert cell(session, "!echo escaped")["stdout"].splitlines() == ["escaped"]  # a pty: \r\n
    assert cell(session, "/abs -3")["result"] == "3"  # autocall's `/`: abs(-3)


def test_json_display(session: GVisorSession) -> None:
    result = cell(session, "from IPython.display import JSON, display\ndisplay(JSON({'k': [1]}))")
    assert {"mime": "application/json", "data": '{"k": [1]}'} in result["display"]


def test_plain_results_are_text_unless_a_printer_or_method_renders_them(
    session: GVisorSession,
) -> None:
    def displays(result: dict[str, Any]) -> dict[str, str]:
        return {d["mime"]: d["data"] for d in result["display"]}

    plain = cell(session, "[1, 'a', {'k': 2.5}]")
    assert plain["result"] == "[1, 'a', {'k': 2.5}]" and plain["display"] == []
    by_type = cell(
        session,
        "formatters = get_ipython().display_formatter.formatters\n"
        "formatters['text/html'].for_type(int, lambda n: f'<b>{n}</b>')\n7",
    )
    assert by_type["result"] == "7" and displays(by_type)["text/html"] == "<b>7</b>"
    by_name = cell(
        session,
        "formatters['text/html'].pop(int)\n"
        "formatters['text/markdown'].for_type_by_name('builtins', 'str', lambda s: f'**{s}**')\n"
        "'hi'",
    )
    assert displays(by_name)["text/markdown"] == "**hi**"
    for_base = cell(
        session,
        "formatters['text/markdown'].pop('builtins.str')\n"
        "formatters['text/latex'].for_type(object, lambda o: '$x$')\n(1, 2)",
    )
    assert for_base["result"] == "(1, 2)" and displays(for_base)["text/latex"] == "$x$"
    subclass = cell(
        session,
        "formatters['text/latex'].pop(object)\n"
        "class Bold(int):\n    def _repr_html_(self):\n        return f'<b>{int(self)}</b>'\n"
        "Bold(3)",
    )
    assert displays(subclass)["text/html"] == "<b>3</b>"
    not_ipythons = cell(  # a formatter of the user's own making: only calling it tells
        session,
        "markdown = formatters['text/markdown']\n"
        "formatters['text/markdown'] = lambda obj: f'*{obj}*' if type(obj) is int else None\n5",
    )
    assert displays(not_ipythons)["text/markdown"] == "*5*"
    cell(session, "formatters['text/markdown'] = markdown")
    assert cell(session, "8")["display"] == []  # every registration above is gone again


def test_an_exception_gives_a_traceback_and_the_session_goes_on(session: GVisorSession) -> None:
    failed = cell(session, "def f():\n    return 1 / 0\nf()")
    error = failed["error"]
    assert (error["ename"], error["evalue"]) == ("ZeroDivisionError", "division by zero")
    text = "\n".join(error["traceback"])
    assert "return 1 / 0" in text and "\x1b" not in text
    assert failed["stdout"] == "" and not failed["interrupted"]
    assert cell(session, "2 * 21")["result"] == "42"
    syntax = cell(session, "def (:")
    assert syntax["error"]["ename"] == "SyntaxError"


def test_print_os_system_and_subprocess_output_are_captured(session: GVisorSession) -> None:
    events: list[CellEvent] = []
    code = (
        "import os, subprocess, sys\n"
        "print('from print')\n"
        "os.system('echo from os.system')\n"
        "subprocess.run(['echo', 'from a subprocess'])\n"
        "print('to stderr', file=sys.stderr)\n"
        'os.write(1, b\'{"id": "h1", "result": {}}\\n\')  # not a wire line: just output\n'
    )
    result = session.execute(code, 30, events.append)
    assert result["stdout"] == (
        'from print\nfrom os.system\nfrom a subprocess\n{"id": "h1", "result": {}}\n'
    )
    assert result["stderr"] == "to stderr\n"
    streamed = "".join(e["text"] for e in events if e["type"] == "stdout")
    assert streamed == result["stdout"]


def test_printed_text_keeps_its_place_around_children_and_displays(
    session: GVisorSession,
) -> None:
    events: list[CellEvent] = []
    code = (
        "import os, subprocess, sys\n"
        "from multiprocessing import Pool\n"
        "from IPython.display import HTML, display\n"
        "print('a')\n"
        "subprocess.run(['echo', 'b'])\n"
        "print('c', end='')\n"
        "os.system('echo !')\n"
        "sys.stdout.buffer.write(b'd\\n')\n"
        "if (pid := os.fork()) == 0:\n"
        "    print('e from a forked child')\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "with Pool(2) as pool:\n"
        "    print(pool.map(abs, [-1, -2]))\n"
        "print('f')\n"
        "display(HTML('<b>g</b>'))\n"
        "print('h')\n"
    )
    result = session.execute(code, 30, events.append)
    assert result["error"] is None, result["error"]
    assert result["stdout"] == "a\nb\nc!\nd\ne from a forked child\n[1, 2]\nf\nh\n"
    kinds = [e["type"] if e["type"] != "stdout" else e["text"] for e in events]
    shown = kinds.index("display")
    assert "".join(k for k in kinds[:shown] if k != "display").endswith("f\n")
    assert kinds[shown + 1 :] in (["h\n"], ["display", "h\n"])  # text/plain and text/html


def test_a_printing_loop_is_sent_in_batches_and_still_streams(session: GVisorSession) -> None:
    events: list[tuple[float, CellEvent]] = []
    loop = "for i in range(10_000):\n    print(i)\n"
    result = session.execute(loop, 60, lambda e: events.append((time.monotonic(), e)))
    assert result["stdout"] == "".join(f"{i}\n" for i in range(10_000))
    assert 1 <= len(events) <= 20  # not one event (nor two writes) per print
    events.clear()
    result = session.execute("import time\nprint('early')\ntime.sleep(1.5)\n'done'", 30,
                             lambda e: events.append((time.monotonic(), e)))  # fmt: skip
    ended = time.monotonic()
    assert result["result"] == "'done'" and result["stdout"] == "early\n"
    [(at, early)] = events
    assert early["text"] == "early\n" and ended - at > 1.0  # shown while the cell still ran


def test_stdin_is_not_the_wire(session: GVisorSession) -> None:
    assert cell(session, "input()")["error"]["ename"] in ("EOFError", "StdinNotImplementedError")
    assert cell(session, "import sys; sys.stdin.read()")["result"] == "''"


def test_interrupt_stops_a_busy_loop_and_the_next_cell_runs(session: GVisorSession) -> None:
    answers: list[dict[str, Any]] = []
    runner = threading.Thread(target=lambda: answers.append(cell(session, "while True: pass")))
    runner.start()
    time.sleep(0.5)
    interrupted_at = time.monotonic()
    session.interrupt()
    runner.join(5)
    assert answers, "the cell did not stop"
    assert time.monotonic() - interrupted_at < 2.0
    assert answers[0]["interrupted"] and not answers[0]["timed_out"]
    assert answers[0]["error"]["ename"] == "KeyboardInterrupt"
    assert cell(session, "x")["result"] == "41"


def test_an_execute_timeout_interrupts_the_cell(session: GVisorSession) -> None:
    started = time.monotonic()
    result = cell(session, "import time\nwhile True: time.sleep(0.01)", timeout_s=1.0)
    assert 1.0 <= time.monotonic() - started < 3.0
    assert result["timed_out"] and result["interrupted"]
    assert cell(session, "x + 1")["result"] == "42"


def test_a_timeout_also_stops_a_child_the_kernel_waits_for(session: GVisorSession) -> None:
    # os.system ignores SIGINT in the kernel while it waits: only signalling every process
    # (the second step of the interrupt schedule) ends the child.
    started = time.monotonic()
    result = cell(session, "import os\nos.system('sleep 60')\n'after'", timeout_s=1.0)
    assert time.monotonic() - started < 6.0
    assert result["timed_out"]
    assert cell(session, "x + 1")["result"] == "42"


def test_memory_is_read_from_the_cgroup(session: GVisorSession) -> None:
    used = session.memory_bytes()
    assert 20 << 20 < used < (512 + 64) << 20


def test_the_preview_relay_reaches_a_server_in_the_session(session: GVisorSession) -> None:
    cell(
        session,
        "import subprocess, sys, pathlib\n"
        "pathlib.Path('/workspace/hello.txt').write_text('hello from the sandbox')\n"
        "server = subprocess.Popen([sys.executable, '-m', 'http.server', '8765'],"
        " cwd='/workspace', stderr=subprocess.DEVNULL)",
    )
    status, headers, body = _get_when_up(session, 8765, "/hello.txt")
    assert (status, body) == (200, b"hello from the sandbox")
    assert ("content-type", "text/plain") in headers
    # While a cell runs: the relay has a thread of its own.
    busy = threading.Thread(target=lambda: cell(session, "import time; time.sleep(2)"))
    busy.start()
    time.sleep(0.3)
    assert session.http(8765, "GET", "/hello.txt", [("X-Any", "1")], b"")[0] == 200
    busy.join()
    with pytest.raises(PreviewUnavailable):
        session.http(8766, "GET", "/", [], b"")
    cell(session, "server.kill(); server.wait()")


def _get_when_up(
    session: GVisorSession, port: int, path: str
) -> tuple[int, list[tuple[str, str]], bytes]:
    deadline = time.monotonic() + 10
    while True:
        try:
            return session.http(port, "GET", path, [], b"")
        except PreviewUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# --- pause, resume, stop --------------------------------------------------------------------


def test_pause_and_resume_keep_memory_and_workspace(
    runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec], tmp_path: Path
) -> None:
    first = runtime.start(new_spec(tmp_path))
    cell(first, "import pandas as pd\nx = 41\nopen('/workspace/kept.txt', 'w').write('kept')")
    assert first.pause() is True
    assert (tmp_path / CHECKPOINT_DIR).is_dir()
    assert_session_released(runtime, first)
    # A new runtime object over the same dirs: what a restarted server has.
    restarted = GVisorSessionRuntime(runtime.base.state_dir)
    second = restarted.resume(new_spec(tmp_path))
    try:
        assert second.memory_restored is True
        assert cell(second, "x + 1")["result"] == "42"
        assert cell(second, "pd.__name__")["result"] == "'pandas'"
        assert (second.workspace / "kept.txt").read_text() == "kept"
        assert not (tmp_path / CHECKPOINT_DIR).exists(), "a used checkpoint is stale"
    finally:
        assert second.stop()
    assert_session_released(runtime, second)


def test_resume_without_a_checkpoint_starts_afresh_over_the_workspace(
    runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec], tmp_path: Path
) -> None:
    first = runtime.start(new_spec(tmp_path))
    cell(first, "x = 1\nopen('/workspace/kept.txt', 'w').write('still here')")
    assert first.stop()
    second = runtime.resume(new_spec(tmp_path))
    try:
        assert second.memory_restored is False
        assert cell(second, "x")["error"]["ename"] == "NameError"
        assert cell(second, "open('kept.txt').read()")["result"] == "'still here'"
    finally:
        assert second.stop()
    assert_session_released(runtime, second)


def test_a_pause_that_cannot_checkpoint_keeps_the_workspace(
    runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec], tmp_path: Path
) -> None:
    # runsc 20221219 refuses to save a TCP endpoint that an epoll set waits on ("endpoint
    # still has waiters upon save"): asyncio servers and the egress bridge do exactly that.
    first = runtime.start(new_spec(tmp_path))
    cell(
        first,
        "import select, socket\nx = 41\nopen('/workspace/kept.txt', 'w').write('kept')\n"
        "listener = socket.create_server(('127.0.0.1', 8123))\n"
        "waiter = select.epoll(); waiter.register(listener.fileno(), select.EPOLLIN)",
    )
    kept = first.pause()
    assert_session_released(runtime, first)
    second = runtime.resume(new_spec(tmp_path))
    try:
        assert second.memory_restored is kept  # on a runsc that can save it, memory comes back
        expected = "42" if kept else None
        assert cell(second, "x + 1")["result"] == expected
        assert cell(second, "open('kept.txt').read()")["result"] == "'kept'"
    finally:
        assert second.stop()
    assert_session_released(runtime, second)


def test_stop_leaves_no_process_even_after_setsid_and_double_fork(
    runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec]
) -> None:
    live = runtime.start(new_spec())
    cell(live, "import os\nos.system('setsid sh -c \"sleep 600 &\" &')\n")
    assert live.stop() is True
    assert host_processes_mentioning(live.sandbox_id) == []
    assert_session_released(runtime, live)
    with pytest.raises(SessionUnavailable):
        live.execute("1", 5)


def test_output_is_capped_and_a_kernel_that_exits_ends_the_session(
    runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec]
) -> None:
    live = runtime.start(new_spec(output_mb=0.01))
    flood = cell(live, "for _ in range(1000): print('x' * 99)")
    assert flood["truncated"] and flood["stdout"].endswith("[output truncated]\n")
    assert len(flood["stdout"]) <= 0.01 * 1024 * 1024 + 4096
    assert cell(live, "print('next cell')")["stdout"] == "next cell\n"
    with pytest.raises(SessionUnavailable, match="exited"):
        live.execute("import os; os._exit(3)", 10)
    assert live.stop()
    assert_session_released(runtime, live)


def test_a_cell_that_closes_stdout_and_stderr_leaves_the_kernel_idle(
    runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec]
) -> None:
    live = runtime.start(new_spec())
    cell(live, "import os, resource, time\nos.close(1)\nos.close(2)")
    measured = (
        "t = resource.getrusage(resource.RUSAGE_SELF)\n"
        "time.sleep(1)\n"
        "u = resource.getrusage(resource.RUSAGE_SELF)\n"
        "(u.ru_utime + u.ru_stime) - (t.ru_utime + t.ru_stime)"
    )
    # The output pumps see end of file on their pipes; spinning on it took a whole core.
    assert float(cell(live, measured)["result"]) < 0.3
    assert cell(live, "2 * 21")["result"] == "42"
    assert live.stop()


def test_reap_after_a_crash_removes_sandboxes_and_keeps_volumes(
    runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec], tmp_path: Path
) -> None:
    crashed_runtime = GVisorSessionRuntime(tmp_path / "crashed")
    live = crashed_runtime.start(new_spec(tmp_path / "state"))
    cell(live, "open('/workspace/kept.txt', 'w').write('kept')")
    assert live.proc is not None and live.channel is not None
    live.proc.kill()  # `runsc run` dies, the sandbox lives on, nothing of it is released
    live.proc.wait()
    assert (crashed_runtime.base.sandboxes_dir / live.sandbox_id).exists()
    restarted = GVisorSessionRuntime(tmp_path / "crashed")
    assert any(live.sandbox_id in item for item in restarted.reap())
    # The old object is still alive in this test (not in a real crash): let it notice first.
    assert live.channel.closed.wait(10) and live.release() == []
    assert_session_released(restarted, live)
    again = restarted.resume(new_spec(tmp_path / "state"))
    try:
        assert cell(again, "open('kept.txt').read()")["result"] == "'kept'"
    finally:
        assert again.stop()
        restarted.reap()
        restarted.close()  # the parent cgroup `resume` made again, and the run directory


def test_running_out_of_memory_ends_the_session_with_a_reason(
    runtime: GVisorSessionRuntime, new_spec: Callable[..., SessionSpec]
) -> None:
    live = runtime.start(new_spec(memory_mb=128))
    with pytest.raises(SessionUnavailable, match="out of memory"):
        live.execute("blocks = [bytearray(32 << 20) for _ in range(64)]", 30)
    assert live.stop()
    assert_session_released(runtime, live)
