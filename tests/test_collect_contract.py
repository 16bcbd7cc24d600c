"""Contract tests: the standalone collection tool (tools/h200_collect) agrees with wattclass.

The tool runs on a bare GPU machine without wattclass, so it keeps its own copies of three
contracts. These tests fail when either side changes alone:

* GPM metric ids: each recorded ``gpm_*`` column carries the NVML metric id that the daemon's
  NVML backend (wattclass.gpu.nvml.GPM_METRIC_IDS) asks for under the replayed field's name;
* the GPU -> job file the tool writes (acting as Prolog) is read back by wattclass.jobmap;
* the labels a workload can be built to have are wattclass.labeltable.LABELS plus ``low``
  (the collection's name for starved/tiny work, which the GPM rule turns into idle or a class).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

from wattclass.gpu.nvml import GPM_METRIC_IDS
from wattclass.gpu.replay import GPM_COLUMNS as REPLAY_GPM_COLUMNS
from wattclass.jobmap import FORMAT_VERSION, JobMapReader, read_job_file
from wattclass.labeltable import LABELS

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def tool(module: str) -> object:
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    return importlib.import_module(f"h200_collect.{module}")


def test_gpm_ids_match_the_nvml_backend() -> None:
    recorded: dict[str, int] = tool("config").GPM_IDS  # type: ignore[attr-defined]
    backend = dict(GPM_METRIC_IDS)
    checked = 0
    for column, field in REPLAY_GPM_COLUMNS.items():
        if field in backend:
            assert recorded[column] == backend[field], f"{column}: tool id != nvml backend id ({field})"
            checked += 1
    # every metric the daemon reads is recorded by the tool (replay could not supply it otherwise)
    assert checked == len(backend)
    assert set(REPLAY_GPM_COLUMNS) <= set(recorded)


def test_job_file_written_by_the_tool_is_read_by_jobmap(tmp_path: Path) -> None:
    runner_mod = tool("runner")
    spool = tmp_path / "spool"
    cfg = SimpleNamespace(spool=str(spool))
    r = runner_mod.Runner.__new__(runner_mod.Runner)  # type: ignore[attr-defined]
    r.cfg, r.uuid = cfg, "GPU-9026ca80-8548-f41f-3e69-ccd41944a5ef"
    r.write_spool("7042", "chen")
    path = spool / f"{r.uuid}.json"
    spool.chmod(0o755)
    path.chmod(0o644)
    job = read_job_file(path)
    assert job is not None and (job.job_id, job.user, job.uid) == ("7042", "chen", None)
    import json

    assert json.loads(path.read_text())["version"] == FORMAT_VERSION
    assert JobMapReader(spool).lookup(r.uuid) == job
    r.write_spool(None, None)
    assert not path.exists()


def test_tool_labels_are_the_label_table_labels_plus_low() -> None:
    config = tool("config")
    assert set(config.LABELS) == set(LABELS) | {"low"}  # type: ignore[attr-defined]
    catalog = tool("catalog")
    assert {w.label for w in catalog.workloads()} <= set(config.LABELS)  # type: ignore[attr-defined]
    sweep = tool("workloads.sweep")
    assert {w.label for w in sweep.plan(3, 200)} <= set(LABELS)  # type: ignore[attr-defined]
