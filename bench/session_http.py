"""A session's `1+1` execute round trip over HTTP, beside the same cell sent straight to the
kernel and a bare-python baseline, all in one run.

    .venv/bin/python -m bench.session_http [--cells 100]
"""

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path

from bench._baselines import bare_python, summary, timed
from bench._server import start_server, tenant_client


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        proc, url = start_server(Path(scratch))
        try:
            client = tenant_client(url)
            started = time.perf_counter()
            sid = client.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
            create_ms = (time.perf_counter() - started) * 1000
            first = time.perf_counter()
            client.post(f"/v1/sessions/{sid}/execute", json={"code": "1+1"})
            first_ms = (time.perf_counter() - first) * 1000

            def cell() -> None:
                answer = client.post(f"/v1/sessions/{sid}/execute", json={"code": "1+1"}).json()
                assert answer["result"] == "2", answer

            execute = summary(timed(cell, args.cells))
            client.delete(f"/v1/sessions/{sid}")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    python = summary(bare_python(20))
    print(
        json.dumps(
            {
                "session_create_ms": round(create_ms, 1),
                "first_result_ms": round(first_ms, 1),
                "execute_1_plus_1_http": execute,
                "bare_python3.11": python,
                "execute_vs_bare_python": round(execute["median_ms"] / python["median_ms"], 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
