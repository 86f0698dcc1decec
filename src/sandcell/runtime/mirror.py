"""Which Debian mirror to debootstrap from: the one apt on this host is configured with.

Hosts without internet usually have apt pointed at a local mirror or proxy; reusing it is what
makes image builds work there without extra configuration.
"""

import re
from pathlib import Path

DEFAULT_MIRROR = "http://deb.debian.org/debian"
APT_DIR = Path("/etc/apt")
OPTIONS = re.compile(r"\[[^\]]*\]")


def debian_mirror(suite: str = "bookworm", apt_dir: Path = APT_DIR) -> str:
    """The first configured `deb` URI serving `suite` itself (not -security or -updates)."""
    sources = sorted((apt_dir / "sources.list.d").glob("*.sources"))
    for path in sources:
        uri = _from_deb822(_read(path), suite)
        if uri:
            return uri
    uri = _from_one_line(_read(apt_dir / "sources.list"), suite)
    return uri or DEFAULT_MIRROR


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _from_deb822(text: str, suite: str) -> str | None:
    for stanza in text.split("\n\n"):
        fields = _fields(stanza)
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
            return _usable(fields.get("uris", "").split())
    return None


def _fields(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line.startswith("#") or ":" not in line or line[:1].isspace():
            continue
        key, value = line.split(":", 1)
        fields[key.strip().lower()] = value.strip()
    return fields


def _from_one_line(text: str, suite: str) -> str | None:
    for line in text.splitlines():
        # "deb [arch=amd64 signed-by=...] URI SUITE COMPONENTS..."
        words = OPTIONS.sub(" ", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
            return _usable([words[1]])
    return None


def _usable(uris: list[str]) -> str | None:
    for uri in uris:
        if uri.startswith(("http://", "https://")):
            return uri.rstrip("/")
    return None
