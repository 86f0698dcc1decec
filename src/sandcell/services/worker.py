"""The worker: claims jobs, runs each in a fresh sandbox, records what happened.

Every write about a job carries the fencing token of the claim, so a worker that lost its
lease (paused, partitioned) cannot overwrite what its successor decided.
"""

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sandcell.domain.errors import (
    CorruptArtifact,
    ImageUnavailable,
    SandcellError,
    StaleLease,
    StorageFull,
    StoreUnavailable,
)
from sandcell.domain.ids import new_id
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits, out_of_range
from sandcell.domain.records import Job, WorkerInfo
from sandcell.domain.states import JobState, Reason
from sandcell.domain.workers import StopMode
from sandcell.ports.artifacts import BlobStore
from sandcell.ports.egress import Egress, EgressSession
from sandcell.ports.images import ImageCatalog
from sandcell.ports.notify import (
    JOB_DONE,
    JOB_QUEUED,
    LocalNotifier,
    Notifier,
    wake_on,
)
from sandcell.ports.runtime import (
    Closeable,
    GuestChannelHandle,
    GuestChannels,
    HealthReporter,
    InputFile,
    PoolReporter,
    Runtime,
    SandboxResult,
    SandboxSpec,
)
from sandcell.ports.sessions import GUEST_PACKAGE_DIR
from sandcell.ports.store import Store
from sandcell.services.job_sink import JobSink
from sandcell.services.leases import LeaseKeeper
from sandcell.services.patience import next_delay, patiently
from sandcell.services.secrets import SecretService, secret_bindings
from sandcell.services.stages import StageRecorder, restored_outputs

log = logging.getLogger("sandcell.worker")
T = TypeVar("T")

# The sweeps for what other workers left (their lost jobs and sessions) and for idempotency
# keys past their TTL run a few times per lease, not every second: every worker runs them,
# and an idle worker spent half its CPU on them. A lost job is failed within a third of a
# lease after its lease ran out.
SWEEPS_PER_LEASE = 3

BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/workspace",
    "PWD": "/workspace",  # the working directory, as a shell (and bwrap) would say it
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    slots: int = 2
    lease_s: float = 15.0
    heartbeat_s: float = 2.0
    poll_s: float = 1.0  # the fallback claim poll; a submit wakes the worker through notifications
    housekeeping_s: float = 1.0  # the worker's heartbeat, expiries, session reaping
    idempotency_ttl_s: float = 48 * 3600
    drain_s: float = 30.0
    url: str | None = None  # this worker's internal session endpoint, if it hosts sessions
    max_limits: Limits = field(default_factory=Limits)


class SessionKeeper(Protocol):
    """The worker's session host, as far as the claim loop needs it."""

    def reap(self, now: float) -> list[str]: ...
    def pause_all(self) -> None: ...


class Worker:
    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        runtime: Runtime,
        images: ImageCatalog,
        config: WorkerConfig,
        egress: Egress | None = None,
        secrets: SecretService | None = None,
        sessions: SessionKeeper | None = None,
        channels: GuestChannels | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.store, self.blobs, self.runtime, self.images = store, blobs, runtime, images
        self.config = config
        self.notifier: Notifier = notifier or LocalNotifier()
        self._wake = threading.Event()  # a job was queued, a slot freed, or stop was asked
        self._queued = threading.Event()  # a submit was heard since the last claim
        self.egress, self.secrets, self.sessions = egress, secrets, sessions
        self.channels = channels
        self._running = 0
        self._lock = threading.Lock()
        self._cancels: dict[str, threading.Event] = {}
        self._shutdown = threading.Event()
        self._next_housekeeping = self._next_sweep = 0.0
        self.leases = LeaseKeeper(store, self.notifier, config.lease_s, config.heartbeat_s)
        self.stop_mode: StopMode | None = None  # an operator's drain/stop request, once read

    def serve(self, stop: threading.Event) -> StopMode | None:
        """Claim and run jobs until `stop` is set or an operator asks to drain or stop; then let
        running jobs finish. Returns the operator's request, if that is what ended it."""
        reaped = self.runtime.reap()
        reaped += self.channels.reap() if self.channels is not None else []
        reaped += self.egress.reap() if self.egress is not None else []
        if reaped:
            log.warning("removed leftovers of an earlier run: %s", reaped)
        info = WorkerInfo(
            self.config.worker_id,
            socket.gethostname(),
            self.runtime.name,
            self.runtime.version(),
            time.time(),
            self.config.url,
        )
        unlisten = wake_on(self.notifier, JOB_QUEUED, self._wake)
        unhear = wake_on(self.notifier, JOB_QUEUED, self._queued)
        stopping = threading.Thread(target=self._wake_on_stop, args=(stop,), daemon=True)
        stopping.start()
        try:
            self._claim_loop(stop, info)
        finally:
            unlisten()
            unhear()
            if self.sessions is not None:
                self.sessions.pause_all()  # checkpointed sessions resume after a restart
            if isinstance(self.sessions, Closeable):
                self.sessions.close()  # its pooled kernels, never handed to a session
            if isinstance(self.runtime, Closeable):
                self.runtime.close()  # its warm sandboxes: destroyed, never left running
            if isinstance(self.channels, Closeable):
                self.channels.close()
            self.store.worker_stopped(info.id, time.time())
        return self.stop_mode

    def _claim_loop(self, stop: threading.Event, info: WorkerInfo) -> None:
        with ThreadPoolExecutor(self.config.slots, thread_name_prefix="job") as pool:
            backoff = 0.0
            while not stop.is_set() and self.stop_mode is None:
                asked = self._free_slots() if self.stop_mode is None else 0
                try:
                    claimed = self._tick(info, asked)
                except StoreUnavailable as exc:
                    # A database restart must not end the worker: its running jobs go on.
                    backoff = next_delay(backoff)
                    log.warning("store unavailable (%s); again in %.2f s", exc.__cause__, backoff)
                    stop.wait(backoff)
                    continue
                backoff = 0.0
                for job in claimed:
                    pool.submit(self._run_guarded, job)
                if len(claimed) < asked or not claimed:  # the queue is empty, or no slot free
                    self._idle()
            self._drain(info)

    def _idle(self) -> None:
        """Sleep until a notification, the fallback poll or the next housekeeping, if sooner."""
        housekeeping = self._next_housekeeping - time.monotonic()
        self._wake.wait(max(0.0, min(self.config.poll_s, housekeeping)))

    def _wake_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        self._wake.set()

    def _tick(self, info: WorkerInfo, free_slots: int) -> list[Job]:
        """Housekeeping every `housekeeping_s`; then a claim for the free slots, if any."""
        self._wake.clear()  # before the claim: a submit from now on wakes the next wait
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self.store.worker_seen(self._with_figures(info), time.time())
            self._read_stop_request(info.id)
            sweep = now >= self._next_sweep
            self.housekeeping(sweep)
            self._next_housekeeping = time.monotonic() + self.config.housekeeping_s
            if sweep:
                self._next_sweep = now + self.config.lease_s / SWEEPS_PER_LEASE
        return self._claim(free_slots) if free_slots and self.stop_mode is None else []

    def _drain(self, info: WorkerInfo) -> None:
        """Graceful stop: running jobs get their time (`_drain_budget`), then their sandboxes
        are stopped and their jobs handed back (re-queued if they have attempts left)."""
        began = time.monotonic()
        while not self._free_all() and time.monotonic() - began < self._drain_budget():
            time.sleep(0.1)
            self._report_while_draining(info)
        self._shutdown.set()
        with self._lock:
            for cancel in self._cancels.values():
                cancel.set()

    def _drain_budget(self) -> float:
        """A signal: `drain_s`; an operator's drain: as long as the jobs take; a stop: none."""
        if self.stop_mode is StopMode.STOP:
            return 0.0
        return math.inf if self.stop_mode is StopMode.DRAIN else self.config.drain_s

    def _read_stop_request(self, worker_id: str) -> None:
        mode = self.store.worker_stop_request(worker_id)
        if mode is not None and mode is not self.stop_mode:
            log.warning("worker %s: an operator asked it to %s", worker_id, mode)
            self.stop_mode = mode

    def _report_while_draining(self, info: WorkerInfo) -> None:
        """Still seen, and still listening for a stop, while its jobs finish."""
        if time.monotonic() < self._next_housekeeping:
            return
        self._next_housekeeping = time.monotonic() + 1.0
        with contextlib.suppress(StoreUnavailable):
            self.store.worker_seen(self._with_figures(info), time.time())
            self._read_stop_request(info.id)

    def _with_figures(self, info: WorkerInfo) -> WorkerInfo:
        """The heartbeat carries the warm pools' figures and the runtime's report on the host,
        for /metrics in any process."""
        pools: dict[str, Any] = {}
        for kind, source in (("jobs", self.runtime), ("sessions", self.sessions)):
            if isinstance(source, PoolReporter) and (figures := source.pool_figures()):
                pools[kind] = figures
        health = self.runtime.health_figures() if isinstance(self.runtime, HealthReporter) else {}
        return replace(info, pools=pools or None, health=health or None)

    def _free_all(self) -> bool:
        with self._lock:
            return self._running == 0

    def _free_slots(self) -> int:
        with self._lock:
            return self.config.slots - self._running

    def _claim(self, up_to: int) -> list[Job]:
        """Every queued job a free slot can take, in one transaction: under load a burst of
        submits is one claim, and a claim that gets fewer than it asked for shows the queue
        empty, so the loop sleeps without another look."""
        worker, lease_s = self.config.worker_id, self.config.lease_s
        heard = self._queued.is_set()  # a job was submitted: no look needed before the claim
        self._queued.clear()
        jobs = self.store.claim_jobs(worker, time.time(), lease_s, up_to, look_first=not heard)
        with self._lock:
            self._running += len(jobs)
        return jobs

    def housekeeping(self, sweep: bool = True) -> None:
        """Jobs not started in time, and this worker's sessions past their time; with
        `sweep`, also what other workers left behind and idempotency keys past their TTL."""
        now = time.time()
        for job_id in self.store.expire_unstarted(now):
            log.info("job %s expired before it started", job_id)
            self.notifier.notify(JOB_DONE, job_id)
        if sweep:
            self._sweep(now)
        if self.sessions is not None:
            self.sessions.reap(now)

    def _sweep(self, now: float) -> None:
        self.store.purge_idempotency_keys(now - self.config.idempotency_ttl_s)
        for job_id in self.store.fail_lost_jobs(now):
            log.warning("job %s lost its worker", job_id)
            self.notifier.notify(JOB_DONE, job_id)
        live = [w.id for w in self.store.live_workers(now - self.config.lease_s)]
        for session_id in self.store.fail_orphan_sessions(live, now):
            log.warning("session %s lost its worker", session_id)

    def _run_guarded(self, job: Job) -> None:
        try:
            self.run_job(job)
        except StaleLease as exc:
            log.warning("job %s: %s; leaving it to its new owner", job.id, exc.detail)
        except StoreUnavailable:
            log.warning("job %s: the store was unreachable for longer than the lease", job.id)
        except Exception:
            log.exception("job %s: internal error", job.id)
            try:
                self._patiently(lambda: self._fail_internal(job))
            except StaleLease:
                log.warning("job %s: ended or re-claimed meanwhile; left as it is", job.id)
        finally:
            with self._lock:
                was_full = self._running >= self.config.slots
                self._running -= 1
            if was_full:  # a queued job may wait for this slot: claim now, not at the next poll
                self._wake.set()  # (with a slot free all along, its notification woke the loop)

    def _fail_internal(self, job: Job) -> None:
        detail, token = "internal error in the worker", job.fencing_token
        self.store.fail_job(job.id, Reason.INTERNAL, detail, time.time(), token)
        self.notifier.notify(JOB_DONE, job.id)

    def run_job(self, job: Job) -> None:
        token = job.fencing_token
        refusal = self._policy_refusal(job)
        if refusal:
            self._finish(job, token, None, SandboxResult(None, Reason.POLICY_DENIED, refusal))
            return
        try:
            image = self.images.get(job.spec.image)
        except ImageUnavailable as exc:
            self._finish(
                job, token, None, SandboxResult(None, Reason.IMAGE_UNAVAILABLE, exc.detail)
            )
            return
        job.image_digest = image.digest
        try:
            spec = self._spec(job, token, image)
        except CorruptArtifact as exc:  # a clear end, not a crash: the job cannot resume
            log.error("job %s: %s", job.id, exc.detail)
            self._finish(job, token, None, SandboxResult(None, Reason.INTERNAL, exc.detail))
            return
        recorder = StageRecorder(self.store, self.blobs, job, token)
        with self._egress_for(job, token, image) as session, self._channel(recorder) as chan:
            if session is not None:
                spec = replace(spec, egress=session.attachment, env=spec.env | session.env())
            if chan is not None:
                spec = replace(spec, guest_channel=chan.directory)
            outcome = self._supervised(job, token, spec, recorder)
        if outcome is None:
            return  # settled on the program's early result, and its release recorded since
        job.egress = session.events() if session is not None else []
        self._settle(job, token, outcome, recorder.storage_full)

    def _spec(self, job: Job, token: int, image: Image) -> SandboxSpec:
        """The sandbox of this attempt; CorruptArtifact if a committed stage cannot come back."""
        stages = self._earlier_stages(job)
        return SandboxSpec(
            sandbox_id=f"{job.id}-{token}",
            image=image,
            argv=job.spec.command or [image.python, "/job/main.py"],
            env=BASE_ENV | job.spec.env | self._guest_env(job, stages),
            limits=job.spec.limits,
            code=job.spec.code.encode() if job.spec.code is not None else None,
            inputs=self._patiently(lambda: self._inputs(job)),
            restore_outputs=self._restored(job) if stages else [],
        )

    def _earlier_stages(self, job: Job) -> list[str]:
        """The stages committed by earlier attempts. A first claim (token 1; a hand-back or a
        retry raises the token too) has none, and is spared the read."""
        if job.fencing_token <= 1:
            return []
        return [stage["name"] for stage in self._patiently(lambda: self.store.job_stages(job.id))]

    def _supervised(
        self, job: Job, token: int, spec: SandboxSpec, recorder: StageRecorder
    ) -> tuple[SandboxResult, JobSink] | None:
        """Run the sandbox with a heartbeat that renews the lease and relays cancel requests.

        None: the job was settled as soon as its program ended (a warm sandbox's runner says
        when), while the sandbox was still being released; the release is recorded after.
        """
        sink = JobSink(
            self.store,
            self.blobs,
            job,
            token,
            spec.sandbox_id,
            patience_s=self.config.lease_s,
            notifier=self.notifier,
        )
        recorder.before_progress = sink.write_start
        cancel = threading.Event()
        lost = sink.abandoned  # the lease is gone: nothing of this attempt may be written
        with self._lock:
            self._cancels[job.id] = cancel
        let_go = self.leases.hold(job, token, cancel, lost)
        early = EarlyEnd(lambda result: self._end_early(job, token, sink, result, let_go, recorder))
        if spec.egress is None:  # else the proxy's events, known after the run, go in the record
            sink.on_ended = early
        try:
            result = self._run_sandbox(spec, sink, cancel)
        finally:
            let_go()
            with self._lock:
                self._cancels.pop(job.id, None)
        if early.error is not None:
            raise early.error
        if early.settled:
            usage = job.usage | {"released": float(result.released)}
            detail = None if result.released else result.detail
            self._patiently(lambda: self.store.record_release(job.id, token, usage, detail))
            return None
        if lost.is_set():
            sink.discard_outputs()
            released = "released" if result.released else "NOT verified released"
            raise StaleLease(f"lease lost; its sandbox was stopped ({released})")
        if sink.store_lost.is_set():
            # The sink waited out the store for as long as the lease lasts: not the sandbox's
            # failure, and not this worker's to decide. The lease expires and the job is
            # re-queued or ends worker_lost, as a lost worker's would.
            sink.discard_outputs()
            raise StaleLease("the store was unreachable while the job ran")
        sink.settle()
        return result, sink

    def _end_early(
        self,
        job: Job,
        token: int,
        sink: JobSink,
        result: SandboxResult,
        let_go: Callable[[], None],
        recorder: StageRecorder,
    ) -> bool:
        """Settle the job on its program's result while the sandbox is still being released;
        False if the attempt cannot be settled (its lease or the store was lost)."""
        let_go()  # the job ends now: its lease is not renewed, nor a cancel relayed
        if sink.abandoned.is_set() or sink.store_lost.is_set():
            return False  # _supervised gives the attempt up once the release is done
        sink.settle()
        job.egress = []
        self._settle(job, token, (result, sink), recorder.storage_full)
        return True

    def _settle(
        self,
        job: Job,
        token: int,
        outcome: tuple[SandboxResult, JobSink],
        storage_full: StorageFull | None = None,
    ) -> None:
        result, sink = outcome
        if result.reason is Reason.CANCELLED and self._stopped_by_shutdown(job):
            # Not the caller's cancel: the job is settled as if its worker were lost, so a
            # job with attempts left runs again elsewhere (and makes its outputs again).
            sink.flush()
            sink.discard_outputs()
            self._patiently(lambda: self.store.release_job(job.id, token, time.time()))
            self.notifier.notify(JOB_QUEUED, job.id)  # re-queued, or ended worker_lost
            self.notifier.notify(JOB_DONE, job.id)
            return
        if storage_full is not None and result.reason is not Reason.CANCELLED:
            # A stage commit found the artifact disk full: ours, whatever the program made of
            # the refusal; its outputs are not published either.
            sink.discard_outputs()
            result = replace(result, reason=Reason.INTERNAL, detail=storage_full.detail)
        self._finish(job, token, sink, result)

    def _patiently(self, call: Callable[[], T]) -> T:
        """Ride out a store outage for as long as the lease could last, then give up."""
        return patiently(call, self.config.lease_s)

    def _restored(self, job: Job) -> list[InputFile]:
        return self._patiently(lambda: restored_outputs(self.store, self.blobs, job))

    @staticmethod
    def _guest_env(job: Job, stages: list[str]) -> dict[str, str]:
        """What the guest helper needs; set last, so a job's own env cannot override it."""
        return {
            "SANDCELL_JOB_ID": job.id,
            "SANDCELL_COMPLETED_STAGES": ",".join(stages),
            "PYTHONPATH": GUEST_PACKAGE_DIR,
        }

    @contextmanager
    def _channel(self, recorder: StageRecorder) -> Iterator[GuestChannelHandle | None]:
        if self.channels is None:
            yield None
            return
        handle = self.channels.open(f"{recorder.job.id}-{recorder.token}", recorder)
        try:
            yield handle
        finally:
            handle.close()

    @contextmanager
    def _egress_for(self, job: Job, token: int, image: Image) -> Iterator[EgressSession | None]:
        """The job's own proxy, when it may reach hosts; its secret values never leave it."""
        allow = list(job.spec.network.get("allow", []))
        if not allow or self.egress is None:
            yield None
            return
        bindings = secret_bindings(self.secrets, job.tenant_id, job.spec.secrets)
        session = self.egress.open(f"{job.id}-{token}", allow, bindings, image_ca_bundle(image))
        try:
            yield session  # its secret values are masked in logs while it is open
        finally:
            session.close()

    def _stopped_by_shutdown(self, job: Job) -> bool:
        return self._shutdown.is_set() and not self.store.cancel_requested(job.id)

    def _policy_refusal(self, job: Job) -> str:
        """The worker's own bounds, re-checked: a compromised API cannot widen them."""
        problems = out_of_range(job.spec.limits.as_dict(), self.config.max_limits)
        reserved = [name for name in job.spec.env if name.upper().startswith("SANDCELL_")]
        if (job.spec.network.get("allow") or job.spec.secrets) and self.egress is None:
            problems["network"] = "this worker has no egress proxy"
        if reserved:
            problems["env"] = f"reserved names {reserved}"
        return "; ".join(f"{name} {msg}" for name, msg in problems.items())

    def _run_sandbox(
        self, spec: SandboxSpec, sink: JobSink, cancel: threading.Event
    ) -> SandboxResult:
        try:
            return self.runtime.run(spec, sink, cancel)
        except StorageFull as exc:  # ours, not the sandbox's: none of its outputs is recorded
            sink.discard_outputs()
            return SandboxResult(None, Reason.INTERNAL, exc.detail, released=True)
        except StoreUnavailable as exc:  # the sink's, after its patience: see _supervised
            sink.store_lost.set()
            return SandboxResult(None, Reason.INTERNAL, exc.detail)
        except SandcellError as exc:
            return SandboxResult(None, Reason.RUNTIME_ERROR, exc.detail)

    def _inputs(self, job: Job) -> list[InputFile]:
        inputs = []
        for ref in job.spec.inputs:
            stored = self.store.get_file(job.tenant_id, ref.file_id)
            if stored is None:
                raise SandcellError(f"input file {ref.file_id} was deleted before the job ran")
            inputs.append(InputFile(self.blobs.path(stored.sha256), ref.path))
        return inputs

    def _finish(self, job: Job, token: int, sink: JobSink | None, result: SandboxResult) -> None:
        now = time.time()
        job.reason = result.reason
        job.state = result.reason.state if result.reason else JobState.COMPLETED
        if result.reason is Reason.CANCELLED and not result.released:
            job.reason, job.state = Reason.INTERNAL, JobState.FAILED
            result.detail = "cancel requested but the sandbox's release could not be verified"
        job.exit_code = result.exit_code
        job.detail = result.detail
        job.runtime, job.runtime_version = self.runtime.name, self.runtime.version()
        job.started_at = sink.started_at if sink else None
        job.finished_at = now
        job.usage = dict(result.usage)
        job.pooled = result.pooled
        job.sandbox_id = sink.sandbox_id if sink else None
        job.usage["released"] = float(result.released)  # every process gone, verified (1.0)
        if sink and sink.skipped_outputs:
            job.usage["skipped_outputs"] = sink.skipped_outputs
        job.attempts = [*job.attempts, self._attempt(job, token, now)]
        logs, outputs = sink.take_final() if sink else ([], [])
        # One transaction: the end, the last logs and every output appear together. Fenced: if
        # a lost answer hid a commit, the repeat is refused (StaleLease), not applied.
        self._patiently(lambda: self.store.finish_job(job, token, logs, outputs))
        self.notifier.notify(JOB_DONE, job.id)  # also wakes log followers

    def _attempt(self, job: Job, token: int, now: float) -> dict[str, object]:
        return {
            "number": token,
            "worker_id": self.config.worker_id,
            "claimed_at": job.claimed_at,
            "started_at": job.started_at,
            "finished_at": now,
            "state": job.state.value,
            "reason": job.reason.value if job.reason else None,
            "sandbox_id": job.sandbox_id,  # which sandbox ran it: pooled or `<job>-<token>`
        }


class EarlyEnd:
    """The job sink's `on_ended`: settles the job once, keeping what went wrong for later.

    It runs inside the runtime's `run`, whose caller must see the error only once the sandbox
    is released (and not as the sandbox's own failure).
    """

    def __init__(self, settle: Callable[[SandboxResult], bool]) -> None:
        self.settle = settle
        self.settled = False
        self.error: BaseException | None = None

    def __call__(self, result: SandboxResult) -> None:
        try:
            self.settled = self.settle(result)
        except BaseException as exc:  # re-raised by _supervised after the release
            self.error = exc


def image_ca_bundle(image: Image) -> Path:
    """The image's own trust store, to which a job's CA is appended."""
    return image.rootfs / "etc/ssl/certs/ca-certificates.crt"


def new_worker_id() -> str:
    return new_id("wrk")
