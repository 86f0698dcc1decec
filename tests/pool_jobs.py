"""Jobs that every warm pool's tests hand to a pooled sandbox, whatever isolates it (gVisor in
tests/integration/test_warm_pool.py, bwrap in tests/security/test_bwrap_pool.py)."""

import time

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.runtime import SandboxSpec
from tests.integration.conftest import GUEST_ENV

# What a job sees of itself: run from the pool it must print what a cold `python
# /job/main.py` would (see `like_cold_stdout`), and only its own stderr. GUEST_ENV sets
# PYTHONUNBUFFERED: a print is in the pipe before what the job writes to fd 1 next.
LIKE_COLD = (
    "import os, sys\n"
    "print(sys.argv, sys.orig_argv[1:], os.getcwd(), sorted(os.environ), sys.path[0])\n"
    "print(__name__, __file__)\n"
    "print('to stderr', file=sys.stderr)\n"
    "print('printed,', end=' '); os.write(1, b'then written\\n')\n"
    "print(sys.stdin.read() == '', os.getuid())\n"
    "raise SystemExit(3)\n"
)
# One job leaves files, environment and module state behind; the next looks for them.
LEAVE_BEHIND = (
    "import os, json, builtins\n"
    "for d in ('/workspace', '/tmp', '/output'):\n"
    "    open(d + '/left-behind', 'w').write('secret')\n"
    "os.environ['LEFT_BEHIND'] = '1'; json.LEFT_BEHIND = 1; builtins.LEFT_BEHIND = 1\n"
    "print('written')\n"
)
LOOK_FOR_LEFTOVERS = (
    "import os, json, builtins\n"
    "print([os.path.exists(d + '/left-behind') for d in ('/workspace', '/tmp', '/output')],\n"
    "      'LEFT_BEHIND' in os.environ, hasattr(json, 'LEFT_BEHIND'),\n"
    "      hasattr(builtins, 'LEFT_BEHIND'))\n"
)
NOTHING_LEFT = "[False, False, False] False False False\n"
# (code, limits, reason): each trips its limit in a pooled run as in a cold one.
LIMIT_CASES = [
    ("import time; print('sleeping', flush=True); time.sleep(60)", {"timeout_s": 1}, "timeout"),
    ("x = bytearray(512 * 2**20); print('survived')", {"memory_mb": 64}, "memory"),
    ("print('x' * 100_000)", {"output_mb": 0.01}, "output_limit"),
]


def like_cold_stdout() -> str:
    env = sorted(GUEST_ENV)
    first = f"['/job/main.py'] ['/job/main.py'] /workspace {env} /job\n__main__ /job/main.py\n"
    return f"{first}printed, then written\nTrue 65534\n"


def spec_for(image: Image, code: str, **limits: float) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=f"job-{time.monotonic_ns()}",
        image=image,
        argv=[image.python, "/job/main.py"],
        env=GUEST_ENV,
        limits=Limits(**limits),  # type: ignore[arg-type]
        code=code.encode(),
    )
