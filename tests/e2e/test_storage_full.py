"""A full artifact store fails the job clearly and leaves nothing half-written."""

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, run_job, running_server
from tests.integration.egress_servers import TestPKI

pytestmark = pytest.mark.gvisor


@pytest.fixture
def small_blob_dir(tmp_path: Path) -> Iterator[Path]:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(blobs)], check=True)
    try:
        yield blobs
    finally:
        subprocess.run(["umount", "--lazy", str(blobs)], check=False)


def test_a_full_artifact_store_fails_the_job_and_keeps_nothing_partial(
    server: Server, pki: TestPKI, tmp_path: Path, small_blob_dir: Path
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with running_server(data_dir, pki, {"SANDCELL_BLOB_DIR": str(small_blob_dir)}) as small:
        headers = small.tenant("storage")
        big = run_job(
            small, headers, {"code": "open('/output/big.bin','wb').write(b'x' * 3_000_000)"}
        )
        assert (big["state"], big["reason"]) == ("failed", "internal"), big
        assert "storage is full" in big["detail"] and big["outputs"] == []
        assert list((small_blob_dir / "tmp").iterdir()) == []  # no partial blob left behind
        fine = run_job(small, headers, {"code": "open('/output/ok.txt','w').write('ok')"})
        assert fine["state"] == "completed" and [o["path"] for o in fine["outputs"]] == ["ok.txt"]
