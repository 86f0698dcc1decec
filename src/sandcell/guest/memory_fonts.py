"""Matplotlib's fonts read from memory instead of their files (stdlib only; runs in the guest).

FreeType reads a font through matplotlib's file object, a seek and a read at a time, while it
lays out text. Under gVisor's ptrace platform every one of those system calls is a round trip
to the sentry: measured in a pooled `python-data` sandbox, 200 `FT2Font.set_text` calls took
1.3 s on a file and 22 ms on the same bytes in memory, and a small CSV → chart job spent most
of its ~0.7 s there.

`install()` makes matplotlib's font cache (`font_manager._get_font`) open each font file as
an in-memory copy whose `name` is the file's path, so `FT2Font.fname` is still that path (the
PDF and PS backends read the file by it). Same bytes, same FreeType, same rendering.
"""

import builtins
import functools
import io
import os
import sys
import threading
from typing import Any

FONT_SUFFIXES = (".ttf", ".otf", ".ttc")
_REAL_OPEN = builtins.open  # also while `builtins.open` is swapped
_swap = threading.Lock()


class FontBytes(io.BytesIO):
    """A font file's bytes, named like the file."""

    def __init__(self, path: str) -> None:
        with _REAL_OPEN(path, "rb") as source:
            super().__init__(source.read())
        self.name = path


def install() -> bool:
    """Patch an imported matplotlib's font cache; False if there is none to patch."""
    manager = sys.modules.get("matplotlib.font_manager")
    cached = getattr(manager, "_get_font", None)
    original = getattr(cached, "__wrapped__", None)
    if manager is None or cached is None or original is None:
        return False

    @functools.lru_cache(64)
    def _get_font(*args: Any, **kwargs: Any) -> Any:
        with _fonts_from_memory():
            return original(*args, **kwargs)

    cached.cache_clear()
    manager._get_font = _get_font  # type: ignore[attr-defined]
    return True


class _fonts_from_memory:
    """While FT2Font opens its files (it calls the builtin `open`), fonts come from memory."""

    def __enter__(self) -> None:
        _swap.acquire()
        self.real_open = builtins.open
        real_open = self.real_open

        def font_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            path = os.fspath(file) if isinstance(file, (str, os.PathLike)) else None
            if mode == "rb" and isinstance(path, str) and path.lower().endswith(FONT_SUFFIXES):
                return FontBytes(path)
            return real_open(file, mode, *args, **kwargs)

        builtins.open = font_open

    def __exit__(self, *_: object) -> None:
        builtins.open = self.real_open
        _swap.release()
