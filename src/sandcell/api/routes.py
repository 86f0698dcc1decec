"""Tenant-facing routes: files, jobs, logs, artifacts."""

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, BinaryIO

from anyio import to_thread
from fastapi import APIRouter, File, Header, Query, Request, Response, UploadFile
from fastapi.responses import StreamingResponse

from sandcell.api.deps import Caller, Svc
from sandcell.api.problems import problem_responses
from sandcell.api.schemas import (
    ArtifactOut,
    DeletionReport,
    FileOut,
    JobIn,
    JobOut,
    JobPage,
    LogsOut,
    SecretOut,
    SecretPage,
    SecretPut,
    SignedUrlOut,
)
from sandcell.api.views import artifact_out, file_out, iso, job_out, jobs_out, log_text
from sandcell.api.waiting import FALLBACK_S, EndSweep, JobEnd
from sandcell.domain.records import InputRef, Job, SecretInfo
from sandcell.domain.states import JobState
from sandcell.ports.notify import JOB_DONE, JOB_LOGS
from sandcell.services.jobs import Submission, body_fingerprint

router = APIRouter(prefix="/v1")
MAX_WAIT_S = 60


def _job_out(svc: Svc, job: Job) -> JobOut:
    if job.state is JobState.ACCEPTED and not job.attempts:
        return job_out(job, [], [])  # never ran: nothing to read (saves two queries a submit)
    [record] = jobs_out(svc.store, [job])
    return record


def _submission(body: JobIn) -> Submission:
    return Submission(
        image=body.image,
        code=body.code,
        command=body.command,
        inputs=[InputRef(i.file_id, i.path) for i in body.inputs],
        limits=body.limits.model_dump(exclude_none=True),
        env=body.env,
        network=body.network.model_dump(),
        secrets=[s.model_dump() for s in body.secrets],
        retry=body.retry.model_dump() if body.retry else {},
        expires_in_s=body.expires_in_s,
    )


@router.post(
    "/files",
    status_code=201,
    response_model=FileOut,
    tags=["files"],
    responses=problem_responses(404, 429),
)
def upload_file(svc: Svc, who: Caller, file: Annotated[UploadFile, File()]) -> FileOut:
    quota_bytes = svc.jobs.quotas(who).storage_mb * 2**20
    return file_out(svc.files.upload(who, file.filename or "", file.file, quota_bytes))


@router.get(
    "/files/{file_id}", response_model=FileOut, tags=["files"], responses=problem_responses(404)
)
def get_file(svc: Svc, who: Caller, file_id: str) -> FileOut:
    return file_out(svc.files.get_file(who, file_id))


@router.delete(
    "/files/{file_id}", status_code=204, tags=["files"], responses=problem_responses(404)
)
def delete_file(svc: Svc, who: Caller, file_id: str) -> Response:
    svc.files.delete_file(who, file_id)
    return Response(status_code=204)


@router.post(
    "/jobs",
    status_code=202,
    response_model=JobOut,
    tags=["jobs"],
    responses={
        200: {"model": JobOut, "description": "replay of an Idempotency-Key"},
        **problem_responses(404, 429),
    },
)
async def submit_job(
    svc: Svc,
    who: Caller,
    body: JobIn,
    request: Request,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x20-\x7e]+$"),
    ] = None,
    wait: Annotated[
        float,
        Query(ge=0, le=MAX_WAIT_S, description="seconds to wait for the end before answering"),
    ] = 0,
) -> JobOut:
    """Accept a job (202; 200 for an Idempotency-Key replay). With `wait`, the answer comes
    once the job is terminal (or `wait` runs out): submit and result in one request."""

    async def accept() -> Job:
        with request.app.state.ack_histogram.time():  # the acknowledgement, not the wait
            return await to_thread.run_sync(_submit, svc, who, body, response, idempotency_key)

    if not wait:
        return await to_thread.run_sync(_job_out, svc, await accept())
    # Listening before the job exists: its end cannot pass unheard, so unlike a GET's wait
    # this one needs no read to learn whether the job ended before the listening began.
    with JobEnd(svc.jobs.notifier, None, sweep=request.app.state.end_sweep) as end:
        job = await accept()
        if job.state.is_terminal:  # an Idempotency-Key replay of a finished job
            return await to_thread.run_sync(_job_out, svc, job)
        end.expect(job.id)
        return await _await_end(svc, who, job, end, wait)


def _submit(
    svc: Svc, who: Caller, body: JobIn, response: Response, idempotency_key: str | None
) -> Job:
    key = None
    if idempotency_key is not None:  # a replay must carry the same body
        key = (idempotency_key, body_fingerprint(body.model_dump(mode="json")))
    job, created = svc.jobs.submit(who, _submission(body), key)
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job


@router.get("/jobs", response_model=JobPage, tags=["jobs"])
def list_jobs(
    svc: Svc,
    who: Caller,
    state: JobState | None = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JobPage:
    jobs, next_cursor = svc.jobs.list_jobs(who, state, cursor, limit)
    return JobPage(items=jobs_out(svc.store, jobs), next_cursor=next_cursor)


@router.get(
    "/jobs/{job_id}", response_model=JobOut, tags=["jobs"], responses=problem_responses(404)
)
async def get_job(
    svc: Svc,
    who: Caller,
    job_id: str,
    request: Request,
    wait: Annotated[
        float, Query(ge=0, le=MAX_WAIT_S, description="seconds to wait for the end")
    ] = 0,
) -> JobOut:
    """The job record; with `wait`, answers as soon as the job is terminal (or wait runs out)."""
    if wait:
        return await _until_terminal(svc, who, job_id, wait, request.app.state.end_sweep)
    return await to_thread.run_sync(_get_out, svc, who, job_id)


async def _until_terminal(
    svc: Svc, who: Caller, job_id: str, wait: float, sweep: EndSweep
) -> JobOut:
    with JobEnd(svc.jobs.notifier, job_id, sweep=sweep) as end:
        # Read once listening: the job may have ended just before.
        job = await to_thread.run_sync(svc.jobs.get, who, job_id)
        return await _await_end(svc, who, job, end, wait)


async def _await_end(svc: Svc, who: Caller, job: Job, end: JobEnd, wait: float) -> JobOut:
    """Re-read the job when a notification (or the sweep) says it ended, until `wait`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while not job.state.is_terminal and (left := deadline - loop.time()) > 0:
        await end.wait(left)
        job, out = await to_thread.run_sync(_read_out, svc, who, job.id)
        if out is not None:
            return out  # read and rendered in one trip to the thread pool
    return await to_thread.run_sync(_job_out, svc, job)


def _read_out(svc: Svc, who: Caller, job_id: str) -> tuple[Job, JobOut | None]:
    """The job, and its rendering once it is terminal: one read for both (woken by its end,
    the job nearly always is)."""
    job, outputs, stages = svc.jobs.get_with_outputs(who, job_id)
    return job, job_out(job, outputs, stages) if job.state.is_terminal else None


def _get_out(svc: Svc, who: Caller, job_id: str) -> JobOut:
    return job_out(*svc.jobs.get_with_outputs(who, job_id))


@router.get(
    "/jobs/{job_id}/logs",
    response_model=LogsOut,
    tags=["jobs"],
    responses={200: {"content": {"text/event-stream": {}}}, **problem_responses(404)},
)
def job_logs(svc: Svc, who: Caller, job_id: str, request: Request) -> Any:
    if "text/event-stream" in request.headers.get("accept", ""):
        svc.jobs.get(who, job_id)
        return StreamingResponse(_log_events(svc, who, job_id), media_type="text/event-stream")
    streams: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    for chunk in svc.jobs.logs(who, job_id):
        streams[chunk.stream].extend(chunk.data)
    return LogsOut(
        stdout=log_text(bytes(streams["stdout"])), stderr=log_text(bytes(streams["stderr"]))
    )


async def _log_events(svc: Svc, who: Any, job_id: str) -> AsyncIterator[str]:
    """Server-sent events: one `stdout`/`stderr` event per chunk, then `end` with the state."""
    seq = -1
    with JobEnd(svc.jobs.notifier, job_id, (JOB_DONE, JOB_LOGS)) as news:
        while True:
            job = await to_thread.run_sync(svc.jobs.get, who, job_id)
            chunks = await to_thread.run_sync(svc.jobs.logs, who, job_id, seq)
            for chunk in chunks:
                seq = chunk.seq
                data = json.dumps(log_text(chunk.data))
                yield f"id: {chunk.seq}\nevent: {chunk.stream}\ndata: {data}\n\n"
            if job.state.is_terminal and not chunks:
                end = {"state": job.state.value, "reason": job.reason.value if job.reason else None}
                yield f"event: end\ndata: {json.dumps(end)}\n\n"
                return
            if not chunks:
                await news.wait(FALLBACK_S)  # new chunks and the end are notified


@router.post(
    "/jobs/{job_id}/cancel",
    status_code=202,
    response_model=JobOut,
    tags=["jobs"],
    responses=problem_responses(404),
)
def cancel_job(svc: Svc, who: Caller, job_id: str) -> JobOut:
    return _job_out(svc, svc.jobs.cancel(who, job_id))


@router.delete(
    "/jobs/{job_id}",
    response_model=DeletionReport,
    tags=["jobs"],
    responses=problem_responses(404, 409),
)
def retire_job(svc: Svc, who: Caller, job_id: str) -> dict[str, Any]:
    """Retire the job now; the answer is a deletion report."""
    return svc.jobs.retire(who, job_id)


@router.get(
    "/artifacts/{artifact_id}",
    response_model=ArtifactOut,
    tags=["artifacts"],
    responses=problem_responses(404),
)
def get_artifact(svc: Svc, who: Caller, artifact_id: str) -> ArtifactOut:
    return artifact_out(svc.files.artifact(who, artifact_id))


@router.get(
    "/artifacts/{artifact_id}/content",
    tags=["artifacts"],
    responses={
        200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}},
        **problem_responses(404),
    },
    response_class=StreamingResponse,
    # An API key, or no key at all with a signed URL's `expires` and `sig`.
    openapi_extra={"security": [{"HTTPBearer": []}, {}]},
)
def artifact_content(
    svc: Svc,
    request: Request,
    artifact_id: str,
    expires: int | None = None,
    sig: Annotated[str | None, Query(max_length=128)] = None,
) -> StreamingResponse:
    """The bytes, with an API key or with a signed URL's `expires` and `sig`."""
    if sig is not None and expires is not None:
        artifact = svc.files.artifact_by_signature(artifact_id, expires, sig)
    else:
        who = svc.auth.authenticate(request.headers.get("authorization"))
        artifact = svc.files.artifact(who, artifact_id)
    content = svc.files.open_artifact(artifact)
    name = artifact.path.rsplit("/", 1)[-1].encode("ascii", "replace").decode().replace('"', "_")
    headers = {
        "Content-Disposition": f'attachment; filename="{name}"',
        "Content-Length": str(artifact.size),
        "X-Content-SHA256": artifact.sha256,
        "X-Content-Type-Options": "nosniff",
    }
    return StreamingResponse(
        _chunks(content), media_type="application/octet-stream", headers=headers
    )


def _chunks(content: BinaryIO) -> Iterator[bytes]:
    with content:
        while chunk := content.read(1 << 16):
            yield chunk


@router.post(
    "/artifacts/{artifact_id}/url",
    response_model=SignedUrlOut,
    tags=["artifacts"],
    responses=problem_responses(404),
)
def sign_artifact_url(svc: Svc, who: Caller, artifact_id: str) -> SignedUrlOut:
    artifact = svc.files.artifact(who, artifact_id)
    expires, sig = svc.files.sign(artifact, svc.signed_url_ttl_s)
    url = f"/v1/artifacts/{artifact.id}/content?expires={expires}&sig={sig}"
    return SignedUrlOut(url=url, expires_at=iso(expires) or "")


def _secret_out(info: SecretInfo) -> SecretOut:
    return SecretOut(
        name=info.name, created_at=iso(info.created_at) or "", updated_at=iso(info.updated_at) or ""
    )


@router.post("/secrets", status_code=201, response_model=SecretOut, tags=["secrets"])
def put_secret(svc: Svc, who: Caller, body: SecretPut) -> SecretOut:
    """Create or replace a secret. Its value can never be read back through the API."""
    return _secret_out(svc.secrets.put(who, body.name, body.value))


@router.get("/secrets", response_model=SecretPage, tags=["secrets"])
def list_secrets(svc: Svc, who: Caller) -> SecretPage:
    return SecretPage(items=[_secret_out(info) for info in svc.secrets.list_secrets(who)])


@router.delete(
    "/secrets/{name}", status_code=204, tags=["secrets"], responses=problem_responses(404)
)
def delete_secret(svc: Svc, who: Caller, name: str) -> Response:
    svc.secrets.delete(who, name)
    return Response(status_code=204)
