"""The composition root: the only module that picks adapters."""

import logging
import os
import secrets
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import create_engine

from sandcell.api.app import create_app
from sandcell.api.deps import Services
from sandcell.api.direct import install_direct
from sandcell.api.internal import create_internal_app
from sandcell.artifacts.filesystem import FilesystemBlobStore
from sandcell.domain.errors import ImageUnavailable, RuntimeUnavailable
from sandcell.egress.validation import EgressValidator
from sandcell.ports.egress import Egress
from sandcell.ports.notify import Notifier
from sandcell.ports.runtime import Runtime
from sandcell.ports.secrets import NetworkValidator
from sandcell.ports.sessions import SessionPool
from sandcell.remote.guest_channel import SocketGuestChannels
from sandcell.remote.session_client import HttpSessionHosts
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.runtime.session import GVisorSessionRuntime
from sandcell.runtime.volatile import ensure_tmpfs, volatile_dir
from sandcell.services.auth import AuthService
from sandcell.services.direct_cells import DirectCells, DirectTokens
from sandcell.services.files import FileService
from sandcell.services.jobs import JobPolicy, JobService
from sandcell.services.secrets import SecretService
from sandcell.services.session_host import LocalSessionHost
from sandcell.services.sessions import SessionPolicy, SessionService
from sandcell.services.worker import BASE_ENV, Worker, WorkerConfig, new_worker_id
from sandcell.settings import Settings
from sandcell.store.overview import SqlOverview
from sandcell.store.sql import SqlStore, open_sqlite
from sandcell.vault.fernet import FernetCipher

log = logging.getLogger("sandcell")


def build_store(settings: Settings) -> SqlStore:
    url = settings.store_url
    if url.startswith("sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        store = open_sqlite(url)
    else:
        url = url.replace("postgresql://", "postgresql+psycopg://", 1)
        store = SqlStore(create_engine(url, pool_pre_ping=True, pool_size=10))
    store.create_schema()
    return store


def build_notifier(settings: Settings) -> Notifier:
    """Wake-ups between this process and the others on the same store (see ports/notify.py)."""
    if settings.store_url.startswith("sqlite"):
        from sandcell.store.notify_local import SocketNotifier

        return SocketNotifier(settings.data_dir / "notify")  # every process on this SQLite file
    from sandcell.store.notify_pg import PostgresNotifier

    notifier = PostgresNotifier(settings.store_url)
    notifier.wait_listening(NOTIFY_CONNECT_S)  # else the first wake-ups could go unheard
    return notifier


NOTIFY_CONNECT_S = 5.0


def signing_key(settings: Settings) -> bytes:
    """The HMAC key for signed URLs: configured, or made once and kept in the data dir."""
    return (settings.signing_key or _key_file(settings, "signing.key")).encode()


def _key_file(settings: Settings, name: str) -> str:
    """A random key made once (0600) in the data dir and shared by every local process."""
    path = settings.data_dir / name
    if not path.exists():
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_text().strip()
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
    return path.read_text().strip()


def internal_token(settings: Settings) -> str:
    return settings.internal_token or _key_file(settings, "internal.token")


def secret_cipher(settings: Settings) -> FernetCipher:
    if settings.secrets_key:
        return FernetCipher(settings.secrets_key.encode())
    return FernetCipher.from_key_file(settings.data_dir / "secrets.key")


def network_validator(settings: Settings) -> NetworkValidator | None:
    return EgressValidator() if settings.egress else None


def build_services(settings: Settings) -> Services:
    store = build_store(settings)
    blobs = FilesystemBlobStore(settings.blob_root)
    images = FilesystemImageCatalog(settings.image_dir)
    policy = JobPolicy(
        default_image=settings.default_image,
        default_limits=settings.default_limits,
        max_limits=settings.max_limits,
        quotas=settings.quotas,
    )
    jobs = JobService(
        store, blobs, images, policy, network_validator(settings), build_notifier(settings)
    )
    sessions = SessionService(
        store,
        HttpSessionHosts(internal_token(settings)),
        jobs.check,
        policy,
        SessionPolicy(),
        signing_key(settings),
        DirectTokens(internal_token(settings)),
    )
    return Services(
        store=store,
        images=images,
        auth=AuthService(store, settings.admin_key, jobs.notifier),
        jobs=jobs,
        sessions=sessions,
        files=FileService(store, blobs, signing_key(settings), settings.max_file_bytes),
        secrets=SecretService(store, secret_cipher(settings)),
        signed_url_ttl_s=settings.signed_url_ttl_s,
        default_image=settings.default_image,
    )


def build_api(settings: Settings) -> FastAPI:
    services = build_services(settings)
    app = create_app(
        services,
        max_json_bytes=settings.max_body_bytes,
        max_upload_bytes=settings.max_file_bytes + 64 * 1024,
        max_depth=settings.max_json_depth,
    )
    assert isinstance(services.store, SqlStore)
    app.state.overview = SqlOverview(services.store.reader)  # the admin dashboard's reads
    return app


def build_runtime(settings: Settings) -> Runtime:
    if settings.runtime == "gvisor":
        from sandcell.runtime.gvisor import GVisorRuntime

        return GVisorRuntime(settings.data_dir / "sandboxes")
    if settings.runtime == "bwrap":
        if not settings.allow_weak_isolation:
            raise RuntimeUnavailable(
                "the bwrap runtime shares the host kernel (namespaces + seccomp, no gVisor); "
                "set SANDCELL_ALLOW_WEAK_ISOLATION=1 to accept that, or use runtime gvisor"
            )
        from sandcell.runtime.bwrap import BwrapRuntime

        return BwrapRuntime(settings.data_dir / "bwrap")
    raise RuntimeUnavailable(
        f"unknown runtime {settings.runtime!r}; this build offers: gvisor, bwrap"
    )


def with_warm_pool(settings: Settings, runtime: Runtime) -> Runtime:
    """Jobs (gVisor or bwrap) take pre-started sandboxes when SANDCELL_POOL_SIZE asks for any.

    The pool starts filling when the worker reaps (the start of `Worker.serve`).
    """
    from sandcell.runtime.bwrap import BwrapRuntime
    from sandcell.runtime.gvisor import GVisorRuntime
    from sandcell.runtime.pool import PoolConfig, WarmPool
    from sandcell.runtime.pooled import PooledRuntime, warm_factory

    sizes = settings.pool_sizes
    if not isinstance(runtime, GVisorRuntime | BwrapRuntime) or not any(sizes.values()):
        return runtime
    config = PoolConfig(
        sizes, settings.default_limits, settings.pool_memory_mb, settings.pool_idle_s
    )
    images = FilesystemImageCatalog(settings.image_dir)
    return PooledRuntime(runtime, WarmPool(warm_factory(runtime), images, config))


def build_egress(settings: Settings) -> Egress | None:
    if not settings.egress:
        return None
    from sandcell.egress.gateway import ProxyEgress
    from sandcell.egress.policy import DEFAULT_PORTS
    from sandcell.egress.resolve import StaticResolver

    return ProxyEgress(
        settings.data_dir / "egress",
        allowed_networks=settings.egress_allowed_networks,
        ports=None if settings.egress_any_port else DEFAULT_PORTS,
        upstream_ca_file=settings.egress_upstream_ca_file or None,
        resolver=StaticResolver(settings.egress_hosts) if settings.egress_hosts else None,
    )


def build_worker(settings: Settings, url: str | None = None) -> Worker:
    """The worker; with `url`, also a session host reachable there (see build_internal_app)."""
    store = build_store(settings)
    runtime = build_runtime(settings)
    runtime.check()  # fail closed: no worker without the isolation it promises
    runtime = with_warm_pool(settings, runtime)
    config = WorkerConfig(
        worker_id=new_worker_id(),
        slots=settings.worker_slots,
        lease_s=settings.lease_s,
        heartbeat_s=settings.heartbeat_s,
        poll_s=settings.poll_s,
        idempotency_ttl_s=settings.idempotency_ttl_s,
        max_limits=settings.max_limits,
        drain_s=settings.drain_s,
        url=url,
    )
    blobs = FilesystemBlobStore(settings.blob_root)
    images = FilesystemImageCatalog(settings.image_dir)
    egress = build_egress(settings)
    secrets_service = SecretService(store, secret_cipher(settings))
    sessions = (
        build_session_host(settings, store, images, config.worker_id, egress, secrets_service)
        if url
        else None
    )
    channels = guest_channels(settings.data_dir)
    notifier = build_notifier(settings)
    return Worker(
        store, blobs, runtime, images, config, egress, secrets_service, sessions, channels, notifier
    )


def guest_channels(data_dir: Path) -> SocketGuestChannels:
    """Each job's socket directory is made and removed on sandcell's tmpfs, not on the data
    dir's disk, where a new inode costs a scan that grows with the job rate (volatile.py)."""
    ensure_tmpfs()
    return SocketGuestChannels(volatile_dir(data_dir / "channels"))


def build_session_host(
    settings: Settings,
    store: SqlStore,
    images: FilesystemImageCatalog,
    worker_id: str,
    egress: Egress | None,
    secrets_service: SecretService,
) -> LocalSessionHost:
    runtime = GVisorSessionRuntime(settings.data_dir / "session-sandboxes")
    runtime.check()  # fail closed, as for jobs
    # Sandboxes of a crashed predecessor; paused sessions live in state_root and are kept.
    runtime.reap()
    state_root = settings.data_dir / "sessions"
    pool = build_session_pool(settings, runtime, images, state_root)
    return LocalSessionHost(
        store, runtime, images, state_root, worker_id, egress, secrets_service, pool
    )


def build_session_pool(
    settings: Settings,
    runtime: GVisorSessionRuntime,
    images: FilesystemImageCatalog,
    state_root: Path,
) -> SessionPool | None:
    """Pre-started session kernels when SANDCELL_SESSION_POOL_SIZE asks for any; they live
    next to the sessions' state dirs (a take-over renames one into place)."""
    from sandcell.runtime.pool import PoolConfig
    from sandcell.runtime.session_pool import SESSION_PRELOADS, SessionPool

    sizes = {
        name: size
        for name, size in settings.session_pool_sizes.items()
        if size and _can_host_kernels(images, name)
    }
    if not sizes:
        return None
    config = PoolConfig(
        sizes,
        settings.default_limits,
        settings.session_pool_memory_mb,
        settings.pool_idle_s,
        preloads=SESSION_PRELOADS,
        preload_mb={},  # a session's own memory_mb pays for what it imports, as if cold
    )
    pool = SessionPool(runtime, images, config, state_root / ".pool", BASE_ENV)
    pool.start()
    return pool


def _can_host_kernels(images: FilesystemImageCatalog, name: str) -> bool:
    """An image without IPython would boot kernels that fail, over and over."""
    try:
        if images.get(name).kernel:
            return True
    except ImageUnavailable:
        return True  # not built yet: the pool waits for it like for any image
    log.warning("SANDCELL_SESSION_POOL_SIZE: image %r has no IPython; no kernels pooled", name)
    return False


def build_internal_app(settings: Settings, worker: Worker) -> FastAPI:
    """The worker's internal endpoint, through which API replicas drive its sessions; and at
    /direct, the sessions' cells sent straight to it with a token the API minted."""
    assert isinstance(worker.sessions, LocalSessionHost)
    token = internal_token(settings)
    app = create_internal_app(worker.sessions, worker.store, token)
    cells = DirectCells(worker.sessions, worker.store, DirectTokens(token))
    install_direct(app, cells, settings.max_body_bytes, settings.max_json_depth)
    return app
