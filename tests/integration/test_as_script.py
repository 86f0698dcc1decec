"""A job's code runs exactly as `python /job/main.py` would, under gVisor.

The gVisor runtime starts a job's code with the guest's `as_script` bootstrap (python -c, one
exec fewer than the shell wrapper; bwrap keeps the wrapper, see bundle.program). Each program
here runs twice: that way, and as a real `python /job/main.py` (through `env`, which makes the
runtime use the shell wrapper); what it prints, on both streams, and its exit status must be
the same.
"""

import ast

import pytest

from tests.integration.conftest import GUEST_ENV, Ran, RunCode

pytestmark = pytest.mark.gvisor

JOB_ENV = GUEST_ENV  # with HOME, as every job has it (without, the shell wrapper runs)

SELF = '''"""The module's docstring."""
import os, pickle, sys
import __main__

class Point:
    pass

print(sys.argv, sys.orig_argv, sys.executable)
print(sys.path[0], sys.path == [p for p in sys.path if p], os.getcwd())
print(__name__, __file__, __doc__, __spec__, __cached__, __package__)
print(type(__loader__).__name__, __loader__.name, __loader__.path)
print(sorted(globals()))
print(__main__.__dict__ is globals(), sys.modules["__main__"] is __main__)
print(type(pickle.loads(pickle.dumps(Point()))) is Point)
print(sorted(os.environ), sys.stdin.read() == "")
print(sorted(open("/proc/self/environ").read().split("\\0")))
print("sandcell" in sys.modules, [m for m in sys.modules if "as_script" in m])
'''
PROGRAMS = {
    "itself": SELF,
    "traceback": "def f():\n    raise ValueError('boom')\n\nprint('before')\nf()\n",
    "syntax_error": "print('never'\nx = 1\n",
    "exit_message": "import sys\nsys.exit('a message')\n",
    "exit_status": "raise SystemExit(7)\n",
    "interrupt": "print('interrupted', flush=True)\nraise KeyboardInterrupt\n",
    "exit_handlers": (
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined'))).start()\n"
        "print('main done')\n"
    ),
}


def as_python_would(run_code: RunCode, code: str) -> Ran:
    argv = ["/usr/bin/env", "/usr/bin/python3.11", "/job/main.py"]
    ran = run_code(code, env=JOB_ENV, argv=argv)
    assert ready_first(ran), ran.result
    return ran


def ready_first(ran: Ran) -> bool:
    """The ready line came once, before anything the program wrote."""
    kinds = [kind for kind, _ in ran.sink.events]
    return kinds.count("ready") == 1 and kinds[0] == "ready"


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_a_jobs_code_runs_as_python_runs_a_script(run_code: RunCode, program: str) -> None:
    code = PROGRAMS[program]
    bootstrapped, real = run_code(code, env=JOB_ENV), as_python_would(run_code, code)
    assert ready_first(bootstrapped), bootstrapped.result
    assert bootstrapped.sink.stdout == real.sink.stdout
    assert bootstrapped.sink.stderr == real.sink.stderr
    assert bootstrapped.result.exit_code == real.result.exit_code
    assert bootstrapped.result.reason == real.result.reason


def test_the_job_sees_itself_as_a_script(run_code: RunCode) -> None:
    ran = run_code(SELF, env=JOB_ENV)
    lines = ran.sink.stdout.splitlines()
    assert lines[0].startswith("['/job/main.py'] ['/usr/bin/python3.11', '/job/main.py']")
    assert lines[1] == "/job True /workspace"
    assert lines[2] == "__main__ /job/main.py The module's docstring. None None None"
    assert lines[3] == "SourceFileLoader __main__ /job/main.py"
    assert lines[5:7] == ["True True", "True"]
    assert lines[7] == f"{sorted(JOB_ENV)} True"
    started_with = sorted(filter(None, ast.literal_eval(lines[8])))  # nothing added by runsc
    assert started_with == sorted(f"{key}={value}" for key, value in JOB_ENV.items())
    assert lines[9] == "False []"  # nothing of the bootstrap is importable or left loaded


def test_a_traceback_starts_at_the_jobs_own_frame(run_code: RunCode) -> None:
    ran = run_code(PROGRAMS["traceback"], env=JOB_ENV)
    assert ran.sink.stderr.startswith(
        'Traceback (most recent call last):\n  File "/job/main.py", line 5, in <module>\n'
    )
    assert ran.sink.stderr.endswith("ValueError: boom\n") and ran.result.exit_code == 1


def test_a_jobs_code_starts_under_the_bootstrap_not_a_shell(run_code: RunCode) -> None:
    code = (
        "argv = open('/proc/self/cmdline').read().split('\\0')\n"
        "print(argv[:2], open('/proc/1/comm').read().strip())\n"
    )
    ran = run_code(code, env=JOB_ENV)
    assert ran.sink.stdout == "['/usr/bin/python3.11', '-c'] python3.11\n"
