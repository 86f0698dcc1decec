"""`sandcell bench`: every headline figure of issue 6 in one run, each beside its baseline.

    .venv/bin/sandcell bench [--quick] [--only trivial,chart,session,throughput,memory]
    .venv/bin/python -m bench.suite  (the same)

Baselines are measured in this run, on this machine: bare `python3.11 -c 'print(1)'`, a cold
`runsc run` and a raw `bwrap` over the same image root; for memory, the image's interpreter
with the pool's imports done, outside any sandbox. Each case starts its own `sandcell serve`
(SQLite, scratch data dir): with SANDCELL_POOL_SIZE empty for cold sandboxes, and with a warm
pool for the pooled cases. Medians and p90s; ratios are medians over the baseline's median
(throughput: rate over the raw tool's rate at the same concurrency). The report goes to stdout
as JSON; a table of issue 6's targets, each met, missed or not measured, ends the run on
stderr (bench/targets.py).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import _http as jobs
from bench._baselines import (
    bare_python,
    bare_python_printing,
    busy_cpu_s,
    contract_runsc_launcher,
    cpu_spent_s,
    interpreter_alone_mib,
    isolated_bwrap_launcher,
    process_cpu_s,
    pss_mib,
    rate,
    raw_bwrap_once,
    runsc_launcher,
    summary,
    timed,
)
from bench._server import IMAGE_DIR, UNLIMITED, server, tenant_client, worker_client
from bench.targets import print_verdicts
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.runtime.pool import PRELOADS
from sandcell.runtime.volatile import volatile_dir
from sandcell.settings import Settings

SECTIONS = ("trivial", "chart", "session", "throughput", "memory")
# Cold: no warm sandboxes for jobs and no pre-started session kernels.
COLD = UNLIMITED | {"SANDCELL_POOL_SIZE": "", "SANDCELL_SESSION_POOL_SIZE": ""}
SESSION_POOLED = COLD | {"SANDCELL_SESSION_POOL_SIZE": "python-data=1"}
POOL_READY_TIMEOUT_S = 60.0
TRIVIAL = {"code": "print(1)"}
PRINT_LOOP = "for i in range(10_000):\n    print(i)"  # a cell that prints a lot, and its baseline


class Plan:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.runs = 2 if quick else 20  # sequential jobs per case
        self.chart_runs = 1 if quick else 6
        self.sessions = 1 if quick else 3
        self.cells = 10 if quick else 200
        self.print_cells = 2 if quick else 10
        self.concurrency = (1, 4) if quick else (1, 4, 16)
        self.rounds = 1 if quick else 3  # throughput: ours and raw take turns this many times

    def jobs_per_round(self, runtime: str, concurrency: int) -> int:
        """Jobs in one throughput round: some waves of `concurrency`, for a steady rate.

        A round's last wave runs with fewer clients than `concurrency`, and its tail counts
        against the rate. bwrap's jobs are short (a round of 3 waves took under a second at
        16), so they get 9 waves: in four runs taking turns, 3 waves gave 75.4 and 72.6 bwrap
        jobs/s at 16, 9 waves 75.9 and 77.3 (the same as `bench.ab`'s 150-job rounds)."""
        if self.quick:
            return 2 * concurrency
        base, per_client = {"gvisor": (4, 2), "bwrap": (10, 9)}[runtime]
        return base + per_client * concurrency


def pool_available() -> bool:
    return "pool_size" in Settings.model_fields


def session_pool_available() -> bool:
    return "session_pool_size" in Settings.model_fields


@contextmanager
def scratch_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sandcell-bench-", dir="/var/tmp"))
    path.chmod(0o711)  # bwrap runs as the sandbox's uid and must reach its bind sources
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("nan")


# baselines


def baselines(plan: Plan) -> dict[str, Any]:
    python = FilesystemImageCatalog(IMAGE_DIR).get("python")
    with runsc_launcher(python.rootfs) as runsc_once:
        runsc_once()  # page cache
        cold_runsc = summary(timed(runsc_once, plan.runs))
    bwrap_once = raw_bwrap_once(python.rootfs)
    bwrap_once()
    return {
        "bare_python": summary(bare_python(plan.runs)),
        "cold_runsc_run": cold_runsc,
        "raw_bwrap": summary(timed(bwrap_once, plan.runs)),
    }


# 1. trivial job; 2. CSV → chart


def sequential_jobs(
    url: str, body: dict[str, Any], runs: int, pool_image: str | None
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """`runs` jobs one after another (after one warm-up), each timed submit → completed; with
    `pool_image`, each once that image's job pool has a warm sandbox again."""
    with tenant_client(url) as http:
        job_body = body | _inputs(http, body)
        jobs.completed(jobs.run_job(http, job_body))
        samples, records = [], []
        for _ in range(runs):
            if pool_image:
                _wait_for_pool(http, "jobs", pool_image)  # outside the timed part
            started = time.perf_counter()
            records.append(jobs.completed(jobs.run_job(http, job_body)))
            samples.append((time.perf_counter() - started) * 1000)
    return summary(samples), records


def _inputs(http: Any, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("image") != "python-data":
        return {}
    file_id = jobs.upload(http, "data.csv", jobs.chart_csv())
    return {"inputs": [{"file_id": file_id, "path": "data.csv"}]}


def job_case(plan: Plan, name: str, body: dict[str, Any], image: str, runs: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with scratch_dir() as base, server(base / "cold", COLD) as url:
        result["cold"], records = sequential_jobs(url, body, runs, None)
        result["cold_queue_ms"] = summary([r["queue_ms"] for r in records])
    if not pool_available():
        result["pooled"] = "no warm pool in this build (SANDCELL_POOL_SIZE unknown): cold only"
        return result
    pooled_env = UNLIMITED | {"SANDCELL_POOL_SIZE": f"{image}=1"}
    with scratch_dir() as base, server(base / "pooled", pooled_env) as url:
        result["pooled"], records = sequential_jobs(url, body, runs, image)
        result["pooled_runs"] = sum(1 for r in records if r.get("pooled"))
    result["cold_vs_pooled"] = ratio(result["cold"]["median_ms"], result["pooled"]["median_ms"])
    return result


def trivial(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    result = job_case(plan, "trivial", TRIVIAL, "python", plan.runs)
    for case in ("cold", "pooled"):
        if isinstance(result.get(case), dict):
            median = result[case]["median_ms"]
            result[f"{case}_vs_python"] = ratio(median, base["bare_python"]["median_ms"])
            result[f"{case}_vs_runsc"] = ratio(median, base["cold_runsc_run"]["median_ms"])
    if pool_available():
        result["bwrap"] = _bwrap_trivial(plan, base)
    return result


def _bwrap_trivial(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    """The same job on the bwrap tier, cold and from its own warm pool."""
    weak = COLD | {"SANDCELL_RUNTIME": "bwrap", "SANDCELL_ALLOW_WEAK_ISOLATION": "1"}
    out: dict[str, Any] = {}
    for case, image in (("cold", None), ("pooled", "python")):
        env = weak | ({"SANDCELL_POOL_SIZE": f"{image}=1"} if image else {})
        with scratch_dir() as scratch, server(scratch / case, env) as url:
            out[case], records = sequential_jobs(url, TRIVIAL, plan.runs, image)
        median = out[case]["median_ms"]
        out[f"{case}_vs_python"] = ratio(median, base["bare_python"]["median_ms"])
        out[f"{case}_vs_raw_bwrap"] = ratio(median, base["raw_bwrap"]["median_ms"])
    out["pooled_runs"] = sum(1 for r in records if r.get("pooled"))
    return out


def chart(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    body = {"image": "python-data", "code": jobs.CHART_CODE, "limits": {"timeout_s": 120}}
    return job_case(plan, "chart", body, "python-data", plan.chart_runs)


# 3. sessions


def session(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    """Cold kernels, then kernels from a session pool (SANDCELL_SESSION_POOL_SIZE)."""
    result: dict[str, Any] = {}
    cases = [("cold", COLD)]
    if session_pool_available():
        cases.append(("pooled", SESSION_POOLED))
    for case, env in cases:
        with scratch_dir() as scratch, server(scratch / case, env) as url:
            result[case] = _sessions(plan, url, scratch / case, case == "pooled")
    for case in [name for name, _ in cases]:
        result[f"{case}_round_trip_vs_python"] = ratio(
            result[case]["execute_1+1"]["median_ms"], base["bare_python"]["median_ms"]
        )
    if "pooled" in result:
        firsts = [result[c]["create_to_first_result"]["median_ms"] for c in ("cold", "pooled")]
        result["first_result_cold_vs_pooled"] = ratio(*firsts)
    return result


def _sessions(plan: Plan, url: str, data_dir: Path, pooled: bool) -> dict[str, Any]:
    """Each session: created and `1+1` run (timed), from a ready pool when `pooled`; the
    first one also times `plan.cells` round trips and its idle memory."""
    creates, firsts, from_pool = [], [], 0
    out: dict[str, Any] = {}
    with tenant_client(url) as http:
        for n in range(plan.sessions):
            if pooled:
                _wait_for_pool(http, "sessions", "python-data")  # outside the timed part
            sid, created, first = jobs.session_first_result(http, "python-data")
            creates.append(created)
            firsts.append(first)
            from_pool += bool(http.get(f"/v1/sessions/{sid}").json().get("pooled"))
            if n == 0:
                if pooled:  # the refill after this take is not what a cell costs
                    _wait_for_pool(http, "sessions", "python-data")
                out |= _round_trip(plan, http, data_dir, sid)
                time.sleep(1)  # idle
                out["idle_session_pss_mib"] = _per_sandbox(data_dir / "session-sandboxes")
            http.delete(f"/v1/sessions/{sid}").raise_for_status()
    out["create"] = summary(creates)
    out["create_to_first_result"] = summary(firsts)
    out["sessions_from_pool"] = f"{from_pool}/{plan.sessions}"
    return out


def _round_trip(plan: Plan, http: Any, data_dir: Path, sid: str) -> dict[str, Any]:
    """`1+1` over HTTP; beside it, from the same run, what any design with the API and the
    sessions in two processes pays before it checks a key or records a cell: an empty request
    to each (the API's `/healthz`, an unrouted path of the worker's) and the kernel's own round
    trip (the worker's timing of the cell, in each answer)."""
    kernel_ms: list[float] = []

    def cell() -> None:
        kernel_ms.append(jobs.execute(http, sid, "1+1")["duration_ms"])

    with jobs.direct_client(http, sid) as (direct, lean):
        # Through the API and straight to the worker (POST /v1/sessions/{id}/direct), turn
        # about: this VM's speed drifts by the minute.
        via_api, straight, straight_lean = [], [], []
        for _ in range(plan.cells):
            via_api += timed(cell, 1)
            straight += timed(direct, 1)
            straight_lean += timed(lean, 1)
    out: dict[str, Any] = {"execute_1+1": summary(via_api), "kernel_1+1": summary(kernel_ms)}
    out["direct_1+1"] = summary(straight)
    out["direct_1+1_stdlib_client"] = summary(straight_lean)
    # Printing 10,000 lines: the cell over HTTP, and a bare python doing it into a pipe.
    out["print_10000_lines"] = summary(
        timed(lambda: jobs.execute(http, sid, PRINT_LOOP), plan.print_cells)
    )
    alone = summary(timed(lambda: bare_python_printing(PRINT_LOOP), plan.print_cells))
    out["print_10000_lines_bare_python"] = alone
    printed = out["print_10000_lines"]["median_ms"]
    out["print_10000_lines_vs_python"] = ratio(printed, alone["median_ms"])
    out["empty_api_request"] = summary(timed(lambda: http.get("/healthz"), plan.cells))
    with worker_client(data_dir) as worker:
        empty = summary(timed(lambda: worker.get("/internal/none"), plan.cells))
    out["empty_worker_request"] = empty
    parts = ("empty_api_request", "empty_worker_request", "kernel_1+1")
    out["two_process_floor_ms"] = round(sum(out[part]["median_ms"] for part in parts), 1)
    # One hop: what a direct cell pays before the token check and the cell's record.
    out["direct_floor_ms"] = round(sum(out[part]["median_ms"] for part in parts[1:]), 1)
    return out


def _wait_for_pool(http: Any, kind: str, image: str, count: int = 1) -> None:
    """Until the worker reports `count` ready sandboxes (`kind`: jobs or sessions) of `image`
    (its heartbeat, in /metrics)."""
    time.sleep(1.5)  # a fresh report: the one before the last take may still say ready
    deadline = time.monotonic() + POOL_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        text = http.get("/metrics/").text
        for line in text.splitlines():
            ready = line.startswith("sandcell_pool_ready{") and f'kind="{kind}"' in line
            if ready and f'image="{image}"' in line and float(line.split()[-1]) >= count:
                return
        time.sleep(0.2)


# 4. throughput


def throughput(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    image = FilesystemImageCatalog(IMAGE_DIR).get("python")
    result: dict[str, Any] = {}
    with (
        runsc_launcher(image.rootfs) as runsc_once,
        contract_runsc_launcher(image) as contract_runsc_once,
        isolated_bwrap_launcher(image.rootfs) as isolated_bwrap_once,
    ):
        raw = {"gvisor": runsc_once, "bwrap": raw_bwrap_once(image.rootfs)}
        floors = {"gvisor": contract_runsc_once, "bwrap": isolated_bwrap_once}
        for runtime in ("gvisor", "bwrap"):
            result[runtime] = _throughput(plan, runtime, raw[runtime], floors[runtime])
    return result


def _throughput(
    plan: Plan, runtime: str, raw_once: Callable[[], None], floor_once: Callable[[], None]
) -> dict[str, Any]:
    """sandcell's rate against the raw tool's and against the floor: the tool with only the
    isolation the contract requires (see contract_runsc_launcher, isolated_bwrap_launcher)."""
    env = COLD | {"SANDCELL_RUNTIME": runtime, "SANDCELL_WORKER_SLOTS": "16"}
    if runtime == "bwrap":
        env["SANDCELL_ALLOW_WEAK_ISOLATION"] = "1"
    out: dict[str, Any] = {}
    with (
        scratch_dir() as scratch,
        server(scratch / runtime, env) as url,
        tenant_client(url) as http,
        jobs.lean_job_runner(http, TRIVIAL) as job,
    ):
        job()
        for c in plan.concurrency:
            share = plan.jobs_per_round(runtime, c)
            ours, theirs, floor = Spent(), Spent(), Spent()
            service_before = process_cpu_s(str(scratch / runtime))
            # Ours and raw take turns, a share of the jobs each: this VM's speed drifts by the
            # minute, and two long runs one after the other would each see a different machine.
            for _ in range(plan.rounds):
                ours.add(job, share, c)
                theirs.add(raw_once, share, c)
                floor.add(floor_once, share, c)
            service = cpu_spent_s(service_before, str(scratch / runtime))
            out[f"c{c}"] = {
                "jobs_per_s": ours.rate(),
                "raw_per_s": theirs.rate(),
                "ratio": ratio(ours.rate(), theirs.rate()),
                "ratio_by_round": ratios_by_round(ours, theirs),
                # Where the two cores went, per job: the whole machine, and of that the API's
                # and the worker's own Python, and this client's (the rest: the sandboxes and
                # the kernel).
                "cpu_ms_per_job": ours.cpu_ms_per_action(),
                "client_cpu_ms_per_job": ours.client_cpu_ms_per_action(),
                "raw_cpu_ms_per_start": theirs.cpu_ms_per_action(),
                **{
                    f"{role}_cpu_ms_per_job": round(s / ours.done * 1000, 1)
                    for role, s in service.items()
                },
                "floor_per_s": floor.rate(),
                "floor_cpu_ms_per_start": floor.cpu_ms_per_action(),
                "floor_vs_raw": ratio(floor.rate(), theirs.rate()),
            }
        if runtime == "bwrap":
            out["egress_job"] = _egress_probe(http)
    return out


class Spent:
    """Actions done, wall seconds, machine CPU seconds and this process's, summed over rounds;
    and each round's rate, to set beside the other launcher's rate in the same round."""

    def __init__(self) -> None:
        self.done, self.wall_s, self.cpu_s, self.client_cpu_s = 0, 0.0, 0.0, 0.0
        self.round_rates: list[float] = []

    def add(self, action: Callable[[], object], count: int, concurrency: int) -> None:
        busy, client = busy_cpu_s(), time.process_time()
        per_s = rate(action, count, concurrency)
        self.cpu_s += busy_cpu_s() - busy
        self.client_cpu_s += time.process_time() - client
        self.done += count
        self.wall_s += count / per_s
        self.round_rates.append(per_s)

    def rate(self) -> float:
        return round(self.done / self.wall_s, 2)

    def cpu_ms_per_action(self) -> float:
        return round(self.cpu_s / self.done * 1000, 1)

    def client_cpu_ms_per_action(self) -> float:
        return round(self.client_cpu_s / self.done * 1000, 2)


def ratios_by_round(ours: Spent, theirs: Spent) -> list[float]:
    """Each round's ratio: their spread shows how far this VM's drift moves the overall one."""
    return [ratio(a, b) for a, b in zip(ours.round_rates, theirs.round_rates, strict=True)]


def _egress_probe(http: Any) -> str:
    """Whether a job that asks for network egress runs on this runtime."""
    body = TRIVIAL | {"network": {"allow": ["example.com"]}}
    record = jobs.run_job(http, body)
    return f"{record['state']}/{record['reason']}: {record['detail']}"


# 5. memory


def memory(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    if not pool_available():
        return {"pooled": "no warm pool in this build: nothing to measure"}
    result: dict[str, Any] = {}
    images = ("python",) if plan.quick else ("python", "python-data")
    catalog = FilesystemImageCatalog(IMAGE_DIR)
    for image in images:
        env = UNLIMITED | {"SANDCELL_POOL_SIZE": f"{image}=2", "SANDCELL_POOL_MEMORY_MB": "2048"}
        with scratch_dir() as scratch, server(scratch / image, env) as url:
            with tenant_client(url) as http:
                _wait_for_pool(http, "jobs", image, count=2)
            time.sleep(2)  # settle
            pooled = _per_sandbox(scratch / image / "sandboxes")
        # The baseline: the same interpreter with the pool's imports done, and no sandbox.
        alone = interpreter_alone_mib(catalog.get(image).rootfs, PRELOADS.get(image, ()))
        result[f"idle_pooled_{image}_pss_mib"] = pooled
        result[f"interpreter_alone_{image}"] = alone
        result[f"idle_pooled_{image}_vs_interpreter"] = ratio(
            pooled["per_sandbox_mib"], alone["rss_mib"]
        )
    return result


def _per_sandbox(state_dir: Path) -> dict[str, float]:
    """PSS of every runsc process of the runtime with this state dir (sentry, gofer, …), per
    sandbox (sentries). Their command lines name the runtime's volatile dir, not state_dir."""
    marker = f"{volatile_dir(state_dir)}/"
    total, _ = pss_mib(marker)
    sandboxes = pss_mib_count_sentries(marker)
    return {
        "sandboxes": sandboxes,
        "per_sandbox_mib": round(total / sandboxes, 1) if sandboxes else 0,
    }


def pss_mib_count_sentries(marker: str) -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in b" ".join(argv) and b"boot" in argv:
            count += 1
    return count


# the run


MEASURES: dict[str, Callable[[Plan, dict[str, Any]], dict[str, Any]]] = {
    "trivial": trivial,
    "chart": chart,
    "session": session,
    "throughput": throughput,
    "memory": memory,
}


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="sandcell bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few iterations (a smoke run)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    sections = [s for s in args.only.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    plan = Plan(args.quick)
    report: dict[str, Any] = {
        "command": " ".join(["sandcell bench", *argv]),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "pool": "available" if pool_available() else "not in this build: pooled cases skipped",
    }
    report["baselines"] = base = baselines(plan)
    for section in sections:
        report[section] = _section(section, plan, base)
        if args.json:  # as it goes: a failure late in a long run keeps what came before
            args.json.write_text(json.dumps(report, indent=2))
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


def _section(section: str, plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    """One section's figures; a failed section is reported as such and the run goes on."""
    started = time.monotonic()
    try:
        result = MEASURES[section](plan, base)
    except (Exception, SystemExit) as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
    result["section_s"] = round(time.monotonic() - started, 1)
    print(f"[bench] {section} done", file=sys.stderr, flush=True)
    return result


def failed(report: dict[str, Any]) -> list[str]:
    return [name for name in SECTIONS if "error" in report.get(name, {})]


def main(argv: list[str] | None = None) -> None:
    report = run(sys.argv[1:] if argv is None else argv)
    print(json.dumps(report, indent=2))
    print_verdicts(report)
    if failed(report):
        raise SystemExit(f"sections failed: {', '.join(failed(report))}")


if __name__ == "__main__":
    main()
