"""Session pools against real runsc and the real `python-data` image.

A pooled kernel is taken by one session, runs its cells with pandas already imported, moves its
volume into that session's state dir, pauses (checkpoint) and resumes there like a cold session,
and is released completely when the session stops. Two sessions never see each other's state.
"""

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandcell.app import build_session_pool
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.sessions import SessionSpec
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.runtime.pool import PoolConfig
from sandcell.runtime.scratch import attached_loops
from sandcell.runtime.session import GVisorSessionRuntime
from sandcell.runtime.session_pool import SESSION_PRELOADS, SessionPool
from sandcell.runtime.session_sandbox import GVisorSession
from sandcell.runtime.session_volume import VOLUME_NAME
from sandcell.settings import Settings
from tests.integration.conftest import IMAGE_DIR, assert_released

pytestmark = pytest.mark.gvisor

BASE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/workspace"}
PROFILE = Limits()
WAIT_S = 90.0
ids = itertools.count()


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GVisorSessionRuntime]:
    runtime = GVisorSessionRuntime(tmp_path_factory.mktemp("session-pool-runtime"))
    runtime.check()
    yield runtime
    runtime.reap()
    runtime.close()


@pytest.fixture(scope="module")
def state_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("session-pool-state")


@pytest.fixture(scope="module")
def pool(
    runtime: GVisorSessionRuntime, state_root: Path, python_data_image: Image
) -> Iterator[SessionPool]:
    config = PoolConfig(
        {"python-data": 1}, PROFILE, 1024, 600.0, preloads=SESSION_PRELOADS, preload_mb={}
    )
    images = FilesystemImageCatalog(IMAGE_DIR)
    pool = SessionPool(runtime, images, config, state_root / ".pool", BASE_ENV)
    pool.start()
    yield pool
    kept = pool.pool.ready_ids("python-data")
    pool.close()
    for sandbox_id in kept:
        assert_released(runtime.base, sandbox_id)
    assert list((state_root / ".pool").iterdir()) == []


@pytest.fixture
def new_spec(state_root: Path, python_data_image: Image) -> Callable[..., SessionSpec]:
    def spec(env: dict[str, str] | None = None, **limits: Any) -> SessionSpec:
        session_id = f"ses_t{next(ids)}{time.time_ns() % 10**6}"
        state_dir = state_root / session_id
        state_dir.mkdir()  # as LocalSessionHost does
        env = BASE_ENV | {"SANDCELL_SESSION_ID": session_id} | (env or {})
        return SessionSpec(f"{session_id}-1", python_data_image, env, Limits(**limits), state_dir)

    return spec


def take(pool: SessionPool, spec: SessionSpec) -> GVisorSession:
    deadline = time.monotonic() + WAIT_S
    while pool.pool.ready_count("python-data") < 1:
        assert time.monotonic() < deadline, "the session pool never filled"
        time.sleep(0.1)
    taken = pool.take(spec)
    assert isinstance(taken, GVisorSession), "expected a pooled kernel"
    return taken


def cell(live: GVisorSession, code: str) -> dict[str, Any]:
    return live.execute(code, 30)


def stop_and_check(runtime: GVisorSessionRuntime, live: GVisorSession) -> None:
    assert live.stop()
    assert_released(runtime.base, live.sandbox_id)
    volume = str(live.parts.spec.state_dir / VOLUME_NAME)
    assert volume not in attached_loops().values()


def test_a_pooled_kernel_serves_its_session_with_pandas_already_imported(
    runtime: GVisorSessionRuntime, pool: SessionPool, new_spec: Callable[..., SessionSpec]
) -> None:
    spec = new_spec()
    live = take(pool, spec)
    try:
        assert live.sandbox_id.startswith("spool-python-data-")
        fresh = cell(live, "_, dict(Out), '_1' in dir()")
        assert fresh["result"] == "('', {}, False)", fresh  # the warm-up left no result behind
        assert fresh["execution_count"] == 1  # the pool's imports were no cell
        first = cell(
            live, "import sys, os\n'pandas' in sys.modules, os.environ['SANDCELL_SESSION_ID']"
        )
        assert first["error"] is None, first
        assert first["result"] == repr((True, spec.env["SANDCELL_SESSION_ID"]))
        names = cell(live, "sorted(n for n in dir() if not n.startswith('_'))")
        assert "pandas" not in str(names["result"]), names  # imported, not bound for the user
        started = time.monotonic()
        assert cell(live, "1+1")["result"] == "2"
        assert time.monotonic() - started < 1.0
        # Its matplotlib reads fonts from memory (guest/memory_fonts.py), named by their path.
        fonts = cell(
            live,
            "import matplotlib.font_manager as fm\n"
            "path = fm.findfont('DejaVu Sans')\n"
            "fm.get_font(path).fname == path, fm._get_font.__module__",
        )
        assert fonts["result"] == "(True, 'sandcell.memory_fonts')", fonts
        # The volume now lives in the session's state dir, and /workspace is on it.
        cell(live, "open('/workspace/note.txt', 'w').write('mine')")
        assert (spec.state_dir / VOLUME_NAME).is_file()
        assert (live.workspace / "note.txt").read_text() == "mine"
    finally:
        stop_and_check(runtime, live)
    assert not list((spec.state_dir.parent / ".pool").glob(f"{live.sandbox_id}*"))


def test_two_pooled_sessions_never_see_each_others_state(
    runtime: GVisorSessionRuntime, pool: SessionPool, new_spec: Callable[..., SessionSpec]
) -> None:
    first = take(pool, new_spec())
    try:
        cell(first, "secret = 'first-session'\nopen('/workspace/secret.txt', 'w').write(secret)")
        cell(first, "import pandas; pandas.options.display.max_rows = 7")
        second = take(pool, new_spec())  # the refill: a different kernel on a different volume
    finally:
        stop_and_check(runtime, first)
    try:
        assert second.sandbox_id != first.sandbox_id
        seen = cell(
            second,
            "import os, pandas\n"
            "('secret' in globals(), os.listdir('/workspace'), pandas.options.display.max_rows)",
        )
        assert seen["result"] == "(False, [], 60)", seen
    finally:
        stop_and_check(runtime, second)


def test_a_pooled_session_pauses_and_resumes_with_its_memory(
    runtime: GVisorSessionRuntime, pool: SessionPool, new_spec: Callable[..., SessionSpec]
) -> None:
    spec = new_spec()
    live = take(pool, spec)
    cell(live, "import pandas as pd\nframe = pd.DataFrame({'x': [1, 2, 3]})")
    cell(live, "open('/workspace/kept.txt', 'w').write('kept')")
    assert live.pause() is True
    assert_released(runtime.base, live.sandbox_id)
    resumed = runtime.resume(SessionSpec(f"{spec.sandbox_id}r", *_rest(spec)))
    try:
        assert resumed.memory_restored
        answer = cell(resumed, "int(frame.x.sum()), open('/workspace/kept.txt').read()")
        assert answer["result"] == "(6, 'kept')", answer
        assert cell(resumed, "import os; os.environ['SANDCELL_SESSION_ID']")["result"] == repr(
            spec.env["SANDCELL_SESSION_ID"]
        )
    finally:
        stop_and_check(runtime, resumed)


def _rest(spec: SessionSpec) -> tuple[Image, dict[str, str], Limits, Path]:
    return spec.image, spec.env, spec.limits, spec.state_dir


def test_sessions_the_pool_cannot_honour_start_cold(
    pool: SessionPool, new_spec: Callable[..., SessionSpec]
) -> None:
    refused = pool.pool.stats.refused
    assert pool.take(new_spec(memory_mb=PROFILE.memory_mb * 2)) is None
    assert pool.take(new_spec(env={"MY_SETTING": "1"})) is None
    assert pool.take(new_spec(pids=PROFILE.pids + 1)) is None
    assert pool.pool.stats.refused == refused + 3
    figures = pool.pool_figures()
    assert figures["refused"]["python-data"] >= 3 and figures["target"] == {"python-data": 1}


def test_a_pool_size_for_an_image_without_ipython_pools_nothing(
    runtime: GVisorSessionRuntime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`python` has no IPython: its kernels would fail to boot, again and again."""
    images = FilesystemImageCatalog(IMAGE_DIR)
    settings = Settings(data_dir=tmp_path, session_pool_size="python=1")
    assert build_session_pool(settings, runtime, images, tmp_path) is None
    assert "has no IPython" in caplog.text
