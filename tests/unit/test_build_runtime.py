"""The composition root picks the weaker bwrap tier only when the operator opted in."""

from pathlib import Path

import pytest

from sandcell.app import build_runtime
from sandcell.domain.errors import RuntimeUnavailable
from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.settings import Settings


def test_gvisor_is_the_default(tmp_path: Path) -> None:
    assert isinstance(build_runtime(Settings(data_dir=tmp_path)), GVisorRuntime)


def test_bwrap_without_the_opt_in_fails_closed(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, runtime="bwrap")
    with pytest.raises(RuntimeUnavailable, match="SANDCELL_ALLOW_WEAK_ISOLATION=1"):
        build_runtime(settings)


def test_bwrap_with_the_opt_in(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, runtime="bwrap", allow_weak_isolation=True)
    runtime = build_runtime(settings)
    assert isinstance(runtime, BwrapRuntime) and runtime.name == "bwrap"


def test_the_opt_in_alone_does_not_switch_runtimes(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, allow_weak_isolation=True)
    assert isinstance(build_runtime(settings), GVisorRuntime)


def test_an_unknown_runtime_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable, match="unknown runtime 'docker'"):
        build_runtime(Settings(data_dir=tmp_path, runtime="docker"))
