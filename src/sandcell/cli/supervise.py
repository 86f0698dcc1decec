"""The embedded worker of `sandcell serve`, kept running across an operator's drain or stop.

`sandcell serve` runs its worker as a child process. When an operator drains or stops that
worker (`POST /v1/admin/workers/{id}/drain`), the child finishes or hands back its jobs, marks
itself stopped and exits with STOPPED_ON_REQUEST; serve then starts a fresh incarnation (a new
worker id, the same data dir), which picks the handed-back jobs up from their committed stages.
Any other exit is a failure: serve stops too and exits non-zero, so that the failure is seen
(and a service manager restarts the whole tree, with its own back-off) instead of an API that
stays up and never becomes ready. Accepted jobs are in the store; the next worker recovers them.
"""

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("sandcell.serve")
STOPPED_ON_REQUEST = 75  # EX_TEMPFAIL: the worker stopped because it was asked to


class EmbeddedWorker:
    def __init__(self, data_dir: Path, on_failure: Callable[[], None]) -> None:
        self.data_dir, self.on_failure = data_dir, on_failure
        self._lock = threading.Lock()
        self._closing = False
        self.incarnations = 0
        self.failed_with: int | None = None  # the exit status of a worker that failed
        self.process = self._spawn()
        threading.Thread(target=self._watch, name="worker-supervisor", daemon=True).start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = os.environ | {"SANDCELL_DATA_DIR": str(self.data_dir)}
        self.incarnations += 1
        return subprocess.Popen([sys.executable, "-m", "sandcell.cli.main", "worker"], env=env)

    def _watch(self) -> None:
        while True:
            code = self.process.wait()
            with self._lock:
                if self._closing:
                    return
                if code != STOPPED_ON_REQUEST:
                    log.error("the worker exited with status %s; stopping the server", code)
                    self.failed_with = code
                    break
                log.warning("the worker stopped on an operator's request; starting a new one")
                self.process = self._spawn()
        self.on_failure()  # `failed_with` says how

    def close(self, timeout_s: float = 60) -> None:
        """Graceful stop of the current incarnation (SIGTERM), and no new one after it."""
        with self._lock:
            self._closing = True
            process = self.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=timeout_s)
