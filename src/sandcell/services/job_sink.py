"""JobSink: where a running sandbox's output goes — log chunks and artifacts in the store."""

import threading
import time
from typing import BinaryIO

from sandcell.domain.ids import new_id
from sandcell.domain.paths import safe_relative_path
from sandcell.domain.records import Artifact, Job
from sandcell.ports.artifacts import BlobStore
from sandcell.ports.store import Store

LOG_FLUSH_BYTES = 64 * 1024
LOG_FLUSH_S = 0.2


class JobSink:
    """Receives a sandbox's output and turns it into log chunks and artifacts."""

    def __init__(self, store: Store, blobs: BlobStore, job: Job, token: int) -> None:
        self.store, self.blobs, self.job, self.token = store, blobs, job, token
        self.started_at: float | None = None
        self.skipped_outputs = 0
        self._lock = threading.Lock()
        self._pending: list[tuple[str, bytearray]] = []
        self._pending_bytes = 0
        self._flushed_at = time.monotonic()

    def _staged(self) -> set[tuple[str, str]]:
        stages = self.store.job_stages(self.job.id)
        return {(str(f["path"]), str(f["sha256"])) for stage in stages for f in stage["files"]}

    def ready(self) -> None:
        self.started_at = time.time()
        self.store.mark_started(self.job.id, self.token, self.started_at, self._digest())

    def _digest(self) -> str:
        return self.job.image_digest or ""

    def output(self, stream: str, data: bytes) -> None:
        with self._lock:
            if self._pending and self._pending[-1][0] == stream:
                self._pending[-1][1].extend(data)
            else:
                self._pending.append((stream, bytearray(data)))
            self._pending_bytes += len(data)
            due = time.monotonic() - self._flushed_at > LOG_FLUSH_S
            if self._pending_bytes >= LOG_FLUSH_BYTES or due:
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        for stream, data in self._pending:
            self.store.append_log(self.job.id, self.token, stream, bytes(data))
        self._pending, self._pending_bytes = [], 0
        self._flushed_at = time.monotonic()

    def output_file(self, path: str, content: BinaryIO, size: int) -> None:
        try:
            safe_relative_path(path)
        except ValueError:
            self.skipped_outputs += 1  # a name we cannot represent safely is not published
            return
        sha256, stored_size = self.blobs.put(content)
        if (path, sha256) in self._staged():
            return  # already an artifact: committed by a stage of this job
        artifact = Artifact(
            new_id("art"), self.job.tenant_id, self.job.id, path, stored_size, sha256, time.time()
        )
        self.store.add_artifact(artifact, self.token)
