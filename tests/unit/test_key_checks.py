"""A request's key check without a read of the store, and revocations that still end a key
at once in every process (a notification) or within a second (when that is lost)."""

import time
from pathlib import Path

import pytest

from sandcell.domain.errors import Unauthorized
from sandcell.domain.records import ApiKey
from sandcell.ports.notify import LocalNotifier
from sandcell.services.auth import REVOKED_REFRESH_S, AuthService
from sandcell.store.sql import SqlStore
from tests.conftest import Api, sqlite_store


class CountingStore:
    """The store, counting the reads of keys."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store
        self.key_reads = 0

    def get_api_key(self, key_id: str) -> tuple[ApiKey, str] | None:
        self.key_reads += 1
        return self._store.get_api_key(key_id)

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


def _two_processes(
    tmp_path: Path, shared_notifications: bool
) -> tuple[AuthService, AuthService, str]:
    """Two API processes' auth over one store; `key` made by the second."""
    store = sqlite_store(tmp_path / "s.db")
    notifier = LocalNotifier()
    first = AuthService(CountingStore(store), notifier=notifier)  # type: ignore[arg-type]
    second = AuthService(store, notifier=notifier if shared_notifications else LocalNotifier())
    tenant = second.create_tenant("t")
    return first, second, second.create_key(tenant.id)


def test_a_key_checked_once_is_known_without_a_read_until_it_is_revoked(tmp_path: Path) -> None:
    first, second, key = _two_processes(tmp_path, shared_notifications=True)
    header = f"Bearer {key}"
    assert first.at_hand(header) is None  # never checked here: that takes a read
    who = first.authenticate(header)
    for _ in range(5):
        assert first.at_hand(header) == who
        assert first.authenticate(header) == who
    assert first.store.key_reads == 1  # type: ignore[attr-defined]
    assert first.at_hand(f"Bearer {key}x") is None  # another secret is not the key checked
    with pytest.raises(Unauthorized):
        first.authenticate(f"Bearer {key}x")
    second.revoke_key(who.key_id)  # the notification reaches the first process at once
    assert first.at_hand(header) is None
    with pytest.raises(Unauthorized, match="revoked"):
        first.authenticate(header)


def test_a_lost_revocation_notice_leaves_a_key_usable_for_at_most_a_second(
    tmp_path: Path,
) -> None:
    first, second, key = _two_processes(tmp_path, shared_notifications=False)
    header = f"Bearer {key}"
    who = first.authenticate(header)
    second.revoke_key(who.key_id)
    revoked_at = time.monotonic()
    while first.at_hand(header) is not None:
        assert time.monotonic() - revoked_at < REVOKED_REFRESH_S + 0.5
        time.sleep(0.01)
    # Without a fresh view of the revoked keys the fast check declines; the full one reads it.
    with pytest.raises(Unauthorized, match="revoked"):
        first.authenticate(header)
    assert first.at_hand(header) is None  # the fresh view has it revoked


def test_requests_of_a_known_key_read_no_key_over_http(api: Api) -> None:
    auth = api.services.auth
    counting = CountingStore(auth.store)  # type: ignore[arg-type]
    auth.store = counting  # type: ignore[assignment]
    headers = api.tenant("alice")
    for _ in range(5):
        assert api.http.get("/v1/jobs", headers=headers).status_code == 200
    assert counting.key_reads == 1
