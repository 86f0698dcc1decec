import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient

from sandcell.api.app import create_app
from sandcell.api.deps import Services
from sandcell.artifacts.filesystem import FilesystemBlobStore
from sandcell.domain.limits import Limits
from sandcell.domain.records import WorkerInfo
from sandcell.egress.validation import EgressValidator
from sandcell.services.auth import AuthService
from sandcell.services.direct_cells import DirectTokens
from sandcell.services.files import FileService
from sandcell.services.jobs import JobPolicy, JobService
from sandcell.services.secrets import SecretService
from sandcell.services.session_host import LocalSessionHost
from sandcell.services.sessions import SessionPolicy, SessionService
from sandcell.store.overview import SqlOverview
from sandcell.store.sql import SqlStore, open_sqlite
from sandcell.vault.fernet import FernetCipher
from tests.fakes import FakeImages, FakeSessionRuntime, InProcessHosts

ADMIN_KEY = "test-admin-key-0123456789"
INTERNAL_TOKEN = "test-internal-token-0123456789"  # what API and worker share


@dataclass
class Api:
    http: TestClient
    services: Services
    blobs: FilesystemBlobStore
    tmp: Path
    session_host: LocalSessionHost
    session_runtime: FakeSessionRuntime

    def tenant(self, name: str) -> dict[str, str]:
        """A new tenant's Authorization header."""
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        tenant = self.http.post("/v1/admin/tenants", json={"name": name}, headers=admin).json()
        key = self.http.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=admin).json()
        return {"Authorization": f"Bearer {key['key']}"}


def sqlite_store(path: Path) -> SqlStore:
    store = open_sqlite(f"sqlite:///{path}")
    store.create_schema()
    return store


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with build_api(tmp_path) as built:
        yield built


@contextmanager
def build_api(tmp_path: Path, store: SqlStore | None = None) -> Iterator[Api]:
    """The real app over SQLite (or `store`), with fakes for images and the session runtime."""
    store = store or sqlite_store(tmp_path / "test.db")
    blobs = FilesystemBlobStore(tmp_path / "blobs")
    images = FakeImages("python")
    policy = JobPolicy("python", Limits(), Limits(timeout_s=600, memory_mb=4096))
    jobs = JobService(store, blobs, images, policy, EgressValidator())
    session_runtime = FakeSessionRuntime()
    host = LocalSessionHost(store, session_runtime, images, tmp_path / "sessions", "wrk_local")
    store.worker_seen(
        WorkerInfo("wrk_local", "here", "fake", "1", time.time(), "inproc"), time.time()
    )
    sessions = SessionService(
        store,
        InProcessHosts(host),
        jobs.check,
        policy,
        SessionPolicy(default_image="python", idle_timeout_s=60),
        b"p" * 32,
        DirectTokens(INTERNAL_TOKEN),
    )
    services = Services(
        store=store,
        images=images,
        auth=AuthService(store, ADMIN_KEY, jobs.notifier),  # as the composition root
        jobs=jobs,
        sessions=sessions,
        files=FileService(store, blobs, b"k" * 32, 1024 * 1024),
        secrets=SecretService(store, FernetCipher(Fernet.generate_key())),
        signed_url_ttl_s=60,
        default_image="python",
    )
    app = create_app(
        services, max_json_bytes=256 * 1024, max_upload_bytes=1024 * 1024 + 4096, max_depth=16
    )
    app.state.overview = SqlOverview(store.reader)  # the admin dashboard's reads
    with TestClient(app, raise_server_exceptions=False) as http:
        yield Api(http, services, blobs, tmp_path, host, session_runtime)


def is_root() -> bool:
    return os.geteuid() == 0
