"""The worker's bookkeeping over a host-process fake runtime: logs, artifacts, reasons, fencing."""

import hashlib
import threading
import time
from dataclasses import replace
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from sandcell.domain.errors import StaleLease
from sandcell.domain.records import WorkerInfo
from sandcell.domain.states import JobState
from sandcell.ports.runtime import EarlySink, SandboxResult, SandboxSink, SandboxSpec
from sandcell.services import files
from sandcell.services import leases as leases_module
from sandcell.services import worker as worker_module
from sandcell.services.worker import Worker, WorkerConfig
from sandcell.settings import Settings
from tests.conftest import Api
from tests.fakes import FakeEgress, FakeImages, HostProcessRuntime


def _worker(api: Api) -> Worker:
    config = WorkerConfig("wrk_test", slots=2, lease_s=5, heartbeat_s=0.1, poll_s=0.01)
    return Worker(api.services.store, api.blobs, HostProcessRuntime(), FakeImages("python"), config)


def _run_all(api: Api) -> None:
    worker = _worker(api)
    while (job := api.services.store.claim_next("wrk_test", time.time(), 5)) is not None:
        worker.run_job(job)


def test_completed_job_has_logs_outputs_and_timings(api: Api) -> None:
    alice = api.tenant("alice")
    code = (
        "import sys; open('/output/chart.png','wb').write(b'PNG'*100); print('done');"
        " print('warn', file=sys.stderr)"
    )
    job = api.http.post("/v1/jobs", json={"code": code}, headers=alice).json()
    _run_all(api)
    record = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert record["state"] == "completed" and record["reason"] is None and record["exit_code"] == 0
    assert record["runtime"] == "fake" and record["image_digest"].startswith("sha256:")
    assert all(record[k] is not None for k in ("queue_ms", "start_ms", "run_ms", "started_at"))
    assert len(record["attempts"]) == 1
    [output] = record["outputs"]
    assert output["path"] == "chart.png" and output["size"] == 300
    assert output["sha256"] == hashlib.sha256(b"PNG" * 100).hexdigest()
    logs = api.http.get(f"/v1/jobs/{job['id']}/logs", headers=alice).json()
    assert logs == {"stdout": "done\n", "stderr": "warn\n"}
    content = api.http.get(f"/v1/artifacts/{output['artifact_id']}/content", headers=alice)
    assert content.content == b"PNG" * 100
    [listed] = api.http.get("/v1/jobs", headers=alice).json()["items"]
    assert listed["outputs"] == record["outputs"]  # the page reads every job's outputs at once


def test_signed_urls_work_without_a_key_and_fail_when_tampered_or_crossed(api: Api) -> None:
    alice, bob = api.tenant("alice"), api.tenant("bob")
    job = api.http.post(
        "/v1/jobs", json={"code": "open('/output/a.txt','w').write('hi')"}, headers=alice
    ).json()
    _run_all(api)
    [output] = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()["outputs"]
    art = output["artifact_id"]
    assert api.http.post(f"/v1/artifacts/{art}/url", headers=bob).status_code == 404
    assert api.http.get(f"/v1/artifacts/{art}", headers=bob).status_code == 404
    assert api.http.get(f"/v1/artifacts/{art}/content", headers=bob).status_code == 404
    assert api.http.get(f"/v1/artifacts/{art}/content").status_code == 401
    url = api.http.post(f"/v1/artifacts/{art}/url", headers=alice).json()["url"]
    assert api.http.get(url).content == b"hi"
    assert api.http.get(url.replace("sig=", "sig=0")).status_code == 401
    assert api.http.get(url.replace("expires=", "expires=1")).status_code == 401


def _stopped_clock(at: float) -> SimpleNamespace:
    """The `time` module as a module under test sees it, with `time.time()` stopped at `at`."""
    return SimpleNamespace(**(vars(time) | {"time": lambda: at}))


def test_a_signed_url_is_refused_once_it_has_expired(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = api.tenant("alice")
    job = api.http.post(
        "/v1/jobs", json={"code": "open('/output/a.txt','w').write('hi')"}, headers=alice
    ).json()
    _run_all(api)
    [output] = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()["outputs"]
    url = api.http.post(f"/v1/artifacts/{output['artifact_id']}/url", headers=alice).json()["url"]
    expires = int(parse_qs(urlsplit(url).query)["expires"][0])
    assert time.time() + 50 < expires <= time.time() + 60  # the configured 60 s
    # The same correctly signed URL, read by a server whose clock has moved on.
    monkeypatch.setattr(files, "time", _stopped_clock(expires))
    assert api.http.get(url).content == b"hi"  # valid up to its last second
    monkeypatch.setattr(files, "time", _stopped_clock(expires + 1))
    refused = api.http.get(url)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["detail"] == "this download URL has expired"


def test_nonzero_exit_is_exit_code_and_cancel_of_running_job_is_honoured(api: Api) -> None:
    alice = api.tenant("alice")
    failing = api.http.post("/v1/jobs", json={"code": "raise SystemExit(3)"}, headers=alice).json()
    _run_all(api)
    record = api.http.get(f"/v1/jobs/{failing['id']}", headers=alice).json()
    assert (record["state"], record["reason"], record["exit_code"]) == ("failed", "exit_code", 3)

    slow = api.http.post(
        "/v1/jobs", json={"code": "import time; time.sleep(30)"}, headers=alice
    ).json()
    job = api.services.store.claim_next("wrk_test", time.time(), 5)
    assert job is not None
    runner = threading.Thread(target=_worker(api).run_job, args=(job,))
    runner.start()
    time.sleep(0.3)
    assert (
        api.http.post(f"/v1/jobs/{slow['id']}/cancel", headers=alice).json()["state"] == "running"
    )
    runner.join(10)
    record = api.http.get(f"/v1/jobs/{slow['id']}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("cancelled", "cancelled")


@pytest.mark.parametrize("notified", [True, False])
def test_a_cancel_reaches_a_running_job_by_notification_or_by_the_fallback_look(
    api: Api, monkeypatch: pytest.MonkeyPatch, notified: bool
) -> None:
    """Notified, the worker looks at once (its fallback look is an hour away); with the
    notification lost, the fallback look (here 0.2 s) still finds the request."""
    monkeypatch.setattr(leases_module, "CANCEL_POLL_S", 3600 if notified else 0.2)
    alice = api.tenant("alice")
    slow = api.http.post(
        "/v1/jobs", json={"code": "import time; time.sleep(30)"}, headers=alice
    ).json()
    config = WorkerConfig("wrk_test", slots=2, lease_s=600, heartbeat_s=600, poll_s=0.01)
    notifier = api.services.jobs.notifier if notified else None
    worker = Worker(
        api.services.store,
        api.blobs,
        HostProcessRuntime(),
        FakeImages("python"),
        config,
        notifier=notifier,
    )
    job = api.services.store.claim_next("wrk_test", time.time(), 600)
    assert job is not None
    runner = threading.Thread(target=worker.run_job, args=(job,))
    runner.start()
    time.sleep(0.3)
    asked = time.monotonic()
    api.http.post(f"/v1/jobs/{slow['id']}/cancel", headers=alice).raise_for_status()
    runner.join(20)
    assert not runner.is_alive()
    assert time.monotonic() - asked < 20
    record = api.http.get(f"/v1/jobs/{slow['id']}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("cancelled", "cancelled")


def test_retire_removes_artifacts_and_logs_and_reports_them(api: Api) -> None:
    alice = api.tenant("alice")
    job = api.http.post(
        "/v1/jobs",
        json={"code": "print('x'); open('/output/r.bin','wb').write(b'1234')"},
        headers=alice,
    ).json()
    _run_all(api)
    [output] = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()["outputs"]
    report = api.http.delete(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert report["removed"]["artifacts"][0]["artifact_id"] == output["artifact_id"]
    assert report["removed"]["artifact_bytes"] == 4 and report["removed"]["log_bytes"] == 2
    assert not api.blobs.exists(output["sha256"])
    assert api.http.get(f"/v1/artifacts/{output['artifact_id']}", headers=alice).status_code == 404
    assert api.http.get(f"/v1/jobs/{job['id']}/logs", headers=alice).json() == {
        "stdout": "",
        "stderr": "",
    }
    tomb = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert tomb["retired_at"] and tomb["state"] == "completed"
    assert api.http.delete(f"/v1/jobs/{job['id']}", headers=alice).json()["already_retired"] is True


def test_a_stale_fencing_token_cannot_finish_a_job(api: Api) -> None:
    alice = api.tenant("alice")
    api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice)
    store = api.services.store
    job = store.claim_next("wrk_a", time.time(), lease_s=0.01)
    assert job is not None
    time.sleep(0.05)
    assert store.fail_lost_jobs(time.time()) == [job.id]
    job.state = JobState.COMPLETED
    with pytest.raises(StaleLease):
        store.finish_job(job, job.fencing_token)
    assert store.get_job(None, job.id).reason.value == "worker_lost"


def test_expired_jobs_fail_with_expired(api: Api) -> None:
    alice = api.tenant("alice")
    job = api.http.post(
        "/v1/jobs", json={"code": "print(1)", "expires_in_s": 0.01}, headers=alice
    ).json()
    time.sleep(0.05)
    _worker(api).housekeeping()
    record = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("failed", "expired")


def test_expiries_are_looked_at_every_second_and_other_workers_leftovers_thrice_a_lease(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = api.services.store
    calls = {"expire_unstarted": 0, "fail_lost_jobs": 0, "fail_orphan_sessions": 0}
    for name in calls:

        def counted(
            *args: object, _name: str = name, _real: object = getattr(store, name)
        ) -> object:
            calls[_name] += 1
            return _real(*args)  # type: ignore[operator]

        monkeypatch.setattr(store, name, counted)
    config = WorkerConfig("wrk_sweeps", lease_s=15, housekeeping_s=1.0)
    worker = Worker(store, api.blobs, HostProcessRuntime(), FakeImages("python"), config)
    info = WorkerInfo("wrk_sweeps", "host", "fake", "1", time.time())
    clock = {"now": 1000.0}
    monkeypatch.setattr(
        worker_module, "time", SimpleNamespace(**(vars(time) | {"monotonic": lambda: clock["now"]}))
    )
    for _ in range(12):  # 12 s: a lease of 15 s is swept every 5 s
        worker._tick(info, free_slots=0)
        clock["now"] += 1.0
    assert calls == {"expire_unstarted": 12, "fail_lost_jobs": 3, "fail_orphan_sessions": 3}


def test_idempotency_keys_replay_for_a_day_and_are_purged_after_the_ttl(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = api.tenant("alice") | {"Idempotency-Key": "nightly-report"}
    first = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice)
    assert first.status_code == 202
    submitted, worker = time.time(), _worker(api)
    ttl = worker.config.idempotency_ttl_s
    assert ttl == Settings.model_fields["idempotency_ttl_s"].default == 48 * 3600

    def replay_after(age_s: float) -> httpx.Response:
        """The worker's housekeeping (which purges keys) runs `age_s` after the submission."""
        monkeypatch.setattr(worker_module, "time", _stopped_clock(submitted + age_s))
        worker.housekeeping()
        return api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice)

    for age_s in (3600, 24 * 3600 - 60, 24 * 3600 + 60, ttl - 60):  # kept at least 24 h
        again = replay_after(age_s)
        assert (again.status_code, again.json()["id"]) == (200, first.json()["id"]), age_s
    fresh = replay_after(ttl + 60)  # purged: the same key and body make a new job
    assert fresh.status_code == 202 and fresh.json()["id"] != first.json()["id"]


def test_long_poll_answers_when_the_job_ends(api: Api) -> None:
    alice = api.tenant("alice")
    job = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    threading.Timer(0.3, _run_all, args=(api,)).start()
    started = time.monotonic()
    record = api.http.get(f"/v1/jobs/{job['id']}", params={"wait": 10}, headers=alice).json()
    assert record["state"] == "completed" and time.monotonic() - started < 5


def test_submit_can_wait_for_the_end_in_the_same_request(api: Api) -> None:
    alice = api.tenant("alice")
    threading.Timer(0.3, _run_all, args=(api,)).start()
    started = time.monotonic()
    body, key = {"code": "print(1)"}, {"Idempotency-Key": "one-request"}
    answer = api.http.post("/v1/jobs", json=body, params={"wait": 10}, headers=alice | key)
    assert answer.status_code == 202 and answer.json()["state"] == "completed", answer.text
    assert time.monotonic() - started < 5
    again = api.http.post("/v1/jobs", json=body, params={"wait": 10}, headers=alice | key)
    assert again.status_code == 200 and again.json()["id"] == answer.json()["id"]
    pending = api.http.post("/v1/jobs", json=body, params={"wait": 0.2}, headers=alice)
    assert pending.status_code == 202 and pending.json()["state"] == "accepted"  # wait ran out
    refused = api.http.post("/v1/jobs", json=body, params={"wait": -1}, headers=alice)
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "wait"


def test_logs_stream_as_server_sent_events_and_end_with_the_state(api: Api) -> None:
    alice = api.tenant("alice")
    code = (
        "import sys; print('out\\x1b[31m'); print('err', file=sys.stderr);"
        " sys.stdout.buffer.write(b'\\xff\\x00')"
    )
    job = api.http.post("/v1/jobs", json={"code": code}, headers=alice).json()
    _run_all(api)
    sse = api.http.get(
        f"/v1/jobs/{job['id']}/logs", headers=alice | {"Accept": "text/event-stream"}
    )
    assert sse.headers["content-type"].startswith("text/event-stream")
    events = [block.split("\n") for block in sse.text.strip().split("\n\n")]
    kinds = [next(line[7:] for line in e if line.startswith("event: ")) for e in events]
    assert set(kinds) >= {"stdout", "stderr"} and kinds[-1] == "end"
    assert '"state": "completed"' in events[-1][-1]
    logs = api.http.get(f"/v1/jobs/{job['id']}/logs", headers=alice).json()
    assert logs["stdout"] == "out\x1b[31m\n\ufffd\ufffd"  # escapes stay data; bad bytes replaced


def test_the_worker_rechecks_limits_so_a_compromised_api_cannot_widen_them(api: Api) -> None:
    alice = api.tenant("alice")
    job = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    claimed = api.services.store.claim_next("wrk_test", time.time(), 5)
    assert claimed is not None and claimed.id == job["id"]
    forged = replace(claimed.spec, limits=replace(claimed.spec.limits, memory_mb=10**6))
    claimed.spec = forged  # as if a compromised API had written it
    _worker(api).run_job(claimed)
    record = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("failed", "policy_denied")
    assert "memory_mb" in record["detail"]


@pytest.mark.parametrize(("retry", "state"), [(None, "failed"), ({"max_attempts": 2}, "accepted")])
def test_graceful_stop_gives_running_jobs_a_deadline_then_settles_them(
    api: Api, retry: dict | None, state: str
) -> None:
    alice = api.tenant("alice")
    body = {"code": "import time; time.sleep(30)"} | ({"retry": retry} if retry else {})
    job = api.http.post("/v1/jobs", json=body, headers=alice).json()
    config = WorkerConfig("wrk_stop", slots=1, lease_s=5, heartbeat_s=0.1, poll_s=0.01, drain_s=0.3)
    worker = Worker(api.services.store, api.blobs, HostProcessRuntime(), FakeImages(), config)
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, args=(stop,))
    serving.start()
    deadline = time.monotonic() + 10
    while api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    stop.set()
    serving.join(15)
    assert not serving.is_alive()
    record = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert record["state"] == state
    assert record["attempts"][-1]["reason"] == "worker_lost"
    if state == "failed":
        assert record["reason"] == "worker_lost" and "stopped" in record["detail"]


def test_a_job_with_network_gets_its_own_proxy_and_its_egress_log(api: Api) -> None:
    alice = api.tenant("alice")
    api.http.post("/v1/secrets", json={"name": "tok", "value": "tok-value-77"}, headers=alice)
    binding = {"name": "tok", "hosts": ["api.example"], "header": "X-Key"}
    body = {"code": "print(1)", "network": {"allow": ["api.example"]}, "secrets": [binding]}
    job = api.http.post("/v1/jobs", json=body, headers=alice).json()
    egress = FakeEgress(api.tmp)
    config = WorkerConfig("wrk_net", slots=1, lease_s=5, heartbeat_s=0.1, poll_s=0.01)
    worker = Worker(
        api.services.store,
        api.blobs,
        HostProcessRuntime(),
        FakeImages(),
        config,
        egress=egress,
        secrets=api.services.secrets,
    )
    claimed = api.services.store.claim_next("wrk_net", time.time(), 5)
    assert claimed is not None
    worker.run_job(claimed)
    [session] = egress.sessions
    assert session.closed and session.allow == ["api.example"]
    assert [(b.spec["name"], b.value) for b in session.secrets] == [("tok", "tok-value-77")]
    record = api.http.get(f"/v1/jobs/{job['id']}", headers=alice)
    assert record.json()["state"] == "completed"
    assert record.json()["egress"] == [{"host": "api.example", "port": 443, "decision": "allowed"}]
    assert "tok-value-77" not in record.text


def test_without_an_egress_proxy_the_worker_refuses_network_jobs(api: Api) -> None:
    alice = api.tenant("alice")
    body = {"code": "print(1)", "network": {"allow": ["api.example"]}}
    job = api.http.post("/v1/jobs", json=body, headers=alice).json()
    _run_all(api)
    record = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("failed", "policy_denied")


def test_an_internal_error_after_the_job_was_reclaimed_leaves_the_new_owner_alone(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = api.tenant("alice")
    body = {"code": "print(1)", "retry": {"max_attempts": 2}}
    job_id = api.http.post("/v1/jobs", json=body, headers=alice).json()["id"]
    store, worker = api.services.store, _worker(api)
    stale = store.claim_next("wrk_test", time.time(), 5)
    assert stale is not None
    assert store.fail_lost_jobs(time.time() + 3600) == [job_id]  # its lease ran out
    fresh = store.claim_next("wrk_other", time.time(), 30)
    assert fresh is not None and fresh.fencing_token > stale.fencing_token

    def crash(job: object) -> None:
        raise RuntimeError("a bug in the worker")

    monkeypatch.setattr(worker, "run_job", crash)
    worker._run_guarded(stale)
    record = api.http.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert record["state"] == "running" and record["reason"] is None
    worker._run_guarded(fresh)  # the owner's own internal error does end it
    record = api.http.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("failed", "internal")


class EarlyEndingRuntime(HostProcessRuntime):
    """Reports the result through the sink before its (slow, or failing) release, as a warm
    gVisor sandbox does; notes the job's record as it stood during the release."""

    def __init__(self, store: object, release_problem: str = "") -> None:
        self.store, self.release_problem = store, release_problem
        self.seen_during_release: list[object] = []

    def run(self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event) -> SandboxResult:
        result = super().run(spec, sink, cancel)
        early = replace(result, released=False, usage={"cpu_s": 0.01})
        assert isinstance(sink, EarlySink)
        sink.ended(early)
        job_id = spec.sandbox_id.rsplit("-", 1)[0]
        self.seen_during_release.append(self.store.get_job(None, job_id))  # type: ignore[attr-defined]
        if self.release_problem:
            return replace(early, released=False, detail=f"not released: {self.release_problem}")
        return replace(early, released=True)


@pytest.mark.parametrize("problem", ["", "cgroup left"])
def test_a_job_is_settled_on_its_early_result_and_its_release_recorded_after(
    api: Api, problem: str
) -> None:
    alice = api.tenant("alice")
    job = api.http.post(
        "/v1/jobs",
        json={"code": "open('/output/a.txt','w').write('hi'); print('ok')"},
        headers=alice,
    ).json()
    runtime = EarlyEndingRuntime(api.services.store, problem)
    config = WorkerConfig("wrk_test", slots=1, lease_s=5, heartbeat_s=0.1, poll_s=0.01)
    worker = Worker(api.services.store, api.blobs, runtime, FakeImages("python"), config)
    claimed = api.services.store.claim_next("wrk_test", time.time(), 5)
    assert claimed is not None
    worker.run_job(claimed)
    [during] = runtime.seen_during_release
    assert during.state is JobState.COMPLETED and during.usage["released"] == 0.0
    record = api.http.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert record["state"] == "completed" and [o["path"] for o in record["outputs"]] == ["a.txt"]
    assert api.http.get(f"/v1/jobs/{job['id']}/logs", headers=alice).json()["stdout"] == "ok\n"
    if problem:
        assert record["usage"]["released"] == 0.0 and record["detail"] == f"not released: {problem}"
    else:
        assert record["usage"] == {"cpu_s": 0.01, "released": 1.0}


def test_a_running_job_shows_its_start_and_a_short_one_gets_it_with_its_end(api: Api) -> None:
    alice = api.tenant("alice")
    slow = api.http.post("/v1/jobs", json={"code": "import time; time.sleep(1.5)"}, headers=alice)
    runner = threading.Thread(target=_run_all, args=(api,))
    runner.start()
    deadline = time.monotonic() + 1.2
    seen = {}
    while time.monotonic() < deadline and not seen.get("started_at"):
        seen = api.http.get(f"/v1/jobs/{slow.json()['id']}", headers=alice).json()
        time.sleep(0.02)
    runner.join()
    assert seen["state"] == "running" and seen["started_at"] and seen["image_digest"], seen
    quick = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    _run_all(api)
    record = api.http.get(f"/v1/jobs/{quick['id']}", headers=alice).json()
    assert record["started_at"] and record["image_digest"].startswith("sha256:"), record
