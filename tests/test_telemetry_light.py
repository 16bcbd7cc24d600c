"""The node daemon stays light: a whole run (polls, WAL, Parquet rolls, shutdown) never imports
pandas, matplotlib or lightgbm (issue 15: pandas alone cost the daemon ~30 MB of RSS and 0.6 s of
CPU, pulled in by ``wattclass report``'s registration and by pyarrow at the first roll).

Run on the file-state backend (the CI hardware boundary), as ``wattclass telemetry run`` is started
by systemd: the whole command parser is built, then the daemon polls and rolls until SIGTERM.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from wattclass.gpu.filestate import FileStateBackend

#: pyarrow.compute too: its first import (at the first Arrow cast) cost 0.17 s of CPU on the H200.
HEAVY = ("pandas", "matplotlib", "lightgbm", "scipy", "sklearn", "duckdb", "pyarrow.compute")

_CHILD = f"""
import json, sys
import wattclass.cli as cli
rc = None
try:
    rc = cli.main(sys.argv[1:])
finally:
    print(json.dumps({{"rc": rc, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}), flush=True)
"""


def _run(args: list[str], stop_after_s: float | None, preamble: str = "") -> dict[str, object]:
    p = subprocess.Popen([sys.executable, "-c", preamble + _CHILD, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if stop_after_s is not None:
        time.sleep(stop_after_s)
        p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    lines = out.strip().splitlines()
    assert lines, err
    return dict(json.loads(lines[-1]))


def test_daemon_run_imports_no_heavy_module(tmp_path: Path) -> None:
    FileStateBackend.create(tmp_path / "gpus.json", n=2)
    root = tmp_path / "data"
    # 0.2 s polls, 1 s windows, a roll every second: several rolls inside a 5 s run.
    out = _run(["-q", "telemetry", "run", "--backend", f"filestate:{tmp_path / 'gpus.json'}",
                "--data-root", str(root), "--host", "n1", "--poll", "0.2", "--period", "1",
                "--roll-seconds", "1", "--spool", str(tmp_path / "spool")], stop_after_s=5.0)
    assert out == {"rc": 0, "loaded": []}
    files = sorted((root / "telemetry").rglob("*.parquet"))
    assert len(files) > 1  # rolled inside the run, not only at shutdown
    assert sum(pq.ParquetFile(f).metadata.num_rows for f in files) > 0


def test_the_probe_sees_a_heavy_import() -> None:
    """The check itself can fail: a process that does import pandas is reported."""
    out = _run(["telemetry", "inspect", "/nonexistent"], stop_after_s=None, preamble="import pandas\n")
    assert "pandas" in out["loaded"]  # type: ignore[operator]
