"""The runsc commands only sessions use, and where a pause puts its memory image."""

import shutil
import subprocess
from pathlib import Path

from sandcell.runtime.runsc import Runsc, RunscError

CHECKPOINT_DIR, CHECKPOINT_PARTIAL = "checkpoint", ".checkpoint.partial"
CHECKPOINT_FILE = "checkpoint.img"  # what runsc writes into --image-path
CHECKPOINT_TIMEOUT_S = 120  # a checkpoint compresses all of the guest's memory


class SessionRunsc(Runsc):
    """The runsc commands only sessions use: restore, checkpoint, and signals other than KILL."""

    def restore_argv(
        self, bundle: Path, sandbox_id: str, log: Path, image: Path, *, host_uds: bool
    ) -> list[str]:
        uds = ["--host-uds=open"] if host_uds else []
        restore = ["restore", f"--bundle={bundle}", f"--image-path={image}", sandbox_id]
        return [*self.flags(log), *uds, *restore]

    def checkpoint(self, sandbox_id: str, image: Path) -> None:
        argv = [*self.flags(), "checkpoint", f"--image-path={image}", sandbox_id]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=CHECKPOINT_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RunscError(f"runsc checkpoint: {exc}") from exc
        if done.returncode != 0:
            raise RunscError(f"runsc checkpoint: {_gist(done.stderr)}")

    def signal(self, sandbox_id: str, signal: str, *, everyone: bool = False) -> None:
        """`signal` to the container's first process (the kernel), or to all of them."""
        every = ["--all"] if everyone else []
        self._call(*self.flags()[1:], "kill", *every, sandbox_id, signal)


def _gist(stderr: str) -> str:
    """runsc's first line, without the object dump and Go stack a failed save prints."""
    first = (stderr.strip().splitlines() or ["no error text"])[0]
    # "...: encoding error at object tcp.endpoint{<kilobytes>}: endpoint still has waiters..."
    head, _, reason = first.rpartition("}: ")
    return f"{head[:100]}…: {reason[:300]}" if head else first[:400]


class Checkpointer:
    """A session's memory image: written under a temporary name, renamed once complete."""

    def __init__(self, state_dir: Path) -> None:
        self.partial, self.final = state_dir / CHECKPOINT_PARTIAL, state_dir / CHECKPOINT_DIR

    def take(self, runsc: SessionRunsc, sandbox_id: str) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)
        try:
            runsc.checkpoint(sandbox_id, self.partial)
        except RunscError:
            shutil.rmtree(self.partial, ignore_errors=True)
            raise
        # A crash between these two leaves no checkpoint: resume then starts afresh.
        shutil.rmtree(self.final, ignore_errors=True)
        self.partial.rename(self.final)
