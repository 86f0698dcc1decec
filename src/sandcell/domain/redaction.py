"""Redaction of credentials from anything that is logged or recorded."""

import re
import threading

API_KEY = re.compile(r"\b(sc_[0-9a-f]{4,32}_)[A-Za-z0-9_-]{8,}")
BEARER = re.compile(r"(?i)(bearer\s+)(?!sc_)[^\s\"',;]{8,}")


class Redactor:
    """Masks API keys, bearer tokens, and every secret value it has been told about.

    Values are counted: two jobs (or a job and a session) using the same secret each add it,
    and it stays masked until the last of them discards it.
    """

    def __init__(self) -> None:
        self._secrets: dict[str, str] = {}
        self._users: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, value: str, name: str = "secret") -> None:
        if len(value) >= 4:  # shorter values would mask ordinary words
            with self._lock:
                self._secrets[value] = name
                self._users[value] = self._users.get(value, 0) + 1

    def discard(self, value: str) -> None:
        with self._lock:
            users = self._users.pop(value, 0) - 1
            if users > 0:
                self._users[value] = users
            else:
                self._secrets.pop(value, None)

    def __call__(self, text: str) -> str:
        text = API_KEY.sub(r"\1[redacted]", text)
        text = BEARER.sub(r"\1[redacted]", text)
        with self._lock:
            known = sorted(self._secrets.items(), key=lambda item: -len(item[0]))
        for value, name in known:
            text = text.replace(value, f"[redacted:{name}]")
        return text


REDACTOR = Redactor()
