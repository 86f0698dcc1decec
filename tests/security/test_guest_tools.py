"""The image's own tools work under either runtime (the isolation suite's fixture, both runtimes).

Debian's runsc 20221219 answers EINVAL to statx with AT_NO_AUTOMOUNT, which is how coreutils'
`ls` and `stat` ask: the image preloads a statx that asks again without the flag
(runtime/statx_compat.c). On bwrap (the host's kernel) the first answer stands. `ps`, `free`,
`python3` and `python` are there, as in any peer's image, and multiprocessing's pools and
shared memory work (gVisor's own /dev/shm is root's alone: the bundle mounts one for all).
"""

import json

from tests.security.conftest import RunCode

TOOLS = """
import json, subprocess
from multiprocessing import Pool, shared_memory
def square(n):
    return n * n
def run(*args):
    done = subprocess.run(args, capture_output=True, text=True)
    return [done.returncode, done.stdout, done.stderr]
open('/workspace/made.txt', 'w').write('x')
print(json.dumps({
    "ls_root": run("ls", "/"),
    "ls_long": run("ls", "-la", "/workspace"),
    "stat": run("stat", "-c", "%U %a %s", "/workspace/made.txt"),
    "missing": run("ls", "/no/such/path"),
    "maps": open("/proc/self/maps").read().count("libstatx-compat.so") > 0,
    "ps": run("ps", "-e", "-o", "comm="),
    "free": run("free", "-m"),
    "python3": run("python3", "-c", "print(3)"),
    "python": run("python", "-c", "print(2)"),
}))
with Pool(2) as pool:
    squares = pool.map(square, range(4))
shared = shared_memory.SharedMemory(create=True, size=8)
shared.buf[:2] = b"ok"
print(json.dumps({"pool": squares, "shared": bytes(shared.buf[:2]).decode()}))
shared.close()
shared.unlink()
"""


def test_ls_stat_ps_free_python3_and_process_pools_work(run_code: RunCode) -> None:
    ran = run_code(TOOLS)
    assert ran.result.exit_code == 0, ran.sink.stderr
    tools, processes = ran.sink.stdout.splitlines()
    assert json.loads(processes) == {"pool": [0, 1, 4, 9], "shared": "ok"}
    seen = json.loads(tools)
    code, out, err = seen["ls_root"]
    assert (code, err) == (0, "") and {"usr", "workspace", "tmp"} <= set(out.split())
    code, out, err = seen["ls_long"]
    assert (code, err) == (0, "") and "made.txt" in out and "nobody" in out
    assert seen["stat"] == [0, "nobody 644 1\n", ""]
    code, out, err = seen["missing"]
    assert code == 2 and "No such file or directory" in err
    assert seen["maps"], "the image's statx library is not preloaded"
    code, out, err = seen["ps"]
    assert (code, err) == (0, "") and "python3.11" in out.split()
    code, out, err = seen["free"]
    assert (code, err) == (0, "") and out.split()[:3] == ["total", "used", "free"]
    assert (seen["python3"], seen["python"]) == ([0, "3\n", ""], [0, "2\n", ""])
