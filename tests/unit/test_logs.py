"""Structured logs are JSON lines, carry the request id, and never show keys or secrets."""

import json
import logging

import pytest

from sandcell.domain.redaction import Redactor
from sandcell.logs import JsonFormatter
from tests.conftest import Api


def test_redactor_masks_api_keys_bearer_tokens_and_known_secrets() -> None:
    redact = Redactor()
    redact.add("hunter2-value", "crm_token")
    key = "sc_0123456789abcdef_" + "A" * 43
    text = f"key={key} auth='Bearer abcdefghijkl' value=hunter2-value"
    masked = redact(text)
    assert "A" * 43 not in masked and "abcdefghijkl" not in masked and "hunter2" not in masked
    assert "sc_0123456789abcdef_[redacted]" in masked and "[redacted:crm_token]" in masked


def test_each_request_is_one_json_line_with_its_request_id(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    key = api.tenant("alice")["Authorization"].split()[1]
    with caplog.at_level(logging.INFO, logger="sandcell.http"):
        answer = api.http.get(
            "/v1/jobs", headers={"Authorization": f"Bearer {key}", "X-Request-Id": "req-42"}
        )
    assert answer.headers["x-request-id"] == "req-42"
    [record] = [r for r in caplog.records if r.name == "sandcell.http"]
    line = JsonFormatter().format(record)
    event = json.loads(line)
    assert event["message"] == "request" and event["status"] == 200 and event["path"] == "/v1/jobs"
    assert event["request_id"] == "req-42"
    assert key.split("_", 2)[2] not in line
    bad = api.http.get("/v1/jobs", headers={"X-Request-Id": "bad id\n{}"})
    assert bad.headers["x-request-id"] != "bad id\n{}"


def test_a_secret_stays_masked_until_its_last_user_discards_it() -> None:
    redact = Redactor()
    redact.add("shared-value", "a")
    redact.add("shared-value", "b")
    redact.discard("shared-value")
    assert "shared-value" not in redact("x shared-value")
    redact.discard("shared-value")
    redact.discard("shared-value")  # one too many is harmless
    assert redact("x shared-value") == "x shared-value"
