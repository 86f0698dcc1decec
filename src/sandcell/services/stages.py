"""What a job may record about its own progress, through the narrow guest channel.

The channel is bound to one job attempt when the worker opens it: a guest can commit stages
and once-keys of its own job only, and every write carries the attempt's fencing token.

A stage commit is all or nothing: its files are stored as blobs first, then the artifacts and
the stage row are recorded in one store transaction. If anything fails on the way (the disk
full, the lease lost, the stage already committed), nothing of it is recorded and the blobs it
stored that nothing else refers to are removed again.
"""

import hashlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from sandcell.domain.errors import CorruptArtifact, FieldError, InvalidRequest, StorageFull
from sandcell.domain.ids import new_id
from sandcell.domain.paths import safe_relative_path
from sandcell.domain.records import Artifact, Job
from sandcell.ports.artifacts import BlobStore
from sandcell.ports.runtime import InputFile
from sandcell.ports.store import Store
from sandcell.services.job_sink import remove_unused_blobs, store_blob

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
MAX_FILES = 100


class StageRecorder:
    def __init__(self, store: Store, blobs: BlobStore, job: Job, token: int) -> None:
        self.store, self.blobs, self.job, self.token = store, blobs, job, token
        self.storage_full: StorageFull | None = None  # a commit found the artifact disk full
        # Called before a stage or once-key is recorded: a record that shows the program's
        # progress says where it runs too (the sink's start, which it may still hold back).
        self.before_progress: Callable[[], None] = lambda: None

    def commit_stage(self, name: str, files: list[tuple[str, BinaryIO]]) -> list[dict[str, object]]:
        """Store the files as artifacts and record the stage, all at once, before answering."""
        _check_name(name)
        if len(files) > MAX_FILES:
            raise InvalidRequest(errors=[FieldError("files", f"at most {MAX_FILES} per stage")])
        for path, _ in files:
            _check_path(path)
        stored: list[Artifact] = []
        self.before_progress()
        try:
            for path, content in files:
                stored.append(self._store(name, path, content))
            return self.store.commit_stage(self.job.id, self.token, name, stored, time.time())
        except BaseException as exc:
            remove_unused_blobs(self.store, self.blobs, stored)
            if isinstance(exc, StorageFull):
                self.storage_full = exc  # the job's end says so, whatever the guest made of it
            raise

    def _store(self, stage: str, path: str, content: BinaryIO) -> Artifact:
        sha256, size = store_blob(self.blobs, content, f"stage {stage!r} file {path}")
        job = self.job
        return Artifact(new_id("art"), job.tenant_id, job.id, path, size, sha256, time.time())

    def once(self, key: str) -> bool:
        """True: run the block now (it is recorded first, so it never runs twice)."""
        _check_name(key)
        self.before_progress()
        return self.store.record_once(self.job.id, self.token, key, time.time())

    def completed(self) -> list[str]:
        return [stage["name"] for stage in self.store.job_stages(self.job.id)]


def restored_outputs(store: Store, blobs: BlobStore, job: Job) -> list[InputFile]:
    """Committed stage files to put back in /output, each checked against its sha256.

    CorruptArtifact names the stage and file that cannot come back as committed.
    """
    restored = []
    for stage in store.job_stages(job.id):
        for item in stage["files"]:
            path = blobs.path(str(item["sha256"]))
            where = f"stage {stage['name']} output {item['path']}"
            try:
                intact = _sha256_of(path) == item["sha256"]
            except FileNotFoundError as exc:
                raise CorruptArtifact(f"{where} is missing from artifact storage") from exc
            if not intact:
                raise CorruptArtifact(f"{where} failed its checksum on restore")
            restored.append(InputFile(path, str(item["path"])))
    return restored


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as content:
        while chunk := content.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_name(name: str) -> None:
    if not NAME.match(name):
        raise InvalidRequest(errors=[FieldError("name", "letters, digits, '_.:-'; at most 128")])


def _check_path(path: str) -> None:
    try:
        safe_relative_path(path)
    except ValueError as exc:
        raise InvalidRequest(errors=[FieldError("files", f"{path!r}: {exc}")]) from exc
