"""Fakes for fast unit tests of logic. Security and lifecycle tests use the real runtime."""

import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from sandcell.domain.errors import ImageUnavailable
from sandcell.domain.images import Image
from sandcell.domain.states import Reason
from sandcell.ports.egress import EgressAttachment, SecretBinding
from sandcell.ports.runtime import SandboxResult, SandboxSink, SandboxSpec
from sandcell.ports.sessions import SessionSpec

FAKE_IMAGE = Image("python", "test", "sha256:" + "0" * 64, Path("/"), "/usr/bin/python3.11")


class FakeImages:
    def __init__(self, *names: str) -> None:
        self._names = list(names or ["python"])

    def get(self, name: str) -> Image:
        if name not in self._names:
            raise ImageUnavailable(f"image {name!r} is not built")
        return FAKE_IMAGE

    def names(self) -> list[str]:
        return list(self._names)


class HostProcessRuntime:
    """Runs trusted test code as a host subprocess: no isolation, only for logic tests."""

    name = "fake"

    def version(self) -> str:
        return "fake 1"

    def check(self) -> None:
        return None

    def reap(self) -> list[str]:
        return []

    def run(self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event) -> SandboxResult:
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch, "output")
            out.mkdir()
            code = (spec.code or b"").decode().replace("/output/", f"{out}/")
            proc = subprocess.Popen(
                ["/usr/bin/python3.11", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            sink.ready()
            deadline = time.monotonic() + spec.limits.timeout_s
            reason = None
            while proc.poll() is None:
                if cancel.is_set():
                    reason = Reason.CANCELLED
                elif time.monotonic() > deadline:
                    reason = Reason.TIMEOUT
                if reason:
                    proc.kill()
                time.sleep(0.01)
            stdout, stderr = proc.communicate()
            sink.output("stdout", stdout)
            sink.output("stderr", stderr)
            for name in sorted(os.listdir(out)):
                with open(out / name, "rb") as content:
                    sink.output_file(name, content, os.path.getsize(out / name))
        if reason is None and proc.returncode:
            reason = Reason.EXIT_CODE
        return SandboxResult(proc.returncode, reason, released=True)


class FakeEgressSession:
    def __init__(self, root: Path, allow: list[str], secrets: list[SecretBinding]) -> None:
        self.attachment = EgressAttachment(root, root / "ca.pem")
        self.allow, self.secrets, self.closed = allow, secrets, False

    def env(self) -> dict[str, str]:
        return {"HTTPS_PROXY": "http://127.0.0.1:3128"}

    def events(self) -> list[dict[str, object]]:
        return [{"host": h, "port": 443, "decision": "allowed"} for h in self.allow]

    def close(self) -> None:
        self.closed = True


class FakeEgress:
    """Records what the worker asked of the proxy; no traffic flows."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sessions: list[FakeEgressSession] = []

    def reap(self) -> list[str]:
        return []

    def open(
        self, session_id: str, allow: list[str], secrets: list[SecretBinding], image_ca: Path
    ) -> FakeEgressSession:
        session = FakeEgressSession(self.root, allow, secrets)
        self.sessions.append(session)
        return session


class FakeSessionSandbox:
    """Executes trusted test code in-process; enough to test the session service's logic."""

    def __init__(self, spec: SessionSpec) -> None:
        self.sandbox_id = spec.sandbox_id
        self.workspace = spec.state_dir / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.namespace: dict[str, object] = {}
        self.stopped = False
        self.memory_restored = False
        self.interrupts = 0  # how often the host asked: a cell here never runs long

    def execute(self, code: str, timeout_s: float, on_event: object = None) -> dict[str, object]:
        import contextlib
        import io

        out = io.StringIO()
        error = None
        with contextlib.redirect_stdout(out):
            try:
                exec(code, self.namespace)
            except Exception as exc:
                error = {"ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
        if callable(on_event) and out.getvalue():
            on_event({"type": "stdout", "text": out.getvalue()})
        return {
            "stdout": out.getvalue(),
            "stderr": "",
            "result": None,
            "display": [],
            "error": error,
            "timed_out": False,
            "interrupted": False,
        }

    def interrupt(self) -> None:
        self.interrupts += 1

    def memory_bytes(self) -> int:
        return 1

    def pause(self) -> bool:
        self.stopped = True
        return False

    def stop(self) -> bool:
        self.stopped = True
        return True

    def http(self, port: int, method: str, target: str, headers: object, body: bytes) -> tuple:
        return 200, [("Content-Type", "text/plain")], f"{method} {target} on {port}".encode()


class FakeSessionRuntime:
    name = "fake"

    def __init__(self) -> None:
        self.sandboxes: list[FakeSessionSandbox] = []

    def start(self, spec: SessionSpec) -> FakeSessionSandbox:
        self.sandboxes.append(FakeSessionSandbox(spec))
        return self.sandboxes[-1]

    def resume(self, spec: SessionSpec) -> FakeSessionSandbox:
        return self.start(spec)


class InProcessHosts:
    def __init__(self, host: object) -> None:
        self._host = host

    def host(self, worker: object) -> object:
        return self._host
