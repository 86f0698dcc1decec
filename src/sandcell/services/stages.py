"""What a job may record about its own progress, through the narrow guest channel.

The channel is bound to one job attempt when the worker opens it: a guest can commit stages
and once-keys of its own job only, and every write carries the attempt's fencing token.
"""

import hashlib
import re
import time
from typing import BinaryIO

from sandcell.domain.errors import FieldError, InvalidRequest
from sandcell.domain.ids import new_id
from sandcell.domain.paths import safe_relative_path
from sandcell.domain.records import Artifact, Job
from sandcell.ports.artifacts import BlobStore
from sandcell.ports.runtime import InputFile
from sandcell.ports.store import Store

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
MAX_FILES = 100


class StageRecorder:
    def __init__(self, store: Store, blobs: BlobStore, job: Job, token: int) -> None:
        self.store, self.blobs, self.job, self.token = store, blobs, job, token

    def commit_stage(self, name: str, files: list[tuple[str, BinaryIO]]) -> list[dict[str, object]]:
        """Store the files as artifacts, then record the stage: both before answering."""
        _check_name(name)
        if len(files) > MAX_FILES:
            raise InvalidRequest(errors=[FieldError("files", f"at most {MAX_FILES} per stage")])
        committed = []
        for path, content in files:
            _check_path(path)
            sha256, size = self.blobs.put(content)
            artifact = Artifact(
                new_id("art"), self.job.tenant_id, self.job.id, path, size, sha256, time.time()
            )
            self.store.add_artifact(artifact, self.token)
            committed.append(
                {"path": path, "artifact_id": artifact.id, "sha256": sha256, "size": size}
            )
        self.store.commit_stage(self.job.id, self.token, name, committed, time.time())
        return committed

    def once(self, key: str) -> bool:
        """True: run the block now (it is recorded first, so it never runs twice)."""
        _check_name(key)
        return self.store.record_once(self.job.id, self.token, key, time.time())

    def completed(self) -> list[str]:
        return [stage["name"] for stage in self.store.job_stages(self.job.id)]


def restored_outputs(store: Store, blobs: BlobStore, job: Job) -> list[InputFile]:
    """Committed stage files to put back in /output, each checked against its sha256."""
    restored = []
    for stage in store.job_stages(job.id):
        for item in stage["files"]:
            path = blobs.path(str(item["sha256"]))
            if _sha256_of(path) != item["sha256"]:
                raise InvalidRequest(f"stage {stage['name']!r}: {item['path']} fails its checksum")
            restored.append(InputFile(path, str(item["path"])))
    return restored


def _sha256_of(path: object) -> str:
    digest = hashlib.sha256()
    with open(str(path), "rb") as content:
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
