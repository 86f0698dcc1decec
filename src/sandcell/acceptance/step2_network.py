"""Step 2: an approved endpoint works, an unapproved one is blocked, URLs without auth fail,
and no secret value appears in any log or record."""

import json
import secrets
from typing import Any

from sandcell.acceptance.checks import StepResult
from sandcell.acceptance.deployment import Deployment, JobEntry, Tenant
from sandcell.acceptance.endpoints import LoopbackEndpoint

SECRET_HOST = "vault.acceptance.invalid"  # the secret is bound here; the job never gets it
PROGRAM = """
import json, os, socket, urllib.request
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=15) as answer:
            return answer.status
    except Exception as exc:
        return getattr(exc, "code", None) or type(exc).__name__
facts = {"approved": fetch(URL_OK), "unapproved": fetch(URL_BLOCKED)}
direct = socket.socket(); direct.settimeout(3)
try:
    direct.connect((HOST_BLOCKED, PORT_BLOCKED)); facts["direct"] = "connected"
except OSError as exc:
    facts["direct"] = type(exc).__name__
facts["env"] = dict(os.environ)  # whatever the sandbox holds is shown: no secret may be there
print(json.dumps(facts), flush=True)
"""


def run(deployment: Deployment, step: StepResult, shared: dict[str, Any]) -> None:
    tenant: Tenant = shared.get("tenants", [None])[0] or deployment.tenant("net")
    approved, unapproved = LoopbackEndpoint("127.0.0.1"), LoopbackEndpoint("127.0.0.2")
    try:
        name, value = _secret(tenant, step)
        job = deployment.submit(tenant, _body(approved, unapproved, name), step=2)
        record = deployment.finish(job)
        _network_checks(deployment, step, job, record, approved, unapproved)
        _no_secret_anywhere(deployment, step, job, record, tenant, value)
    finally:
        approved.close()
        unapproved.close()
    _urls_without_auth(deployment, step, shared)


def _secret(tenant: Tenant, step: StepResult) -> tuple[str, str]:
    name, value = f"acceptance_{secrets.token_hex(4)}", f"acc-{secrets.token_urlsafe(24)}"
    answer = tenant.http.post("/v1/secrets", json={"name": name, "value": value})
    step.expect("a secret is stored (write-only)", answer.status_code == 201, answer.status_code)
    tenant.secrets.append(name)
    return name, value


def _body(approved: LoopbackEndpoint, unapproved: LoopbackEndpoint, name: str) -> dict[str, Any]:
    code = (
        PROGRAM.replace("HOST_BLOCKED", repr(unapproved.address))
        .replace("PORT_BLOCKED", str(unapproved.port))
        .replace("URL_BLOCKED", repr(unapproved.url("/unapproved")))
        .replace("URL_OK", repr(approved.url("/approved")))
    )
    binding = {"name": name, "hosts": [SECRET_HOST], "header": "X-Acceptance-Token"}
    return {
        "code": code,
        "network": {"allow": [approved.address, SECRET_HOST]},
        "secrets": [binding],
    }


def _network_checks(
    deployment: Deployment,
    step: StepResult,
    job: JobEntry,
    record: Any,
    approved: LoopbackEndpoint,
    unapproved: LoopbackEndpoint,
) -> None:
    facts = _facts(deployment, job)
    step.expect(
        "the job ran", record["state"] == "completed", f"{record['state']} {record['detail']}"
    )
    step.expect(
        "approved endpoint reached through the proxy",
        facts.get("approved") == 200 and approved.hits["/approved"] == 1,
        f"job saw {facts.get('approved')}; endpoint counted {approved.hits['/approved']}",
    )
    step.expect(
        "unapproved endpoint blocked",
        facts.get("unapproved") != 200 and sum(unapproved.hits.values()) == 0,
        f"job saw {facts.get('unapproved')}; direct: {facts.get('direct')}; "
        f"endpoint counted {sum(unapproved.hits.values())}",
    )
    decisions = [(e.get("host"), e.get("decision")) for e in record.get("egress", [])]
    step.expect(
        "every attempt is on the job record's egress log",
        any(h == unapproved.address and d != "allowed" for h, d in decisions)
        and any(h == approved.address and d == "allowed" for h, d in decisions),
        decisions,
    )


def _facts(deployment: Deployment, job: JobEntry) -> dict[str, Any]:
    stdout = deployment.logs(job).get("stdout", "")
    try:
        return dict(json.loads(stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"unreadable_output": stdout[-300:]}


def _no_secret_anywhere(
    deployment: Deployment,
    step: StepResult,
    job: JobEntry,
    record: Any,
    tenant: Tenant,
    value: str,
) -> None:
    places = {
        "job logs": json.dumps(deployment.logs(job)),
        "job record": json.dumps(record),
        "secret list": tenant.http.get("/v1/secrets").text,
        "audit log": deployment.admin.get("/v1/admin/audit", params={"limit": 500}).text,
        "job list": tenant.http.get("/v1/jobs").text,
    }
    leaked = [place for place, text in places.items() if value in text]
    step.expect(
        "no secret value in any log or record",
        not leaked,
        f"searched {', '.join(places)}" if not leaked else f"found in {leaked}",
    )


def _urls_without_auth(deployment: Deployment, step: StepResult, shared: dict[str, Any]) -> None:
    """File and preview URLs answer 401 without a credential; a signed URL only as issued."""
    jobs: list[JobEntry] = shared.get("step1_jobs", [])
    outputs = jobs[0].record.get("outputs", []) if jobs else []
    if not outputs:
        step.expect("URLs without auth (needs step 1's artifact)", False, "no artifact to probe")
        return
    owner, artifact = jobs[0].tenant, outputs[0]["artifact_id"]
    signed = owner.http.post(f"/v1/artifacts/{artifact}/url").json().get("url", "")
    shared["signed_url"] = signed
    anon = deployment.anonymous
    answers = {
        "artifact content": anon.get(f"/v1/artifacts/{artifact}/content").status_code,
        "job logs": anon.get(f"/v1/jobs/{jobs[0].id}/logs").status_code,
        "session file": anon.get("/v1/sessions/ses_acceptance/files/a.txt").status_code,
        "signed URL, signature changed": anon.get(_tampered(signed, "sig=")).status_code,
        "signed URL, expiry changed": anon.get(_tampered(signed, "expires=")).status_code,
        "preview, forged token": anon.get(f"/v1/previews/ses_x.8080.{2**31}.Zm9yZ2Vk/").status_code,
    }
    refused = all(code in (401, 403) for code in answers.values())
    step.expect("file and preview URLs without auth fail", refused, answers)
    issued = anon.get(signed)
    step.expect(
        "the signed URL as issued works (the control)",
        issued.status_code == 200,
        f"HTTP {issued.status_code}, {len(issued.content)} bytes",
    )


def _tampered(url: str, field: str) -> str:
    """`url` with the first character after `field` changed."""
    at = url.find(field) + len(field)
    if at < len(field):
        return url + "&" + field + "0"
    return url[:at] + ("1" if url[at] != "1" else "2") + url[at + 1 :]
