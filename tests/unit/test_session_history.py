"""A session's cell history through the API, over the fake session runtime: recorded for plain
and streamed cells (and for cells whose sandbox died), read by cursor, tenant-scoped, and kept
after the session paused or stopped."""

import json

import pytest

from sandcell.domain.cells import TEXT_CHARS, failed_outcome, recorded_cell
from sandcell.domain.errors import SessionUnavailable, StoreUnavailable
from tests.conftest import Api


def _start(api: Api, headers: dict[str, str]) -> str:
    answer = api.http.post("/v1/sessions", json={}, headers=headers)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _run(api: Api, headers: dict[str, str], sid: str, code: str) -> dict:
    answer = api.http.post(f"/v1/sessions/{sid}/execute", json={"code": code}, headers=headers)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _cells(api: Api, headers: dict[str, str], sid: str, **params: object) -> dict:
    answer = api.http.get(f"/v1/sessions/{sid}/cells", params=params, headers=headers)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_executed_and_streamed_cells_are_recorded_in_order(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)
    assert _cells(api, alice, sid) == {"items": [], "next_after": None}
    _run(api, alice, sid, "x = 41")
    _run(api, alice, sid, "print(x + 1)")
    _run(api, alice, sid, "1 / 0")
    streamed = api.http.post(
        f"/v1/sessions/{sid}/execute",
        json={"code": "print('streamed')"},
        headers=alice | {"Accept": "text/event-stream"},
    )
    assert "event: result" in streamed.text
    page = _cells(api, alice, sid)
    assert [c["seq"] for c in page["items"]] == [1, 2, 3, 4] and page["next_after"] == 4
    assert [c["code"] for c in page["items"]] == [
        "x = 41",
        "print(x + 1)",
        "1 / 0",
        "print('streamed')",
    ]
    first, second, failing, last = page["items"]
    assert second["stdout"] == "42\n" and second["error"] is None
    assert failing["error"]["ename"] == "ZeroDivisionError"
    assert last["stdout"] == "streamed\n" and last["truncated"] is False
    assert first["started_at"] <= first["finished_at"] and first["duration_ms"] >= 0


def test_the_cursor_gives_only_later_cells_and_limit_the_newest(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)
    for i in range(5):
        _run(api, alice, sid, f"v = {i}")
    assert [c["seq"] for c in _cells(api, alice, sid, limit=2)["items"]] == [4, 5]
    later = _cells(api, alice, sid, after=2, limit=2)
    assert [c["seq"] for c in later["items"]] == [3, 4] and later["next_after"] == 4
    assert _cells(api, alice, sid, after=5) == {"items": [], "next_after": 5}
    for bad in ({"limit": 0}, {"limit": 101}, {"after": -1}, {"after": "x"}):
        answer = api.http.get(f"/v1/sessions/{sid}/cells", params=bad, headers=alice)
        assert answer.status_code == 422, bad
        assert answer.headers["content-type"] == "application/problem+json"


def test_another_tenant_gets_404_and_the_history_outlives_pause_and_stop(api: Api) -> None:
    alice, bob = api.tenant("alice"), api.tenant("bob")
    sid = _start(api, alice)
    _run(api, alice, sid, "secret = 'alice'")
    answer = api.http.get(f"/v1/sessions/{sid}/cells", headers=bob)
    assert answer.status_code == 404 and "secret" not in answer.text
    assert api.http.get("/v1/sessions/ses_nope/cells", headers=alice).status_code == 404
    assert api.http.post(f"/v1/sessions/{sid}/pause", headers=alice).json()["state"] == "paused"
    assert [c["code"] for c in _cells(api, alice, sid)["items"]] == ["secret = 'alice'"]
    api.http.post(f"/v1/sessions/{sid}/resume", headers=alice)
    _run(api, alice, sid, "print('resumed')")  # the fake runtime keeps no memory
    assert api.http.delete(f"/v1/sessions/{sid}", headers=alice).json()["state"] == "stopped"
    items = _cells(api, alice, sid)["items"]
    assert [c["stdout"] for c in items] == ["", "resumed\n"]
    assert api.http.get(f"/v1/sessions/{sid}/cells", headers=bob).status_code == 404


def test_a_cell_whose_sandbox_died_is_recorded_with_that_failure(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)
    sandbox = api.session_runtime.sandboxes[-1]

    def dies(code: str, timeout_s: float, on_event: object = None) -> dict:
        raise SessionUnavailable("the sandbox ended: out of memory")

    sandbox.execute = dies  # type: ignore[method-assign]
    answer = api.http.post(
        f"/v1/sessions/{sid}/execute", json={"code": "a = [0] * 10**10"}, headers=alice
    )
    assert answer.status_code == 409
    [cell] = _cells(api, alice, sid)["items"]
    assert cell["code"] == "a = [0] * 10**10"
    assert cell["error"] == {
        "ename": "SessionUnavailable",
        "evalue": "the sandbox ended: out of memory",
        "traceback": [],
    }


def test_a_long_output_is_kept_capped_and_marked_truncated(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)
    cell = _run(api, alice, sid, f"print('y' * {TEXT_CHARS + 10})")
    assert len(cell["stdout"]) == TEXT_CHARS + 11  # the answer itself is not cut
    [stored] = _cells(api, alice, sid)["items"]
    assert stored["truncated"] is True
    assert stored["stdout"].startswith("y" * TEXT_CHARS)
    assert stored["stdout"].endswith("[… 11 more characters not kept in the history]")


def test_capping_keeps_what_fits_and_notes_what_does_not() -> None:
    png = "iVBOR" + "A" * 95
    outcome = {
        "stdout": "a" * 50,
        "display": [
            {"mime": "image/png", "data": png},
            {"mime": "image/png", "data": png * 5},
            {"mime": "text/html", "data": "<b>x</b>"},
        ],
        "error": {"ename": "E", "evalue": "v", "traceback": ["line"] * 1000},
        "result": 42,  # not text: dropped, never stored as something else
        "execution_count": True,
    }
    cell = recorded_cell("ses_1", "ten_1", "code", outcome, 1.0, 2.5, cell_chars=400)
    assert cell.duration_ms == 1500.0 and cell.result is None and cell.execution_count is None
    assert cell.truncated
    assert cell.error is not None and cell.error["traceback"][-1].startswith("[… ")
    assert len(cell.error["traceback"]) < 200
    [note] = cell.display  # the traceback used the budget up: one note for every output
    assert note["omitted"] == "image/png" and "nor 2 later outputs" in note["data"]
    roomy = recorded_cell("ses_1", "ten_1", "code", outcome | {"error": None}, 1, 2, 500)
    assert roomy.display[0] == {"mime": "image/png", "data": png}
    note = roomy.display[1]
    assert note["mime"] == "text/plain" and note["omitted"] == "image/png"
    assert "nor 1 later outputs" in note["data"] and len(roomy.display) == 2


def test_a_failed_stream_keeps_what_it_showed() -> None:
    events = [
        {"type": "stdout", "text": "one "},
        {"type": "stderr", "text": "warn"},
        {"type": "stdout", "text": "two"},
        {"type": "display", "mime": "image/png", "data": "iVBOR"},
    ]
    outcome = failed_outcome(events, {"type": "RuntimeUnavailable", "detail": "gone"})
    assert outcome == {
        "stdout": "one two",
        "stderr": "warn",
        "display": [{"mime": "image/png", "data": "iVBOR"}],
        "error": {"ename": "RuntimeUnavailable", "evalue": "gone", "traceback": []},
    }
    assert json.dumps(outcome)


def test_a_cell_answers_even_when_its_history_cannot_be_written(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)

    def unavailable(*_: object) -> None:
        raise StoreUnavailable()

    monkeypatch.setattr(api.services.store, "add_session_cell", unavailable)
    assert _run(api, alice, sid, "print('still here')")["stdout"] == "still here\n"
    monkeypatch.undo()
    assert _cells(api, alice, sid)["items"] == []
