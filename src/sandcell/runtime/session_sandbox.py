"""One session sandbox while it lives: its cells, interrupts, pause (checkpoint) and release.

GVisorSessionRuntime (session.py) makes the parts and boots it; from then on this object is the
SessionSandbox the service holds. Cells run one at a time; `interrupt`, `http` and
`memory_bytes` may be called from other threads while a cell runs.
"""

import base64
import contextlib
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sandcell.domain.errors import PreviewUnavailable, RuntimeUnavailable, SessionUnavailable
from sandcell.ports.sessions import CellEvent, CellResult, SessionSpec
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.kernel_channel import CellCollector, KernelChannel
from sandcell.runtime.reap import wait_until_gone, waited
from sandcell.runtime.runsc import RunscError
from sandcell.runtime.sandbox import BOOT_CPUS, RUNSC_ENV, boot_cpus
from sandcell.runtime.session_preview import (
    DEFAULT_TIMEOUT_S,
    MAX_RESPONSE_BYTES,
    HttpReply,
    parse_response,
    relay_answer,
    request_bytes,
)
from sandcell.runtime.session_runsc import Checkpointer, SessionRunsc
from sandcell.runtime.session_volume import SessionScratch

log = logging.getLogger("sandcell.runtime.session")
MiB = 1024 * 1024
# After a cell's timeout: SIGINT to the kernel at once and again a second later; then to every
# process of the sandbox (what Ctrl-C in a terminal does: it also stops `os.system` children,
# during which the kernel itself ignores SIGINT). Past GIVE_UP_S the session is stopped.
INTERRUPT_SCHEDULE = ((0.0, False), (1.0, False), (2.0, True), (5.0, True))
GIVE_UP_S = 10.0
EXIT_WAIT_S = 5.0
RELEASE_WAIT_S = 10.0
PAUSE_WAIT_S = 15.0  # for a running cell to stop before a pause
RELAY_SLACK_S = 5.0  # the kernel's own relay timeout comes first


class State(StrEnum):
    BOOTING = "booting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    STOPPED = "stopped"
    LOST = "lost"  # the sandbox ended on its own (out of memory, the kernel exited)


@dataclass
class SessionParts:
    spec: SessionSpec
    runsc: SessionRunsc
    scratch: SessionScratch
    cgroup: SandboxCgroup
    checkpointer: Checkpointer


class GVisorSession:
    def __init__(self, parts: SessionParts) -> None:
        self.parts = parts
        self.sandbox_id = parts.spec.sandbox_id
        self.workspace = parts.scratch.workspace
        self.memory_restored = False  # set by the runtime when `resume` restored a checkpoint
        self.boot_s = 0.0
        self.state = State.BOOTING
        self.lost_detail = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: KernelChannel | None = None
        self._cell_lock = threading.Lock()  # one cell (or a pause) at a time
        self._life_lock = threading.RLock()  # state changes and release
        self._problems: list[str] | None = None  # what release left behind; None: not yet

    # boot, driven by the runtime

    def launch(self, argv: list[str]) -> None:
        with open(self.parts.scratch.stderr, "wb") as stderr:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=RUNSC_ENV,
                start_new_session=True,  # the worker's terminal signals are not the sandbox's
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.channel = KernelChannel(self.proc.stdin, self.proc.stdout, self._on_wire_closed)

    def await_kernel(self, restored: bool, timeout_s: float) -> None:
        channel = self._channel()
        if restored:  # a restored kernel said hello long ago: ask it
            call = channel.call("ping")
            up = call.wait(timeout_s) and bool(call.answer and call.answer.get("pong"))
        else:
            up = _first_of(channel.ready, channel.closed, timeout_s) is channel.ready
        if not up:
            raise RuntimeUnavailable(f"the kernel did not come up: {self._diagnosis()}")
        self._apply_tenant_cpu()
        self.state = State.RUNNING

    def _apply_tenant_cpu(self) -> None:
        """Boot ran on BOOT_CPUS; the tenant's quota applies from the first cell (fail closed)."""
        cpus = self.parts.spec.limits.cpu
        if cpus < BOOT_CPUS:
            try:
                self.parts.cgroup.set_cpus(cpus)
            except OSError as exc:
                raise RuntimeUnavailable(f"cannot apply the cpu limit: {exc}") from exc

    # the SessionSandbox port

    def execute(
        self, code: str, timeout_s: float, on_event: Callable[[CellEvent], None] | None = None
    ) -> CellResult:
        with self._cell_lock:
            channel = self._running()
            cap = int(self.parts.spec.limits.output_mb * MiB)
            collector = CellCollector(on_event, cap)
            started = time.monotonic()
            call = channel.call("execute", collector, code=code, output_limit=cap)
            timed_out = not call.wait(timeout_s)
            if timed_out:
                self._interrupt_until_answered(call.done)
            if call.answer is None:
                raise self._lost()
            if collector.failure is not None:
                raise collector.failure
            return collector.result(call.answer, (time.monotonic() - started) * 1000, timed_out)

    def interrupt(self) -> None:
        if self.state is State.RUNNING:
            self._signal_interrupt(everyone=False)

    def memory_bytes(self) -> int:
        """What the sandbox holds now (kernel, sentry, gofer), less reclaimable file cache."""
        if self.state is not State.RUNNING:
            return 0
        stat = self.parts.cgroup.memory_stat()
        return max(0, stat["usage"] - stat.get("total_inactive_file", 0))

    def http(
        self, port: int, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> HttpReply:
        """One HTTP exchange with a server the session runs on its loopback (see relay.py)."""
        raw = request_bytes(port, method, target, headers, body)
        channel = self._running()
        request = base64.b64encode(raw).decode()
        call = channel.call(
            "http",
            port=port,
            request=request,
            timeout_s=DEFAULT_TIMEOUT_S,
            max_bytes=MAX_RESPONSE_BYTES,
        )
        if not call.wait(DEFAULT_TIMEOUT_S + RELAY_SLACK_S):
            raise PreviewUnavailable(f"no answer within {DEFAULT_TIMEOUT_S:g} s")
        response, complete = relay_answer(call.answer)
        return parse_response(response, complete, method)

    def pause(self) -> bool:
        """Checkpoint the memory and end the sandbox; False if only the workspace was kept."""
        if not self._cell_lock.acquire(blocking=False):
            self.interrupt()
            if not self._cell_lock.acquire(timeout=PAUSE_WAIT_S):
                self.stop()
                return False
        try:
            with self._life_lock:
                return self._pause()
        finally:
            self._cell_lock.release()

    def stop(self) -> bool:
        """Kill everything of the sandbox; True once verified gone (the state_dir stays)."""
        with self._life_lock:
            problems = self.release()
            self.state = State.STOPPED
        return not problems

    # inside

    def _pause(self) -> bool:
        if self.state is not State.RUNNING:
            self.release()
            return False
        self.state = State.PAUSING
        kept = self._checkpoint()
        problems = self.release()
        self.state = State.PAUSED if kept and not problems else State.STOPPED
        return kept

    def _checkpoint(self) -> bool:
        try:
            # Writing the memory image is the sentry's work, in the tenant's cgroup: not the
            # tenant's to pay for with a small cpu quota.
            self.parts.cgroup.set_cpus(boot_cpus(self.parts.spec.limits))
            self.parts.checkpointer.take(self.parts.runsc, self.sandbox_id)
        except (OSError, RunscError) as exc:
            log.warning("checkpoint of %s failed, keeping its workspace: %s", self.sandbox_id, exc)
            return False
        return True

    def _interrupt_until_answered(self, answered: threading.Event) -> None:
        started = time.monotonic()
        for after_s, everyone in INTERRUPT_SCHEDULE:
            if answered.wait(started + after_s - time.monotonic()):
                return
            self._signal_interrupt(everyone)
        if answered.wait(started + GIVE_UP_S - time.monotonic()):
            return
        log.warning("session %s ignored every interrupt; stopping it", self.sandbox_id)
        self.stop()
        raise SessionUnavailable(
            "the cell did not stop when interrupted, so the session was stopped; "
            "its workspace is kept"
        )

    def _signal_interrupt(self, everyone: bool) -> None:
        try:
            self.parts.runsc.signal(self.sandbox_id, "SIGINT", everyone=everyone)
        except RunscError as exc:  # the sandbox is ending: the wire will say so
            log.info("interrupt of %s not delivered: %s", self.sandbox_id, exc)

    def _lost(self) -> SessionUnavailable:
        """The sandbox ended under a call. It is released before the caller hears of it, so a
        resume right after can never race this sandbox's cleanup for the volume.

        The wire fails its calls only after `_on_wire_closed` has run, so `lost_detail` is set.
        """
        self.release()
        return SessionUnavailable(self.lost_detail or "the session's sandbox ended")

    def _running(self) -> KernelChannel:
        channel = self.channel
        if self.state is not State.RUNNING or channel is None or channel.closed.is_set():
            detail = self.lost_detail or f"the session's sandbox is {self.state.value}"
            raise SessionUnavailable(detail)
        return channel

    def _channel(self) -> KernelChannel:
        assert self.channel is not None, "launch first"
        return self.channel

    def _on_wire_closed(self) -> None:
        """Called by the wire's reader when the sandbox's stdout ends."""
        if self.state is not State.RUNNING:
            return  # our own pause or stop
        self.state = State.LOST
        limit = self.parts.spec.limits.memory_mb
        oom = self.parts.cgroup.oom_kills()
        self.lost_detail = (
            f"the session ran out of memory (limit {limit} MB) and ended; its workspace is kept"
            if oom
            else "the session's kernel exited; its workspace is kept"
        )
        threading.Thread(target=self.release, name="session-release", daemon=True).start()

    def release(self) -> list[str]:
        """Remove the sandbox from the host (once); return what is still there."""
        with self._life_lock:
            if self._problems is None:
                self._problems = self._release_all()
            return self._problems

    def _release_all(self) -> list[str]:
        problems: list[str] = []
        for step in (self._stop_container, self._empty_cgroup, self.parts.scratch.teardown):
            try:
                problems += step()
            except (OSError, RunscError, subprocess.SubprocessError) as exc:
                problems.append(f"{step.__name__}: {exc}")
        if self.parts.runsc.has_state(self.sandbox_id):
            problems.append("runsc container state")
        problems += wait_until_gone(self.sandbox_id)
        if problems:
            log.warning("session sandbox %s not released: %s", self.sandbox_id, problems)
        return problems

    def _stop_container(self) -> list[str]:
        proc, runsc = self.proc, self.parts.runsc
        if self.channel is not None:
            self.channel.close()
        if proc is not None and self.state is State.PAUSING:
            waited(proc, EXIT_WAIT_S)  # a checkpoint ends the sandbox by itself
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(RunscError):  # the cgroup sweep below needs no runsc
                runsc.kill_all(self.sandbox_id)
            if not waited(proc, EXIT_WAIT_S):
                self.parts.cgroup.kill_all()
                waited(proc, EXIT_WAIT_S)
        if runsc.has_state(self.sandbox_id):
            runsc.delete(self.sandbox_id)
        return []

    def _empty_cgroup(self) -> list[str]:
        cgroup = self.parts.cgroup
        if not cgroup.kill_all(timeout_s=RELEASE_WAIT_S):
            return ["processes left in the cgroup"]
        # Generous: a loaded host can take seconds to let exiting tasks leave the cgroup.
        return [] if cgroup.remove(timeout_s=RELEASE_WAIT_S) else [f"cgroup {cgroup.relpath}"]

    def _diagnosis(self) -> str:
        """What runsc and the kernel said before the wire was up (never shown to tenants)."""
        said = _tail(self.parts.scratch.stderr)
        return f"{said or 'nothing on stderr'} | runsc log: {_tail(self.parts.scratch.log)}"


def _first_of(a: threading.Event, b: threading.Event, timeout_s: float) -> threading.Event | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in (a, b):
            if event.is_set():
                return event
        a.wait(0.02)
    return None


def _tail(path: Path, limit: int = 1000) -> str:
    try:
        with path.open("rb") as file:
            return file.read()[-limit:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
