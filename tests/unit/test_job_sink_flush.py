"""A last line of output is readable soon, not only when the job ends."""

import io
import time

import pytest

from sandcell.domain.records import Job
from sandcell.ports.notify import JOB_LOGS, LocalNotifier
from sandcell.services.job_sink import LOG_FLUSH_S, STARTED_WRITE_S, JobSink
from sandcell.services.stages import StageRecorder
from tests.conftest import Api


def _claimed_job(api: Api) -> Job:
    """A job of a new tenant's, submitted and claimed as a worker would."""
    api.http.post("/v1/jobs", json={"code": "print('ready')"}, headers=api.tenant("alice"))
    job = api.services.store.claim_next("wrk_sink", time.time(), 30)
    assert job is not None
    return job


def _sandbox_id(job: Job) -> str:
    return f"{job.id}-{job.fencing_token}"


def test_a_line_that_nothing_follows_is_flushed_by_time(api: Api) -> None:
    store = api.services.store
    job = _claimed_job(api)
    sink = JobSink(store, api.blobs, job, job.fencing_token, _sandbox_id(job))
    sink.output("stdout", b"ready\n")  # at once: younger than LOG_FLUSH_S, so it is held
    assert store.read_logs(job.id, -1) == []
    deadline = time.monotonic() + 20 * LOG_FLUSH_S
    while not (chunks := store.read_logs(job.id, -1)) and time.monotonic() < deadline:
        time.sleep(LOG_FLUSH_S / 4)
    assert [c.data for c in chunks] == [b"ready\n"]
    sink.flush()  # the final flush has nothing left to write twice
    assert [c.data for c in store.read_logs(job.id, -1)] == [b"ready\n"]


def test_stored_chunks_are_notified_for_log_followers_and_an_empty_flush_is_not(
    api: Api,
) -> None:
    store = api.services.store
    job = _claimed_job(api)
    notifier = LocalNotifier()
    heard: list[str] = []
    notifier.listen(JOB_LOGS, heard.append)
    sink = JobSink(store, api.blobs, job, job.fencing_token, _sandbox_id(job), notifier=notifier)
    sink.flush()
    assert heard == []  # nothing was stored
    sink.output("stdout", b"ready\n")
    sink.flush()
    assert heard == [job.id] and [c.data for c in store.read_logs(job.id, -1)] == [b"ready\n"]


def test_a_first_line_after_a_long_boot_is_held_like_any_other(api: Api) -> None:
    """The flush clock starts with the first held chunk, not with the sink: a cold sandbox's
    boot takes longer than LOG_FLUSH_S, and its first line must not cost a write of its own
    when the job's end writes it a moment later anyway."""
    store = api.services.store
    job = _claimed_job(api)
    sink = JobSink(store, api.blobs, job, job.fencing_token, _sandbox_id(job))
    time.sleep(2 * LOG_FLUSH_S)  # the boot
    sink.output("stdout", b"1\n")
    assert store.read_logs(job.id, -1) == []  # held
    logs, _ = sink.take_final()  # the end comes first: it takes the line with it
    assert logs == [("stdout", b"1\n")]
    time.sleep(2 * LOG_FLUSH_S)
    assert store.read_logs(job.id, -1) == []  # and no timer wrote it meanwhile


def test_a_steady_stream_is_written_every_flush_interval(api: Api) -> None:
    store = api.services.store
    job = _claimed_job(api)
    sink = JobSink(store, api.blobs, job, job.fencing_token, _sandbox_id(job))
    started = time.monotonic()
    while time.monotonic() - started < 3 * LOG_FLUSH_S:
        sink.output("stdout", b"x")
        time.sleep(LOG_FLUSH_S / 10)
    written = store.read_logs(job.id, -1)
    assert 2 <= len(written) <= 4  # about one chunk per interval, not one per line
    sink.flush()


def test_output_shown_means_the_start_is_shown(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start is written late (STARTED_WRITE_S) to spare short jobs a write, but never
    after the first log chunk: a record whose logs show output says where it runs."""
    store = api.services.store
    job = _claimed_job(api)
    writes: list[str] = []
    mark_started = store.mark_started
    monkeypatch.setattr(
        store, "mark_started", lambda *args: writes.append(args[0]) or mark_started(*args)
    )
    sandbox_id = _sandbox_id(job)
    sink = JobSink(store, api.blobs, job, job.fencing_token, sandbox_id)
    sink.ready()
    sink.output("stdout", b"ready\n")
    sink.flush()  # the logs go out before STARTED_WRITE_S has passed
    assert [c.data for c in store.read_logs(job.id, -1)] == [b"ready\n"]
    record = store.get_job(job.tenant_id, job.id)
    assert record is not None and record.sandbox_id == sandbox_id
    assert record.started_at == sink.started_at
    time.sleep(STARTED_WRITE_S * 1.5)  # the timer finds it written: no second write
    assert writes == [job.id]
    sink.settle()


@pytest.mark.parametrize("progress", ["stage", "once"])
def test_progress_recorded_means_the_start_is_shown(api: Api, progress: str) -> None:
    """A stage or a once-key the program records before the start's timer fires (its worker
    may be killed the next moment) comes with the start: where and since when it ran."""
    store = api.services.store
    job = _claimed_job(api)
    sandbox_id = _sandbox_id(job)
    sink = JobSink(store, api.blobs, job, job.fencing_token, sandbox_id)
    recorder = StageRecorder(store, api.blobs, job, job.fencing_token)
    recorder.before_progress = sink.write_start  # as the worker wires them
    sink.ready()
    if progress == "stage":
        recorder.commit_stage("clean", [("clean.csv", io.BytesIO(b"a,1\n"))])
    else:
        assert recorder.once("notify")
    record = store.get_job(job.tenant_id, job.id)  # well before STARTED_WRITE_S has passed
    assert record is not None and record.sandbox_id == sandbox_id
    assert record.started_at == sink.started_at
    sink.settle()
