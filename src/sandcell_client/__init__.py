"""sandcell_client: a thin SDK for the sandcell HTTP API (httpx + pydantic only)."""

from sandcell_client._client import Client, Session
from sandcell_client._errors import (
    ApiError,
    Conflict,
    InvalidRequest,
    NotFound,
    Unauthorized,
)

__all__ = [
    "ApiError",
    "Client",
    "Conflict",
    "InvalidRequest",
    "NotFound",
    "Session",
    "Unauthorized",
]
