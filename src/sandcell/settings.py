"""One Settings object; every field is also a SANDCELL_* environment variable."""

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sandcell.domain.limits import Limits
from sandcell.domain.quotas import Quotas


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDCELL_", extra="ignore")

    data_dir: Path = Path("/var/lib/sandcell")
    image_dir: Path = Path("/var/lib/sandcell/images")
    database_url: str = ""  # empty: SQLite in data_dir
    # Artifacts and files; scale-out: one directory every API replica and worker shares.
    blob_dir: Path | None = None  # None: data_dir/blobs
    host: str = "127.0.0.1"
    port: int = 8080
    admin_key: str = Field(default="", repr=False)
    signing_key: str = Field(default="", repr=False)  # empty: generated once into data_dir
    internal_token: str = Field(default="", repr=False)  # API → worker; empty: made in data_dir
    worker_listen: str = "127.0.0.1:0"  # the worker's internal session endpoint
    secrets_key: str = Field(default="", repr=False)  # Fernet key; empty: made in data_dir
    egress: bool = True  # jobs may ask for network through the egress proxy
    egress_allowed_networks: list[str] = []  # operator: private ranges the proxy may reach
    egress_upstream_ca_file: str = ""  # operator: CA bundle for upstream TLS (empty: system)
    egress_any_port: bool = False  # operator: upstream ports beyond 80 and 443
    egress_hosts: dict[str, str] = {}  # operator: pinned name → address (replaces DNS)
    runtime: str = "gvisor"
    allow_weak_isolation: bool = False
    default_image: str = "python"

    default_timeout_s: float = 60.0
    default_memory_mb: int = 512
    default_cpu: float = 1.0
    default_pids: int = 128
    default_disk_mb: int = 256
    default_output_mb: float = 10.0
    max_timeout_s: float = 3600.0
    max_memory_mb: int = 8192
    max_cpu: float = 2.0
    max_pids: int = 1024
    max_disk_mb: int = 10240
    max_output_mb: float = 100.0

    quota_concurrent_jobs: int = 16
    quota_sessions: int = 4
    quota_storage_mb: int = 10240
    quota_jobs_per_minute: float = 600.0
    quota_burst: int = 60

    max_body_bytes: int = 2 * 1024 * 1024
    max_json_depth: int = 32
    max_file_bytes: int = 512 * 1024 * 1024
    idempotency_ttl_s: float = 48 * 3600
    signed_url_ttl_s: float = 3600

    worker_slots: int = 2
    lease_s: float = 15.0
    heartbeat_s: float = 2.0
    poll_s: float = 1.0  # fallback claim poll: submits wake workers by notification
    drain_s: float = 30.0  # graceful stop: how long running jobs may take to finish
    # Warm pools (gvisor): pre-started sandboxes per image, "IMAGE=N,..."; empty or 0: none.
    # One python sandbox idles at ~25 MB; a python-data one (pandas, matplotlib imported)
    # at ~140 MB and costs ~2.5 CPU-s to warm, so it is opt-in on a small host.
    pool_size: str = "python=1"
    pool_memory_mb: int = 1024  # every warm sandbox together, measured in their cgroups
    pool_idle_s: float = 600.0  # an image's pool is emptied after this long without a job
    # Session pools: pre-started session kernels per image (python-data: pandas, numpy and
    # matplotlib imported), "IMAGE=N,..."; empty or 0: none. One idles at ~150 MB; the
    # default session image gets one, emptied after pool_idle_s without a session.
    session_pool_size: str = "python-data=1"
    session_pool_memory_mb: int = 512  # every pooled kernel together, measured

    @field_validator("pool_size", "session_pool_size")
    @classmethod
    def _pool_sizes_parse(cls, text: str) -> str:
        parse_pool_sizes(text)  # a malformed size stops serve and the worker before they start
        return text

    @property
    def pool_sizes(self) -> dict[str, int]:
        return parse_pool_sizes(self.pool_size)

    @property
    def session_pool_sizes(self) -> dict[str, int]:
        return parse_pool_sizes(self.session_pool_size)

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "sandcell.db"

    @property
    def blob_root(self) -> Path:
        return self.blob_dir or self.data_dir / "blobs"

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{self.sqlite_path}"

    @property
    def default_limits(self) -> Limits:
        return Limits(
            timeout_s=self.default_timeout_s,
            cpu=self.default_cpu,
            memory_mb=self.default_memory_mb,
            pids=self.default_pids,
            disk_mb=self.default_disk_mb,
            output_mb=self.default_output_mb,
        )

    @property
    def quotas(self) -> Quotas:
        return Quotas(
            concurrent_jobs=self.quota_concurrent_jobs,
            sessions=self.quota_sessions,
            storage_mb=self.quota_storage_mb,
            jobs_per_minute=self.quota_jobs_per_minute,
            burst=self.quota_burst,
        )

    @property
    def max_limits(self) -> Limits:
        return Limits(
            timeout_s=self.max_timeout_s,
            cpu=self.max_cpu,
            memory_mb=self.max_memory_mb,
            pids=self.max_pids,
            disk_mb=self.max_disk_mb,
            output_mb=self.max_output_mb,
        )


def parse_pool_sizes(text: str) -> dict[str, int]:
    """ "python=2,python-data=1" -> {"python": 2, "python-data": 1}; "" or "0": no pool.
    ValueError if malformed."""
    if text.strip() == "0":
        return {}
    sizes: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, count = item.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit():
            raise ValueError(f"pool size {item!r} is not IMAGE=COUNT")
        sizes[name.strip()] = int(count)
    return sizes
