"""sandcell_guest: record a job's progress from inside its sandbox (stdlib only).

    import sandcell_guest
    if "clean" not in sandcell_guest.completed_stages():
        clean(); sandcell_guest.commit_stage("clean", files=["clean.csv"])
    with sandcell_guest.once("notify"):
        notify_someone()  # skipped on a retry that already did it

commit_stage stores the files (paths under /output) as artifacts and records the stage before
it returns. On a retry, committed files are back in /output and SANDCELL_COMPLETED_STAGES
lists the stages. once() records its key before the block runs, so the block never runs twice.
"""

import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SOCKET = "/run/sandcell/guest/guest.sock"
OUTPUT = "/output"
_committed: list[str] = []


class ChannelError(RuntimeError):
    """The worker refused the request, or the job has no guest channel."""


def _request(message: dict[str, Any], files: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    if not os.path.exists(SOCKET):
        raise ChannelError("this sandbox has no guest channel")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(SOCKET)
        # Refused part way (the artifact disk full): the answer it sent says why.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            _send(conn, message, files)
        try:
            answer: dict[str, Any] = json.loads(conn.makefile("rb").readline() or b"{}")
        except ConnectionResetError:
            answer = {}
    if not answer.get("ok"):
        raise ChannelError(answer.get("error", "the worker did not answer"))
    return answer


def _send(conn: socket.socket, message: dict[str, Any], files: list[str]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")
    for path in files:
        with open(path, "rb") as content:
            while chunk := content.read(1 << 20):
                conn.sendall(chunk)


def _relative(path: str) -> str:
    full = os.path.normpath(os.path.join(OUTPUT, path))
    if not full.startswith(OUTPUT + "/"):
        raise ValueError(f"{path!r} is not under {OUTPUT}")
    return full[len(OUTPUT) + 1 :]


def commit_stage(name: str, files: list[str] = ()) -> list[dict[str, Any]]:  # type: ignore[assignment]
    """Store `files` (relative to /output, or absolute under it) and record stage `name`."""
    relative = [_relative(path) for path in files]
    full = [os.path.join(OUTPUT, path) for path in relative]
    listing = [{"path": p, "size": os.path.getsize(f)} for p, f in zip(relative, full, strict=True)]
    answer = _request({"op": "commit_stage", "name": name, "files": listing}, full)
    _committed.append(name)
    return list(answer["files"])


def completed_stages() -> list[str]:
    """Stages committed by earlier attempts of this job, and by this one so far."""
    earlier = [s for s in os.environ.get("SANDCELL_COMPLETED_STAGES", "").split(",") if s]
    return earlier + [name for name in _committed if name not in earlier]


class _Skip(Exception):
    pass


@contextmanager
def once(key: str) -> Iterator[None]:
    """Run the block unless an earlier attempt of this job already ran it."""
    if _request({"op": "once", "key": key})["run"]:
        yield
        return
    # Skipping a with-block's body: trace the caller's frame and stop it at its first line.
    caller = sys._getframe(2)

    def stop(frame: FrameType, event: str, arg: Any) -> Any:
        raise _Skip

    sys.settrace(lambda *args: None)
    caller.f_trace = stop
    try:
        yield
    except _Skip:
        pass
    finally:
        sys.settrace(None)
