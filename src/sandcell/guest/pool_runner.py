"""The pool runner: a job's interpreter, started before the job exists (stdlib only).

A warm pool (sandcell.runtime.pool) boots a sandbox whose program is this runner:

    /usr/bin/python3.11 -c "import sys; sys.path.insert(0, '/opt'); ..." MODULE...

with this directory mounted read-only at /opt/sandcell. It imports the image's heavy modules
(the MODULE arguments, e.g. pandas), says so on stdout with one line

    \\x1esandcell-warm {"failed": [...]}\\n

and blocks reading one line from stdin: the job, {"argv": [...], "env": {...}, "cwd": str},
and for a small job "source": the code. By then the host has put the code at /job/main.py
and the inputs under /input; a source in the line spares opening that file (under gVisor, a
walk and an open through the gofer). The runner turns itself into what `python /job/main.py`
would have been (environment, cwd, argv, sys.path, stdin at EOF), prints the ready line the
runtime times the job from, and runs the code as `__main__` in this same process. When the
code is done, the runner ends as python's exit would, then prints one last line on each of
stdout and stderr,

    \x1esandcell-exit STATUS\n

so the host can report the job's end without waiting for gVisor to tear the sandbox down, and
exits once the host closes its stdin (after the report). The sandbox is destroyed after this
one job.

Before the job, stdout and stderr go to /dev/null: nothing the imports say becomes the job's.
"""

import atexit
import contextlib
import gc
import importlib
import importlib.machinery
import io
import json
import os
import sys
from typing import Any, NoReturn

from . import memory_fonts
from .as_script import MAIN, READY_MARKER, run_main

WARM_MARKER = b"\x1esandcell-warm "
EXIT_MARKER = b"\x1esandcell-exit %d\n"
MAX_JOB_LINE = 1 << 20
RUNNER_PID = os.getpid()  # the runner itself; a process the job forks is another
RUNNER_MODULES = ("sandcell", "sandcell.pool_runner", "sandcell.memory_fonts", "sandcell.as_script")


def preload(modules: list[str]) -> list[str]:
    """Import `modules`; return the ones that failed (the pool reports them, jobs go on)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # a broken import is the image's problem, not the job's
            failed.append(name)
    return failed


def warm_up() -> None:
    """Do once what a data job's first chart does (parse a CSV, group, plot, save a PNG): fonts
    loaded, Agg and pandas' plotting set up. Nothing of it stays: the figure is closed."""
    pyplot, pandas = sys.modules.get("matplotlib.pyplot"), sys.modules.get("pandas")
    if pyplot is None or pandas is None:
        return
    try:
        frame = pandas.read_csv(io.StringIO("group,value\na,1\nb,2\na,3\n"))
        axes = frame.groupby("group")["value"].mean().plot(kind="bar", title="warm")
        axes.figure.savefig(io.BytesIO(), format="png")
    except Exception:  # a warm-up that fails only means the job pays for it
        pass
    finally:
        pyplot.close("all")


def read_job(fd: int) -> dict[str, Any] | None:
    """One JSON line from `fd`; None if the host closed it first (the pool shrank)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk or len(data) > MAX_JOB_LINE:
            return None
        data += chunk
    job = json.loads(data)
    return job if isinstance(job, dict) else None


def become(job: dict[str, Any], base_path: list[str]) -> None:
    """What `python /job/main.py` with the job's environment would have started as."""
    env = {str(k): str(v) for k, v in job["env"].items()}
    os.environ.clear()
    os.environ.update(env)
    cwd = str(job.get("cwd", "/workspace"))
    if os.getcwd() != cwd:  # the runner starts there: a chdir is a walk through the gofer
        os.chdir(cwd)
    sys.argv = [str(arg) for arg in job["argv"][1:]]
    sys.orig_argv[1:] = sys.argv  # as as_script.start has it: the job's, not the runner's
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(MAIN), *extra, *base_path]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    if env.get("PYTHONUNBUFFERED"):
        unbuffer_std()
    for name in RUNNER_MODULES:  # `import sandcell` must fail as it does in a cold sandbox
        sys.modules.pop(name, None)


def unbuffer_std() -> None:
    """sys.stdout and sys.stderr as `python -u` makes them: no buffer in either layer, so what
    the job prints is in the pipe at once, in order with what its children write there. (A
    text layer written through to a buffered one would still hold 8 KB back.)"""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        old.flush()
        raw = io.FileIO(fd, "wb", closefd=False)
        raw.name = f"<{name}>"  # as python names its own
        stream = io.TextIOWrapper(raw, old.encoding, old.errors, "\n", write_through=True)
        stream.mode = "w"  # type: ignore[misc]
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def job_source(job: dict[str, Any]) -> bytes | None:
    """The code's bytes, if the job line carries them (else run_main reads /job/main.py)."""
    source = job.get("source")
    return source.encode("utf-8", "surrogateescape") if isinstance(source, str) else None


def exit_status(exc: SystemExit) -> int:
    """The process status python gives a SystemExit (a non-int code is printed, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def finish(status: int, job_modules: list[str], host: int) -> NoReturn:
    """End as python's own exit would, short of tearing the interpreter down.

    The sandbox is destroyed right after, so tearing down pandas and matplotlib (about 0.1 s)
    would only delay the job's end. What a program can observe still happens: non-daemon
    threads are joined, atexit handlers run, the standard streams are flushed (a failed flush
    is python's status 120), and the job's own modules are freed as python frees them, so a
    file left open in a global is flushed and closed and a `__del__` runs.
    """
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()
    status = flush_std(status)
    flush_open_files()
    for name in job_modules:
        sys.modules.pop(name, None)
    gc.collect()  # frees them as python's exit does, `__del__` and all
    status = flush_std(status)
    if os.getpid() != RUNNER_PID:  # a child the job forked ends here: not the job's end
        os._exit(status)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.write(fd, EXIT_MARKER % status)
    # Wait until the host has taken the result (it closes our stdin): gVisor's teardown, which
    # our exit starts, would only compete for the CPU with the host's reporting of the job.
    with contextlib.suppress(OSError):
        while os.read(host, 4096):
            pass
    os._exit(status)


def flush_open_files() -> None:
    """Flush what the job left open. Python's exit flushes a file freed with its module, but
    one freed by the collector may lose its text layer's buffer; flushing first loses none.
    The runner's own objects are frozen (gc.freeze), so only the job's are looked at."""
    objects = gc.get_objects()
    for layer in (io.TextIOBase, io.BufferedIOBase):
        for obj in objects:
            if isinstance(obj, layer):
                with contextlib.suppress(Exception):
                    if not obj.closed:
                        obj.flush()


def flush_std(status: int) -> int:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            status = status or 120
    return status


def main() -> None:
    base_path = [p for p in sys.path if p and not p.startswith("/opt")]
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    failed = preload(sys.argv[1:])
    memory_fonts.install()  # before the warm-up, which loads the fonts a chart needs
    warm_up()
    gc.freeze()  # what the runner imported is never garbage: the job's collections skip it
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()  # whatever the imports printed goes to /dev/null, not to the job
    for fd, original in zip((1, 2), saved, strict=True):
        os.dup2(original, fd)
        os.close(original)
    os.write(1, WARM_MARKER + json.dumps({"failed": failed}).encode() + b"\n")
    job = read_job(0)
    if job is None:
        os._exit(0)
    host = os.dup(0)  # kept (not inherited) until the host lets the sandbox go; see finish
    os.dup2(devnull, 0)  # the job's stdin is at EOF, as in a cold sandbox
    os.close(devnull)
    become(job, base_path)
    before = set(sys.modules)
    os.write(1, READY_MARKER)
    status = 0
    try:
        run_main(job_source(job))
    except SystemExit as exc:
        status = exit_status(exc)
    finish(status, ["__main__", *(name for name in sys.modules if name not in before)], host)
