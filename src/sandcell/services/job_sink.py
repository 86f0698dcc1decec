"""JobSink: where a running sandbox's output goes — log chunks and artifacts in the store.

A job's output files are stored as blobs as they are collected, but recorded as artifacts
only with the job's end (take_final: the worker writes them with the terminal record, and the
last log chunks, in one transaction): a collection that fails part way (the artifact disk
full) leaves no artifact of the job visible, and discard_outputs() removes the blobs nothing
else refers to.
"""

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable
from typing import BinaryIO, TypeVar

from sandcell.domain.errors import SandcellError, StorageFull, StoreUnavailable
from sandcell.domain.ids import new_id
from sandcell.domain.paths import safe_relative_path
from sandcell.domain.records import Artifact, Job
from sandcell.ports.artifacts import BlobStore
from sandcell.ports.notify import JOB_LOGS, Notifier
from sandcell.ports.runtime import SandboxResult
from sandcell.ports.store import Store
from sandcell.services.later import LATER, Call
from sandcell.services.patience import patiently

log = logging.getLogger("sandcell.worker")
LOG_FLUSH_BYTES = 64 * 1024
LOG_FLUSH_S = 0.2
# The start (started_at, sandbox) is written this long after the ready line, or with the
# first log chunk if that comes sooner (a record whose logs show output says where it runs): a
# job that ends sooner has it written with its end, one store write fewer. A cold gVisor job's
# interpreter starts after its ready line, so a short one runs 0.05-0.2 s past it.
STARTED_WRITE_S = 0.25
T = TypeVar("T")


class JobSink:
    """Receives a sandbox's output and turns it into log chunks and artifacts."""

    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        job: Job,
        token: int,
        sandbox_id: str,
        *,
        patience_s: float = 0.0,
        notifier: Notifier | None = None,
    ) -> None:
        self.store, self.blobs, self.job, self.token = store, blobs, job, token
        self.notifier = notifier  # wakes log followers (SSE) when chunks are stored
        self.sandbox_id = sandbox_id  # the spec's, until a pooled runtime says `placed`
        # How long a write may wait out a store outage; the sandbox's pipes just fill meanwhile.
        # A repeat after a lost answer can at worst duplicate a log chunk or an artifact row.
        self.patience_s = patience_s
        self.started_at: float | None = None
        self._started_timer: Call | None = None
        self._start_written = False
        self._started_lock = threading.Lock()  # the start's write against `settle`
        self._settled = False
        # Who settles the job on an early result; None: the runtime's return settles it.
        self.on_ended: Callable[[SandboxResult], None] | None = None
        self.skipped_outputs = 0
        self._staged_files: set[tuple[str, str]] | None = None
        self._outputs: list[Artifact] = []  # stored, not yet recorded (take_final)
        # Set when the lease is gone: another worker may own the job, so nothing of this
        # attempt is written any more, and no store outage holds up the sandbox's stop.
        self.abandoned = threading.Event()
        # Set when a write outlasted the store's patience: what this attempt made is incomplete.
        self.store_lost = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[tuple[str, bytearray]] = []
        self._pending_bytes = 0
        # When the oldest chunk not yet written arrived: no chunk waits longer than
        # LOG_FLUSH_S, and a job's first output (a cold boot after the sink was made) is not
        # written on its own at once, only to be followed by the end's write a moment later.
        self._held_since = 0.0
        self._timer: Call | None = None

    def _staged(self) -> set[tuple[str, str]]:
        # /output is collected after the program exited, so every stage is committed by the
        # first call: read them once, not once per output file.
        if self._staged_files is None:
            stages = self._patiently(lambda: self.store.job_stages(self.job.id))
            self._staged_files = {
                (str(f["path"]), str(f["sha256"])) for stage in stages for f in stage["files"]
            }
        return self._staged_files

    def placed(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id

    def ended(self, result: SandboxResult) -> None:
        """The program's result, before its sandbox is released (ports.runtime.EarlySink)."""
        if self.on_ended is not None:
            self.on_ended(result)

    def ready(self) -> None:
        if self.abandoned.is_set():
            return
        self.started_at = time.time()
        self._started_timer = LATER.call_in(STARTED_WRITE_S, self._write_started)

    def write_start(self) -> None:
        """Write the start now, if the program is running and it is not written yet: the
        program has shown progress (output, a committed stage, a once-key) before its timer
        fired."""
        if self.started_at is not None:
            self._write_started()

    def _write_started(self) -> None:
        with self._started_lock:
            if self._start_written or self._settled:
                return
            self._start_written = True
            if self.abandoned.is_set() or self.store_lost.is_set():
                return
            at, digest, sandbox_id = self.started_at or time.time(), self._digest(), self.sandbox_id
            with contextlib.suppress(SandcellError):  # the job's end writes it, or says why not
                self._patiently(
                    lambda: self.store.mark_started(self.job.id, self.token, at, digest, sandbox_id)
                )

    def settle(self) -> None:
        """The attempt is about to be settled: its start is written with its end, if it was
        not written yet."""
        with self._started_lock:
            self._settled = True
        if self._started_timer is not None:
            self._started_timer.cancel()

    def take_final(self) -> tuple[list[tuple[str, bytes]], list[Artifact]]:
        """The log chunks not yet written and the outputs not yet recorded, for the job's
        terminal write; the sink holds neither after."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            logs = [(stream, bytes(data)) for stream, data in self._pending]
            self._pending, self._pending_bytes = [], 0
        outputs, self._outputs = self._outputs, []
        return logs, outputs

    def _digest(self) -> str:
        return self.job.image_digest or ""

    def output(self, stream: str, data: bytes) -> None:
        if self.abandoned.is_set():
            return
        with self._lock:
            if not self._pending:
                self._held_since = time.monotonic()
            if self._pending and self._pending[-1][0] == stream:
                self._pending[-1][1].extend(data)
            else:
                self._pending.append((stream, bytearray(data)))
            self._pending_bytes += len(data)
            due = time.monotonic() - self._held_since > LOG_FLUSH_S
            if self._pending_bytes >= LOG_FLUSH_BYTES or due:
                self._flush_locked()
            elif self._timer is None:
                # Output that no more output follows (a last line before a long wait) must not
                # wait for the job's end to become readable.
                self._timer = LATER.call_in(LOG_FLUSH_S, self._flush_later)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def discard_outputs(self) -> None:
        """Forget the outputs collected so far; remove their blobs if nothing else has them."""
        outputs, self._outputs = self._outputs, []
        remove_unused_blobs(self.store, self.blobs, outputs)

    def _flush_later(self) -> None:
        with self._lock, contextlib.suppress(SandcellError):  # the final flush() reports it
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.abandoned.is_set():
            self._pending, self._pending_bytes = [], 0
        if self._pending:
            self.write_start()  # before the logs: output shown means the start is too
        for stream, data in self._pending:
            self._append_log(stream, bytes(data))
        if self._pending and self.notifier is not None:
            self.notifier.notify(JOB_LOGS, self.job.id)
        self._pending, self._pending_bytes = [], 0

    def _append_log(self, stream: str, chunk: bytes) -> None:
        self._patiently(lambda: self.store.append_log(self.job.id, self.token, stream, chunk))

    def _patiently(self, call: Callable[[], T]) -> T:
        try:
            return patiently(call, self.patience_s)
        except StoreUnavailable:
            self.store_lost.set()  # the worker leaves the attempt to its lease
            raise

    def output_file(self, path: str, content: BinaryIO, size: int) -> None:
        if self.abandoned.is_set():
            return
        try:
            safe_relative_path(path)
        except ValueError:
            self.skipped_outputs += 1  # a name we cannot represent safely is not published
            return
        sha256, stored_size = store_blob(self.blobs, content, f"output {path}")
        if (path, sha256) in self._staged():
            return  # already an artifact: committed by a stage of this job
        job = self.job
        self._outputs.append(
            Artifact(new_id("art"), job.tenant_id, job.id, path, stored_size, sha256, time.time())
        )


def remove_unused_blobs(store: Store, blobs: BlobStore, found: list[Artifact]) -> None:
    """Remove the blobs of artifacts that were never recorded, unless a row refers to them.

    Best effort: while the store is away, a blob stays (a stray blob, never a missing one).
    """
    stored_by: dict[str, float] = {}
    for artifact in found:  # made right after its blob was stored
        stored_by[artifact.sha256] = max(artifact.created_at, stored_by.get(artifact.sha256, 0.0))
    for sha256, at in stored_by.items():
        try:
            if not store.sha256_in_use(sha256):
                blobs.delete(sha256, stored_by=at)
        except SandcellError as exc:
            log.warning("blob %s kept, its use unknown: %s", sha256, exc.detail)


def store_blob(blobs: BlobStore, content: BinaryIO, what: str) -> tuple[str, int]:
    """blobs.put, with a full disk (or quota) reported as StorageFull naming `what`."""
    try:
        return blobs.put(content)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFull(f"artifact storage is full: {what} could not be stored") from exc
        raise
