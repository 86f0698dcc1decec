"""The OpenAPI document against the real app: schemathesis fuzzes every documented operation.

Runs in-process (ASGI) against the app that `tests/conftest.py` builds (SQLite, fake image
catalog and session runtime; no runsc). It fails on any 5xx, on any response that the document
does not describe (status code, content type, body, headers) and on any cross-tenant 2xx.

Two tenants: the *owner* holds one of each resource (a file, a job with a log and an
artifact, a running session with a file, a secret); the *intruder* sends every generated case.
For operations that take an id, each generated case is also replayed with the owner's real
ids, once as the owner (so the document is checked on the paths that answer 2xx) and once as
the intruder, who must get 404 where the owner got 2xx and never a 2xx. Admin operations are
sent with the admin key, and replayed with the intruder's key, which must never get a 2xx.

Not fuzzed, because they are not in the OpenAPI document (nothing here skips them silently):
`/metrics` is a mounted Prometheus ASGI app (text exposition format, no schema to check) and
`/v1/previews/{token}/...` relays raw HTTP to a port inside a session sandbox, which only the
real runtime has.

Bounded and deterministic: a fixed seed, derandomized generation, no example database, and
`EXAMPLES` fuzzed cases per operation (plus the explicit and coverage phases).
"""

import dataclasses
import io
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis import Case

from sandcell.api.routes import MAX_WAIT_S
from sandcell.domain.ids import new_id
from sandcell.domain.records import Artifact
from sandcell.domain.states import JobState
from tests.conftest import ADMIN_KEY, Api, build_api

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SEED = 7_2024
EXAMPLES = 30
OWNER_SECRET = "owner-only-secret"
SESSION_FILE = "owned.txt"
SAFE_CELL = "print('owned')"
MAX_CELL = 1_000_000  # ExecuteIn.code's maxLength
WAIT_S = 0.2


@dataclasses.dataclass
class World:
    """The app, two tenants, and the owner's resources (recreated when a replay removed them)."""

    api: Api
    owner: dict[str, str]
    intruder: dict[str, str]
    tenant_id: str
    file_id: str = ""
    job_id: str = ""
    artifact_id: str = ""
    session_id: str = ""
    owner_ids: set[str] = dataclasses.field(default_factory=set)

    def http(self, method: str, url: str, **kwargs: Any) -> Any:
        response = self.api.http.request(method, url, headers=self.owner, **kwargs)
        assert response.status_code < 300, (method, url, response.status_code, response.text)
        return response.json() if response.content else None

    def seed(self) -> None:
        self._own(OWNER_SECRET)
        self._job_with_output()
        self.refresh()

    def refresh(self) -> None:
        store = self.api.services.store
        if not self.file_id or store.get_file(self.tenant_id, self.file_id) is None:
            stored = self.api.http.post(
                "/v1/files", files={"file": ("owned.csv", b"a,b\n1,2\n")}, headers=self.owner
            ).json()
            self.file_id = self._own(stored["id"])
        session = store.get_session(self.tenant_id, self.session_id) if self.session_id else None
        if session is not None and session.state.value == "paused":
            self.http("POST", f"/v1/sessions/{self.session_id}/resume")
        elif session is None or session.state.value != "running":
            self.session_id = self._own(self.http("POST", "/v1/sessions", json={})["id"])
            self.http("PUT", f"/v1/sessions/{self.session_id}/files/{SESSION_FILE}", content=b"x")
        if OWNER_SECRET not in {s["name"] for s in self.http("GET", "/v1/secrets")["items"]}:
            self.http("POST", "/v1/secrets", json={"name": OWNER_SECRET, "value": "s3cret"})

    def _own(self, resource_id: str) -> str:
        self.owner_ids.add(resource_id)
        return resource_id

    def _job_with_output(self) -> None:
        """A completed job with a log line and an artifact, as a worker would leave it."""
        store = self.api.services.store
        job_id = self.http("POST", "/v1/jobs", json={"code": "print(1)"})["id"]
        job = store.claim_next("wrk_local", time.time(), 3600)
        assert job is not None and job.id == job_id, "the owner's job must be the only one queued"
        content = b"result\n"
        sha256, size = self.api.blobs.put(io.BytesIO(content))
        artifact = Artifact(
            new_id("art"), self.tenant_id, job.id, "result.txt", size, sha256, time.time()
        )
        store.mark_started(job.id, job.fencing_token, time.time(), "sha256:" + "0" * 64, "sbx-1")
        store.append_log(job.id, job.fencing_token, "stdout", b"hello\n")
        store.add_artifact(artifact, job.fencing_token)
        done = store.get_job(None, job.id)
        assert done is not None
        done = dataclasses.replace(
            done, state=JobState.COMPLETED, exit_code=0, finished_at=time.time()
        )
        store.finish_job(done, job.fencing_token)
        self.job_id, self.artifact_id = self._own(job.id), self._own(artifact.id)

    def retirable_job(self) -> str:
        """A terminal job of the owner's that a replayed DELETE may retire."""
        job_id = self.http("POST", "/v1/jobs", json={"code": "print(2)"})["id"]
        self.http("POST", f"/v1/jobs/{job_id}/cancel")
        return self._own(job_id)

    def owned_value(self, case: Case, name: str) -> Any:
        """The owner's resource for a path parameter, or None to keep the generated value."""
        if name == "job_id":
            return self.retirable_job() if case.method == "DELETE" else self.job_id
        if name == "path":  # a download reads the owner's file; an upload writes anywhere
            return SESSION_FILE if case.method == "GET" else None
        return {
            "file_id": self.file_id,
            "artifact_id": self.artifact_id,
            "session_id": self.session_id,
            "name": OWNER_SECRET,
        }.get(name)

    def prepare(self, template: str) -> None:
        """Bring the owner's resources into a state where an operation on them can succeed."""
        self.refresh()
        if template.endswith("/resume"):
            self.http("POST", f"/v1/sessions/{self.session_id}/pause")


def _tenant(api: Api, name: str, **quotas: int) -> tuple[str, dict[str, str]]:
    body = {"name": name, "quotas": quotas}
    tenant = api.http.post("/v1/admin/tenants", json=body, headers=ADMIN).json()
    key = api.http.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()
    return tenant["id"], {"Authorization": f"Bearer {key['key']}"}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with build_api(tmp_path) as api:
        # The owner submits a job for every replayed retirement: no rate limit in the way.
        owner_tenant, owner = _tenant(api, "owner", jobs_per_minute=10**6, burst=10**6)
        _, intruder = _tenant(api, "intruder")  # the default quotas: fuzzing meets the 429s
        built = World(api, owner, intruder, owner_tenant)
        built.seed()
        yield built


# Statuses that reject a request the document says is invalid: the defaults, and 413 from the
# body guard (a body over the size limit is refused before it is parsed).
REJECTED = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
# Statuses that answer a request the document says is valid: the defaults less 5xx.
ACCEPTED: list[int | str] = ["2xx", "3xx", 401, 403, 404, 409, 429]
# ... and a 422 for a value the document cannot rule out (see where it is used).
ACCEPTED_OR_422 = [*ACCEPTED, 422]
CONFIG: dict[str, Any] = {
    "seed": SEED,
    "generation": {
        "mode": "all",
        "max-examples": EXAMPLES,
        "deterministic": True,
        "database": "none",
        # The test sends the keys itself (the intruder's, the owner's or the admin's); a
        # missing or wrong key is what the `ignored_auth` check probes.
        "with-security-parameters": False,
    },
    "checks": {
        # On by default; named so that no upgrade turns off what this test is for.
        "not_a_server_error": {"enabled": True},
        "status_code_conformance": {"enabled": True},
        "content_type_conformance": {"enabled": True},
        "response_schema_conformance": {"enabled": True},
        "response_headers_conformance": {"enabled": True},
        "ignored_auth": {"enabled": True},
        "negative_data_rejection": {"expected-statuses": REJECTED},
    },
    "operations": [
        {
            # A cursor is opaque: one the API did not issue is refused (422), whatever its
            # characters.
            "include-name": "GET /v1/jobs",
            "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED_OR_422}},
        },
        {
            # What a job or a session may ask for depends on the server's state, which the
            # document cannot say: the images built, the tenant's maxima for limits, the input
            # files and secrets that exist. Asking for something else is refused with 422.
            "include-name": ["POST /v1/jobs", "POST /v1/sessions"],
            "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED_OR_422}},
        },
        {
            # A workspace path is also refused (422) for what a pattern cannot say: '..', '.'
            # or empty segments, and a segment longer than the file system allows in bytes.
            "include-name": [
                "GET /v1/sessions/{session_id}/files",
                "GET /v1/sessions/{session_id}/files/{path}",
                "PUT /v1/sessions/{session_id}/files/{path}",
            ],
            "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED_OR_422}},
        },
        {
            # In multipart every mutated value (null, a number) reaches the server as the
            # bytes of a file, which is a valid upload; missing parts are still checked by the
            # other checks.
            "include-name": "POST /v1/files",
            "checks": {"negative_data_rejection": {"enabled": False}},
        },
    ],
}


def _document() -> dict[str, Any]:
    """The app's OpenAPI document (it depends on the routes only, not on any state)."""
    with tempfile.TemporaryDirectory() as tmp, build_api(Path(tmp)) as api:
        document: dict[str, Any] = api.http.get("/openapi.json").json()
        return document


schema = schemathesis.openapi.from_dict(_document(), config=schemathesis.Config.from_dict(CONFIG))


def _never_shows_the_owners_ids(world: World) -> Callable[..., None]:
    def check(ctx: Any, response: Any, case: Case) -> None:
        seen = [i for i in world.owner_ids if i in response.text]
        assert not seen, f"the intruder's answer shows the owner's {seen}"

    return check


def _is_admin(case: Case) -> bool:
    return "admin" in (case.operation.tags or [])


@schema.parametrize()
@hypothesis.settings(
    deadline=timedelta(seconds=5),
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
def test_every_operation_matches_the_document(case: Case, world: World) -> None:
    # The document is the same for every app; requests (and schemathesis' own probes, such
    # as the one without a key) go to this test's app.
    case.operation.app = case.operation.schema.app = world.api.http.app
    if _is_admin(case):
        case.call_and_validate(headers=ADMIN)
        _not_2xx(case.call(headers=world.intruder), "a tenant key on an admin route")
        return
    _keep_waits_short(case)
    intruder_checks = [_never_shows_the_owners_ids(world)]
    case.call_and_validate(headers=world.intruder, additional_checks=intruder_checks)
    if not case.path_parameters:
        return
    world.prepare(case.operation.path)
    for name in list(case.path_parameters):
        value = world.owned_value(case, name)
        if value is not None:
            case.path_parameters[name] = value
    if case.operation.path.endswith("/execute") and isinstance(case.body, dict):
        _keep_cell_harmless(case.body)
    owners = case.call_and_validate(headers=world.owner)
    intruders = case.call(headers=world.intruder)
    _not_2xx(intruders, "the intruder on the owner's resource")
    if owners.status_code < 300:
        assert intruders.status_code == 404, (intruders.status_code, intruders.text)


def _keep_waits_short(case: Case) -> None:
    """No worker runs here, so a valid `wait` (`POST /v1/jobs?wait=`) would hold the request
    for all of it, past the example's deadline: a valid one is cut to WAIT_S, others kept."""
    wait = (case.query or {}).get("wait")
    if isinstance(wait, bool) or not isinstance(wait, (int, float, str)):
        return
    try:
        seconds = float(wait)
    except ValueError:
        return
    if 0 <= seconds <= MAX_WAIT_S:  # valid: the answer is the same, only sooner
        case.query["wait"] = min(seconds, WAIT_S)


def _keep_cell_harmless(body: dict[str, Any]) -> None:
    """The fake session runtime runs cells in this process: only code that cannot compile
    (which fuzzing produces) is kept, any code that would run is replaced by a harmless cell."""
    code = body.get("code")
    if not isinstance(code, str) or len(code) > MAX_CELL:
        return  # refused before it runs
    try:
        compile(code, "<cell>", "exec")
    except (SyntaxError, ValueError):
        return
    body["code"] = SAFE_CELL


def _not_2xx(response: Any, who: str) -> None:
    assert not 200 <= response.status_code < 300, (who, response.status_code, response.text)


def test_another_tenant_gets_404_on_every_operation_that_takes_an_id(world: World) -> None:
    """Deterministic: every id-taking tenant operation in the document, with the owner's ids."""
    doc = world.api.http.get("/openapi.json").json()
    bodies = {"/execute": {"code": SAFE_CELL}}
    checked = []
    for template, item in doc["paths"].items():
        if "{" not in template or template.startswith("/v1/admin/"):
            continue
        for method in item:
            world.prepare(template)
            url = template.format(
                job_id=world.retirable_job() if method == "delete" else world.job_id,
                file_id=world.file_id,
                artifact_id=world.artifact_id,
                session_id=world.session_id,
                name=OWNER_SECRET,
                path=SESSION_FILE,
                port=8080,
            )
            body = next((b for suffix, b in bodies.items() if template.endswith(suffix)), None)
            other = world.api.http.request(method, url, json=body, headers=world.intruder)
            assert other.status_code == 404, (method, url, other.status_code, other.text)
            assert other.headers["content-type"] == "application/problem+json"
            if "/content" in template:
                # Fetching bytes is allowed with a signed URL instead of a key; not without.
                anon = world.api.http.request(method, url)
                assert anon.status_code == 401, (method, url, anon.status_code)
            mine = world.api.http.request(method, url, json=body, headers=world.owner)
            assert mine.status_code < 300, (method, url, mine.status_code, mine.text)
            checked.append(f"{method.upper()} {template}")
    assert len(checked) >= 20, checked
