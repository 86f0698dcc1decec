"""`sandcell acceptance`: the built-in acceptance test (DESIGN.md section 9) against a URL."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

err = Console(stderr=True)


def acceptance(
    url: Annotated[str, typer.Option(envvar="SANDCELL_URL", help="the deployment's API")],
    admin_key: Annotated[
        str, typer.Option(envvar="SANDCELL_ADMIN_KEY", help="an admin key of that deployment")
    ],
    report: Annotated[Path | None, typer.Option(help="write the JSON report here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report only")] = False,
    step: Annotated[
        list[int] | None, typer.Option(help="run only these steps (1-5; repeatable)")
    ] = None,
    load: Annotated[int, typer.Option(min=1, max=200, help="small jobs in step 3")] = 8,
) -> None:
    """Run the five acceptance steps against a running deployment; exit 1 on any failure.

    Run it on the deployment's host: it starts loopback endpoints (127.0.0.1, 127.0.0.2) that
    jobs must reach, so the deployment's egress proxy must be allowed loopback
    (SANDCELL_EGRESS_ALLOWED_NETWORKS='["127.0.0.0/8"]', SANDCELL_EGRESS_ANY_PORT=1).
    """
    # Lazily: the runner brings the API's schemas and more; every other command starts without.
    from sandcell.acceptance import STEPS, Options, run_acceptance
    from sandcell.acceptance.report import print_tables

    chosen = tuple(step or STEPS)
    if unknown := set(chosen) - set(STEPS):
        raise typer.BadParameter(f"no step {sorted(unknown)}; steps are 1-5", param_hint="--step")
    console = Console(stderr=as_json)  # with --json, stdout holds the JSON and nothing else
    options = Options(url=url, admin_key=admin_key, steps=chosen, load=load)
    with console.status("running the acceptance steps…"):
        result = run_acceptance(options, lambda s: console.log(_line(s.number, s.passed)))
    if report is not None:
        report.write_text(json.dumps(result, indent=2) + "\n")
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print_tables(console, result)
    if not result["passed"]:
        raise typer.Exit(1)


def _line(number: int, passed: bool) -> str:
    return f"step {number}: {'[green]pass[/green]' if passed else '[red]FAIL[/red]'}"
