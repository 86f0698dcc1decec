"""Validation of paths a caller or a guest names: relative, normalised, printable."""

import posixpath

MAX_PATH = 1024


def safe_relative_path(path: str) -> str:
    """Return `path` if it is a safe relative path, else raise ValueError saying why."""
    if not path or len(path) > MAX_PATH:
        raise ValueError(f"must be 1 to {MAX_PATH} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise ValueError("must not contain NUL or control characters")
    if path.startswith("/"):
        raise ValueError("must be relative, not absolute")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError("must not contain '..', '.' or empty segments")
    if posixpath.normpath(path) != path:
        raise ValueError("must be normalised")
    return path
