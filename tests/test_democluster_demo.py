"""The demo's orchestration: progress display and honest reporting of steps that cannot run."""

from __future__ import annotations

import io
import re
from pathlib import Path

from wattclass.demo import Progress, StepUnavailable, available_commands, run_demo
from wattclass.democluster import ClusterSpec
from wattclass.errors import DataError


def test_progress_reports_each_outcome_with_its_time() -> None:
    ticks = iter([0.0, 1.5, 2.0, 2.0, 3.0, 3.0])
    buf = io.StringIO()
    p = Progress(total=4, stream=buf, clock=lambda: next(ticks))
    assert p.run("one", lambda: "12 jobs") == ("ok", "12 jobs")

    def missing() -> str:
        raise StepUnavailable("`wattclass x` is not in this build")

    def broken() -> str:
        raise DataError("f.parquet: missing column energy_j")

    assert p.run("two", missing)[0] == "unavailable"
    assert p.run("three", broken) == ("failed", "f.parquet: missing column energy_j")
    p.skip("four", "needs two")
    assert buf.getvalue().splitlines() == [
        "[1/4] one ... done in 1.5 s: 12 jobs",
        "[2/4] two ... unavailable: `wattclass x` is not in this build",
        "[3/4] three ... FAILED: f.parquet: missing column energy_j",
        "[4/4] four ... skipped (needs two)",
    ]


def test_demo_builds_the_cluster_and_never_runs_a_step_without_its_input(tmp_path: Path) -> None:
    buf = io.StringIO()
    spec = ClusterSpec(nodes=2, gpus_per_node=2, span_s=900, job_max_s=300)
    results = run_demo(tmp_path, buf, spec)
    assert results["cluster"][0] == "ok"
    assert (tmp_path / "cluster" / "jobs.csv").exists()
    lines = buf.getvalue().splitlines()
    assert [re.match(r"\[(\d)/5\]", ln).group(1) for ln in lines] == ["1", "2", "3", "4", "5"]  # type: ignore[union-attr]
    if "telemetry" not in available_commands():
        assert results["telemetry"][0] == "unavailable"
        assert results["report"] == ("skipped", "needs telemetry")
    if results["telemetry"][0] == "ok":
        assert results["report"][0] == "ok" and (tmp_path / "report.html").exists()
