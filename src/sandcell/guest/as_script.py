"""/job/main.py run as `python /job/main.py` runs it, in this same process (stdlib only).

Two callers. The pool runner, once a warm sandbox has become the job's process. And a cold
job's first process: the runtime starts it as

    /usr/bin/python3.11 -c "<this file's source>\nstart()" /job/main.py

(runtime/bundle.py). `start` prints the ready line the runtime times the job from, then turns
itself into `python /job/main.py`. Under gVisor that saves the exec of a shell wrapper, a new
address space: ~17 ms of a job's wall time; and passed as source, nothing is opened through
the sandbox's filesystem before the job's own file.

Only modules the interpreter has loaded at startup are imported at the top: anything more is
a file to find and read before the job starts.
"""

import builtins
import os
import sys
from _frozen_importlib_external import SourceFileLoader  # importlib.machinery's, preloaded

MAIN = "/job/main.py"
READY_MARKER = b"\x1esandcell-ready\n"  # the same line the bundle's shell wrapper prints


def start() -> None:
    """Become `python /job/main.py` from `python -c SOURCE /job/main.py` (argv and sys.path[0]
    as a script's), print the ready line, and run the job."""
    sys.argv = sys.argv[1:]
    sys.orig_argv[1:] = sys.argv
    if sys.path and sys.path[0] == "":  # `-c` puts the cwd first; a script, its directory
        sys.path[0] = os.path.dirname(MAIN)
    os.write(1, READY_MARKER)
    run_main()


def run_main(source: bytes | None = None) -> None:
    """Run /job/main.py as `__main__`; an uncaught exception ends it as python's own would.
    `source`: the file's bytes, when the caller has them already (the pool runner's job line)."""
    main = type(sys)("__main__")
    main.__dict__.update(
        __annotations__={},  # python's own __main__ starts with one
        __file__=MAIN,
        __builtins__=builtins,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", MAIN),
    )
    sys.modules["__main__"] = main
    try:
        if source is None:
            with open(MAIN, "rb") as file:
                source = file.read()
        code = compile(source, MAIN, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        report(exc)


def report(exc: BaseException) -> None:
    """Print the traceback from the job's first frame on, and exit like python does."""
    import contextlib
    import signal

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != MAIN:
        tb = tb.tb_next  # a SyntaxError has no frame of the job's: python shows none either
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # 3.11 prints exc's own traceback
    if isinstance(exc, KeyboardInterrupt):
        with contextlib.suppress(OSError):
            sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(1)
