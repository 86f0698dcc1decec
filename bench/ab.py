"""Sandcell at another commit beside this checkout: which one is faster, on a VM that drifts.

    .venv/bin/python -m bench.ab BASE [--rounds 8] [--jobs 150] [--concurrency 16]
                                      [--runtime bwrap|gvisor]

BASE is a git revision. It is checked out in a temporary worktree and served with its sources
first on PYTHONPATH (the same venv and images); this checkout is served beside it. Both run
the same trivial jobs on one runtime (bwrap unless asked), in rounds that alternate between
the two servers (and which goes first), so that the minute-by-minute drift of this VM falls
on both alike.
For each: the rate, the machine's CPU per job and the API's and the worker's own.

A change of a few percent is lost in the drift between two runs of the suite; here it shows.
Needs root and the built `python` image.
"""

import argparse
import json
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench import _http as jobs
from bench._baselines import cpu_spent_s, process_cpu_s
from bench._server import server, tenant_client
from bench.suite import COLD, TRIVIAL, Spent, ratio, ratios_by_round

REPO = Path(__file__).resolve().parents[1]
WARM_JOBS = 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", help="a git revision to set beside this checkout")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=150, help="per server and round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--runtime", choices=("bwrap", "gvisor"), default="bwrap")
    args = parser.parse_args()
    measured = measure(args.base, args.rounds, args.jobs, args.concurrency, args.runtime)
    print(json.dumps(measured, indent=2))


def measure(
    base: str, rounds: int, count: int, concurrency: int, runtime: str = "bwrap"
) -> dict[str, Any]:
    env = COLD | {"SANDCELL_RUNTIME": runtime, "SANDCELL_WORKER_SLOTS": str(concurrency)}
    if runtime == "bwrap":
        env["SANDCELL_ALLOW_WEAK_ISOLATION"] = "1"
    with (
        tempfile.TemporaryDirectory(dir="/var/tmp") as scratch,
        _worktree(base) as sources,
        ExitStack() as stack,
    ):
        Path(scratch).chmod(0o711)  # bwrap opens its bind sources as the sandbox's uid
        data = {"base": Path(scratch) / "base", "head": Path(scratch) / "head"}
        envs = {"base": env | {"PYTHONPATH": str(sources / "src")}, "head": env}
        clients = {
            name: stack.enter_context(tenant_client(stack.enter_context(server(data[name], e))))
            for name, e in envs.items()
        }
        # The lean client the suite's throughput rounds use: what it costs is not the service's.
        runs = {
            name: stack.enter_context(jobs.lean_job_runner(http, TRIVIAL))
            for name, http in clients.items()
        }
        spent = {name: Spent() for name in clients}
        own_cpu = {name: defaultdict[str, float](float) for name in clients}
        for run in runs.values():
            for _ in range(WARM_JOBS):
                run()
        for n in range(rounds):
            order = list(clients) if n % 2 == 0 else list(reversed(clients))
            for name in order:
                before = process_cpu_s(str(data[name]))
                spent[name].add(runs[name], count, concurrency)
                for role, s in cpu_spent_s(before, str(data[name])).items():
                    own_cpu[name][role] += s
    out: dict[str, Any] = {"base_revision": base, "runtime": runtime, "concurrency": concurrency}
    out["jobs_per_round"] = count
    for name, done in spent.items():
        out[name] = {
            "jobs_per_s": done.rate(),
            "rate_by_round": [round(r, 2) for r in done.round_rates],
            "cpu_ms_per_job": done.cpu_ms_per_action(),
        } | {
            f"{role}_cpu_ms_per_job": round(s / done.done * 1000, 2)
            for role, s in own_cpu[name].items()
        }
    out["head_vs_base"] = ratio(spent["head"].rate(), spent["base"].rate())
    out["head_vs_base_by_round"] = ratios_by_round(spent["head"], spent["base"])
    return out


@contextmanager
def _worktree(revision: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as parent:
        Path(parent).chmod(0o711)  # its guest package is bound into the sandboxes
        tree = Path(parent) / "base"
        git = ["git", "-C", str(REPO)]
        add = [*git, "worktree", "add", "--detach", str(tree), revision]
        subprocess.run(add, check=True, capture_output=True)
        try:
            yield tree
        finally:
            remove = [*git, "worktree", "remove", "--force", str(tree)]
            subprocess.run(remove, check=False, capture_output=True)


if __name__ == "__main__":
    main()
