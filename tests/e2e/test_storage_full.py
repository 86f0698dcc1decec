"""A full artifact store fails the job clearly and leaves nothing half-written.

The artifact directory is a 1 MiB tmpfs. DESIGN's reasons have no `storage`: the job ends
`failed/internal`, its detail starting "artifact storage is full: ", and none of its outputs
(nor a refused stage) is visible, nor any blob of them left behind.
"""

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
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

        several = run_job(small, headers, {"code": SEVERAL_OUTPUTS})
        assert (several["state"], several["reason"]) == ("failed", "internal"), several
        assert several["detail"] == "artifact storage is full: output b.bin could not be stored"
        assert several["outputs"] == []  # a.txt fit, but a job's outputs come all or none
        assert not _blob(small_blob_dir, b"a" * 1000).exists()

        staged = run_job(small, headers, {"code": STAGE_TOO_BIG})
        assert (staged["state"], staged["reason"]) == ("failed", "internal"), staged
        assert staged["detail"] == (
            "artifact storage is full: stage 'clean' file big.bin could not be stored"
        )
        assert staged["stages"] == [] and staged["outputs"] == []
        assert not _blob(small_blob_dir, b"s" * 1000).exists()
        with httpx.Client(base_url=small.url, headers=headers) as http:
            logs = http.get(f"/v1/jobs/{staged['id']}/logs").raise_for_status().json()
        assert logs["stdout"] == (  # what the guest was told: a clear refusal
            "refused: artifact storage is full: stage 'clean' file big.bin could not be stored\n"
        )
        assert list((small_blob_dir / "tmp").iterdir()) == []

        resumable = run_job(small, headers, {"code": STAGE_FITS})
        assert resumable["state"] == "completed", resumable
        assert [s["name"] for s in resumable["stages"]] == ["clean"]
        assert [o["path"] for o in resumable["outputs"]] == ["clean.csv"]


SEVERAL_OUTPUTS = """
open('/output/a.txt', 'w').write('a' * 1000)  # fits
open('/output/b.bin', 'wb').write(b'x' * 3_000_000)  # does not
open('/output/c.txt', 'w').write('c')
"""
STAGE_TOO_BIG = """
import sandcell_guest as guest
open('/output/small.csv', 'w').write('s' * 1000)
open('/output/big.bin', 'wb').write(b'x' * 3_000_000)
try:
    guest.commit_stage('clean', files=['small.csv', 'big.bin'])
except guest.ChannelError as exc:
    print('refused:', exc)
"""
STAGE_FITS = """
import sandcell_guest as guest
open('/output/clean.csv', 'w').write('a,b')
guest.commit_stage('clean', files=['clean.csv'])
"""


def _blob(blob_dir: Path, content: bytes) -> Path:
    sha256 = hashlib.sha256(content).hexdigest()
    return blob_dir / "sha256" / sha256[:2] / sha256
