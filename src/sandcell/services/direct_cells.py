"""Cells sent straight to the worker that holds the session: one HTTP hop instead of two.

Through the API a cell crosses two HTTP stacks (client → API → worker) and three store reads
(the key, the session, its worker) before the kernel sees it. A client that wants less asks
the API once for direct access to a session (`POST /v1/sessions/{id}/direct`, with its key):
the answer is the worker's URL for that session's cells and a token that names the session,
its tenant, the API key that asked and an expiry, signed with a key only API replicas and
workers hold (derived from the internal token they already share). The worker checks the
signature and that the session runs there, runs the cell and records it in the history before
it answers, as the API does.

The token is the credential, like a preview URL's: it opens one session's cells and nothing
else, until it expires, the session stops, or the API key that minted it is revoked. The worker
learns of revoked keys without a read per cell: it reads the keys revoked lately at most once
a second (`RevokedKeys`), so a revocation reaches direct cells within about a second.
"""

import base64
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

from sandcell.domain.cells import CELL_CHARS, KEEP_CELLS, error_outcome, recorded_cell
from sandcell.domain.errors import Conflict, SandcellError, Unauthorized
from sandcell.ports.session_hosts import SessionHost
from sandcell.ports.sessions import CellResult
from sandcell.ports.store import Store
from sandcell.services.auth import RevokedKeys

log = logging.getLogger("sandcell.sessions")

DIRECT_TTL_S = 900.0
_PURPOSE = b"sandcell direct cells\n"


@dataclass(frozen=True)
class DirectAccess:
    url: str
    token: str
    expires_at: float


@dataclass(frozen=True)
class DirectGrant:
    """What a valid token says: whose session it opens, and which API key asked for it."""

    tenant_id: str
    key_id: str


class DirectTokens:
    """Mint (API) and check (worker) the tokens of direct access to one session's cells."""

    def __init__(self, internal_token: str) -> None:
        # A key of its own: a direct token never doubles as the internal token, nor the reverse.
        self._key = hmac.new(internal_token.encode(), _PURPOSE, hashlib.sha256).digest()

    def mint(self, session_id: str, tenant_id: str, key_id: str, expires_at: int) -> str:
        payload = f"{session_id}.{tenant_id}.{key_id}.{expires_at}"
        return f"{payload}.{self._sign(payload)}"

    def grant_of(self, token: str, session_id: str, now: float) -> DirectGrant:
        """What a valid, unexpired token for `session_id` grants."""
        try:
            named, tenant_id, key_id, expires_at, signature = token.split(".")
            payload = f"{named}.{tenant_id}.{key_id}.{expires_at}"
            valid = hmac.compare_digest(signature, self._sign(payload))
            if not valid or named != session_id or int(expires_at) < now:
                raise ValueError
        except ValueError as exc:
            raise Unauthorized("invalid or expired direct token for this session") from exc
        return DirectGrant(tenant_id, key_id)

    def _sign(self, payload: str) -> str:
        digest = hmac.new(self._key, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def record_cell(
    store: Store,
    session_id: str,
    tenant_id: str,
    code: str,
    outcome: dict[str, Any],
    started: float,
    limits: tuple[int, int],
) -> None:
    """Add a cell that ran to its session's history (`limits`: cells kept, chars per cell).
    A store failure is logged, not raised: the cell ran, and its answer must still go out."""
    keep, chars = limits
    cell = recorded_cell(session_id, tenant_id, code, outcome, started, time.time(), chars)
    try:
        store.add_session_cell(cell, keep)
    except Exception:
        log.exception("the cell of session %s was not recorded in its history", session_id)


class DirectCells:
    """The worker's side: check the token, run the cell in the session held here, record it."""

    def __init__(
        self,
        host: SessionHost,
        store: Store,
        tokens: DirectTokens,
        limits: tuple[int, int] = (KEEP_CELLS, CELL_CHARS),
    ) -> None:
        self.host, self.store, self.tokens, self.limits = host, store, tokens, limits
        # Only a key revoked within a token's lifetime can have minted one still valid.
        self.revoked = RevokedKeys(store, 2 * DIRECT_TTL_S)

    def execute(self, token: str, session_id: str, code: str, timeout_s: float) -> CellResult:
        grant = self.tokens.grant_of(token, session_id, time.time())
        if grant.key_id in self.revoked:
            raise Unauthorized("the API key this direct token was minted with is revoked")
        tenant_id = grant.tenant_id
        started = time.time()
        try:
            result = self.host.execute(session_id, code, timeout_s)
        except Conflict:
            raise  # not running here: nothing ran, nothing to record
        except SandcellError as exc:
            self._record(session_id, tenant_id, code, error_outcome(exc, []), started)
            raise
        self._record(session_id, tenant_id, code, result, started)
        return result

    def _record(
        self, session_id: str, tenant_id: str, code: str, outcome: dict[str, Any], started: float
    ) -> None:
        record_cell(self.store, session_id, tenant_id, code, outcome, started, self.limits)
