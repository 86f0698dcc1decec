"""`sandcell bench`: runs the benchmark suite (`bench/suite.py`) of this source checkout.

The suite lives beside the package, not in it (it starts servers, needs root and the built
images, and is no part of a deployment), so the command finds the checkout the package was
installed from and runs `python -m bench.suite` there.
"""

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

import sandcell


def checkout() -> Path | None:
    """The source tree of an editable install (src/sandcell → the repo root), if it has bench/."""
    root = Path(sandcell.__file__).resolve().parents[2]
    return root if (root / "bench" / "suite.py").is_file() else None


def bench_command(
    quick: Annotated[bool, typer.Option(help="few iterations: a smoke run")] = False,
    only: Annotated[
        str | None, typer.Option(help="comma-separated: trivial,chart,session,throughput,memory")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="also write the report as JSON here")
    ] = None,
) -> None:
    """Measure jobs, sessions, throughput and memory against baselines from the same run."""
    root = checkout()
    if root is None:
        typer.echo("sandcell bench runs from a source checkout (bench/ beside src/)", err=True)
        raise typer.Exit(2)
    args = ["--quick"] if quick else []
    args += ["--only", only] if only else []
    args += ["--json", str(json_out.resolve())] if json_out else []
    done = subprocess.run([sys.executable, "-m", "bench.suite", *args], cwd=root, check=False)
    raise typer.Exit(done.returncode)
