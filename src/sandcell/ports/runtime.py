"""The isolation runtime port: run one sandbox to its end under a budget.

A runtime owns everything on the host that a sandbox needs (bundle, scratch disk, cgroups,
processes) and releases all of it before `run` returns.
"""

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.egress import EgressAttachment


@dataclass(frozen=True)
class InputFile:
    host_path: Path  # a trusted, readable file on the host
    guest_path: str  # relative path under /input, already validated


@dataclass(frozen=True)
class SandboxSpec:
    sandbox_id: str  # unique per attempt; names the runsc container, cgroup and scratch dir
    image: Image
    argv: list[str]  # argv[0] absolute; the code, if any, is at /job/main.py
    env: dict[str, str]
    limits: Limits
    code: bytes | None = None
    inputs: list[InputFile] = field(default_factory=list)
    egress: EgressAttachment | None = None  # None: no network at all
    # Retries: committed stage files put back under /output before the program starts.
    restore_outputs: list[InputFile] = field(default_factory=list)
    # The guest channel's socket directory (commit_stage, once), mounted at GUEST_CHANNEL_DIR.
    guest_channel: Path | None = None


GUEST_CHANNEL_DIR = "/run/sandcell/guest"
GUEST_CHANNEL_SOCKET = "guest.sock"


class SandboxSink(Protocol):
    """Where a running sandbox reports to. Called from the runtime's threads."""

    def ready(self) -> None:
        """The sandbox is up and the program is about to run."""

    def output(self, stream: str, data: bytes) -> None:
        """A chunk of "stdout" or "stderr", already within the output budget."""

    def output_file(self, path: str, content: BinaryIO, size: int) -> None:
        """A regular file the program left in /output (path relative to /output)."""


@runtime_checkable
class PoolReporter(Protocol):
    """A runtime (or session host) with warm pools; the worker's heartbeat publishes these.

    Figures, JSON-safe: {"ready": {image: n}, "target": {image: n}, "memory_bytes": int,
    "memory_limit_bytes": int, "hits": {image: n}, "misses": {image: n},
    "refused": {image: n}, "shrunk": int, "boot_failures": int}.
    """

    def pool_figures(self) -> dict[str, Any]: ...


@runtime_checkable
class HealthReporter(Protocol):
    """A runtime that reports on its host; the worker's heartbeat publishes these.

    Figures, JSON-safe counts: {"quarantined_uids": n}, the sandbox uids a process was still
    running as after its sandbox's release (bwrap), each never handed out again.
    """

    def health_figures(self) -> dict[str, int]: ...


@runtime_checkable
class PlacedSink(Protocol):
    """A sink that wants to know when its sandbox is not `spec.sandbox_id` (a warm one)."""

    def placed(self, sandbox_id: str) -> None:
        """The program will run in `sandbox_id`; called before `ready`."""


@runtime_checkable
class EarlySink(Protocol):
    """A sink that takes the program's result before the sandbox is released.

    A warm sandbox's runner says when the job's code is done (see runtime/streams.py); gVisor's
    own teardown and the verified release then take another ~20 ms, which the job's caller
    need not wait for. A one-shot sandbox reports once it has exited and its outputs are
    collected, before its cgroup and scratch disk are removed and checked (10-30 ms).
    `ended` is called at most once, from `run`'s own thread, with a final result (outputs
    collected, `released` False); `run` still releases everything before it returns, and
    returns that same result with `released` set. Only an exit within every limit (reason
    None or exit_code) is reported early: a limit's end waits for the release.
    """

    def ended(self, result: "SandboxResult") -> None: ...


@dataclass
class SandboxResult:
    exit_code: int | None
    reason: Reason | None  # None: the program exited 0 within every limit
    detail: str = ""
    usage: dict[str, float] = field(default_factory=dict)
    released: bool = False  # every process gone and every host resource removed, verified
    pooled: bool = False  # ran in a warm sandbox booted before the job (see runtime/pool.py)


@runtime_checkable
class Closeable(Protocol):
    """A runtime (or the guest channels) that holds something between runs (a warm pool, its
    parent cgroup, a directory): the worker closes it once it is done with it."""

    def close(self) -> None: ...


class Runtime(Protocol):
    name: str

    def version(self) -> str: ...

    def check(self) -> None:
        """Raise RuntimeUnavailable unless sandboxes can start with every protection applied."""

    def run(self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event) -> SandboxResult:
        """Run the sandbox to its end (exit, limit, or `cancel` set); release everything."""

    def reap(self) -> list[str]:
        """Remove sandboxes and scratch left by an earlier crash; return what was removed."""


class GuestChannelHandle(Protocol):
    directory: Path  # holds GUEST_CHANNEL_SOCKET; the runtime mounts it at GUEST_CHANNEL_DIR

    def close(self) -> None: ...


class GuestChannels(Protocol):
    def open(self, sandbox_id: str, recorder: Any) -> GuestChannelHandle:
        """Serve `recorder` (commit_stage, once, completed) on a socket for one attempt."""

    def reap(self) -> list[str]:
        """Remove what an earlier crash left; call it before the first `open`."""
