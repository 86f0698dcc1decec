"""The bench's verdicts on issue 6's targets, read off a report."""

from bench.targets import verdicts


def by_target(report: dict) -> dict[str, tuple[str, str]]:
    return {name: (shown, verdict) for name, shown, verdict in verdicts(report)}


def test_each_target_is_met_missed_or_not_measured() -> None:
    report = {
        "trivial": {"pooled_vs_python": 1.95},
        "chart": {"pooled": {"median_ms": 720.0}},
        "throughput": {"gvisor": {"c16": {"ratio": 0.8}}, "bwrap": {"c16": {"jobs_per_s": 47.6}}},
        "memory": {
            "idle_pooled_python_pss_mib": {"per_sandbox_mib": 25.9},
            "idle_pooled_python-data_pss_mib": {"per_sandbox_mib": 57.3},  # 60.08 MB
        },
        "session": {"error": "RuntimeError: the section failed"},
    }
    found = by_target(report)
    assert found["pooled print(1), submit -> completed <= 2 x python"] == ("1.95 x python", "met")
    assert found["CSV -> chart from the pool <= 600 ms"] == ("720.00 ms", "missed")
    assert found["gVisor throughput at concurrency 16 >= 0.8 x raw runsc"][1] == "met"
    assert found["gVisor throughput at concurrency 4 >= 0.8 x raw runsc"] == ("-", "not measured")
    assert found["bwrap throughput at concurrency 16 >= 80 jobs/s"][1] == "missed"
    assert found["idle pooled python sandbox (PSS) <= 60 MB"] == ("27.16 MB", "met")
    assert found["idle pooled python-data sandbox (PSS) <= 60 MB"] == ("60.08 MB", "missed")
    assert found["direct 1+1 round trip (http.client) <= 3 ms"] == ("-", "not measured")
    assert len(found) == 11


def test_a_figure_that_is_not_a_number_is_not_measured() -> None:
    report = {"trivial": {"pooled_vs_python": None}, "chart": {"pooled": "cold only"}}
    found = by_target(report)
    assert found["pooled print(1), submit -> completed <= 2 x python"][1] == "not measured"
    assert found["CSV -> chart from the pool <= 600 ms"][1] == "not measured"


def test_a_miss_whose_baseline_alone_is_past_the_limit_is_out_of_reach() -> None:
    memory = {
        "idle_pooled_python_pss_mib": {"per_sandbox_mib": 64.0},
        "interpreter_alone_python": {"rss_mib": 8.0, "anonymous_mib": 2.7},
        "idle_pooled_python-data_pss_mib": {"per_sandbox_mib": 106.0},
        "interpreter_alone_python-data": {"rss_mib": 86.5, "anonymous_mib": 57.9},  # 60.71 MB
    }
    found = by_target({"memory": memory})
    assert found["idle pooled python sandbox (PSS) <= 60 MB"] == ("67.11 MB", "missed")
    assert found["idle pooled python-data sandbox (PSS) <= 60 MB"] == (
        "111.15 MB",
        "out of reach (its baseline alone: 60.71 MB)",
    )
