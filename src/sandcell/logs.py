"""Structured logs: one JSON object per line, with request/job/tenant ids, always redacted."""

import contextvars
import json
import logging
import sys
import time
from typing import Any

from sandcell.domain.redaction import REDACTOR

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
CONTEXT_FIELDS = (
    "request_id",
    "job_id",
    "tenant_id",
    "worker_id",
    "method",
    "path",
    "status",
    "duration_ms",
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if (rid := request_id.get()) is not None:
            event["request_id"] = rid
        for field in CONTEXT_FIELDS:
            if (value := getattr(record, field, None)) is not None:
                event[field] = value
        if record.exc_info:
            event["error"] = self.formatException(record.exc_info)
        return REDACTOR(json.dumps(event, default=str))


def configure(level: int = logging.INFO, *secrets: str) -> None:
    """Route every logger (ours, uvicorn's) through the JSON formatter on stderr."""
    for value in secrets:
        if value:
            REDACTOR.add(value, "server-secret")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # our middleware logs requests
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per internal call is noise
