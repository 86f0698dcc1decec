"""The guest's in-memory font files: only font files, only while matplotlib opens one."""

import builtins
import functools
import sys
import types
from pathlib import Path

import pytest

from sandcell.guest import memory_fonts


def test_fonts_come_from_memory_only_while_the_font_cache_opens_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    font, other = tmp_path / "Sans.ttf", tmp_path / "notes.txt"
    font.write_bytes(b"glyphs")
    other.write_text("text")

    @functools.lru_cache(64)
    def _get_font(paths: tuple[str, ...], hinting: int, *, thread_id: int) -> list[object]:
        # what matplotlib's FT2Font does with a path: the builtin open, looked up at call time
        return [builtins.open(path, "rb") for path in paths]

    manager = types.ModuleType("matplotlib.font_manager")
    manager._get_font = _get_font  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib.font_manager", manager)
    real_open = builtins.open
    assert memory_fonts.install()
    files = manager._get_font((str(font), str(other)), 8, thread_id=1)  # type: ignore[attr-defined]
    in_memory, on_disk = files
    assert isinstance(in_memory, memory_fonts.FontBytes)
    assert in_memory.name == str(font) and in_memory.read() == b"glyphs"
    assert not isinstance(on_disk, memory_fonts.FontBytes) and on_disk.read() == b"text"
    assert builtins.open is real_open  # only swapped while the cache opened them
    assert manager._get_font((str(font), str(other)), 8, thread_id=1) is files  # still cached
    for file in files:
        file.close()  # type: ignore[attr-defined]


def test_without_matplotlib_nothing_is_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "matplotlib.font_manager", raising=False)
    assert not memory_fonts.install()
