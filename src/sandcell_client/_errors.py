"""Errors mirroring the server's problem types.

ApiError                 any problem+json answer
├── Unauthorized         401
├── NotFound             404 (also: another tenant's id)
├── Conflict             409
└── InvalidRequest       422 (with field errors)
"""

from typing import Any

import httpx


class ApiError(Exception):
    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.type = problem.get("type", "")
        self.detail = problem.get("detail", "")
        self.errors: list[dict[str, str]] = problem.get("errors", [])
        fields = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in self.errors)
        super().__init__(f"{status} {self.detail}" + (f" ({fields})" if fields else ""))


class Unauthorized(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class InvalidRequest(ApiError):
    pass


_BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
}


def raise_for_problem(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        problem = response.json()
    except ValueError:
        problem = {"detail": response.text[:500]}
    if not isinstance(problem, dict):
        problem = {"detail": str(problem)[:500]}
    raise _BY_STATUS.get(response.status_code, ApiError)(response.status_code, problem)
