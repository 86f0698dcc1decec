"""Redaction of credentials from anything that is logged or recorded."""

import re
import threading

API_KEY = re.compile(r"\b(sc_[0-9a-f]{4,32}_)[A-Za-z0-9_-]{8,}")
BEARER = re.compile(r"(?i)(bearer\s+)(?!sc_)[^\s\"',;]{8,}")


class Redactor:
    """Masks API keys, bearer tokens, and every secret value it has been told about."""

    def __init__(self) -> None:
        self._secrets: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, value: str, name: str = "secret") -> None:
        if len(value) >= 4:  # shorter values would mask ordinary words
            with self._lock:
                self._secrets[value] = name

    def discard(self, value: str) -> None:
        with self._lock:
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
