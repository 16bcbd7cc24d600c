"""How long ``wattclass report`` takes, and how much memory, over 1 and N days of a fleet.

Runs the real command as a child process (``bench/fleet_nightly.measure``: wall time, peak RSS
of the process tree sampled every 0.1 s) on ``--data-root``, once per ``--days`` value, ending
at ``--date``. Target (issue 15): 30 days of 1,000 GPUs (259 M windows) in at most 5 min, 8 GB.

  python bench/report_scale.py --data-root /work/bench-data/fleet-1k-30d --date 2026-11-29 --days 1 30
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchstamp import emit
from fleet_nightly import measure


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--days", type=int, nargs="+", default=[1, 30])
    a = ap.parse_args()
    out: dict[str, object] = {"benchmark": "wattclass report over N days", "data_root": str(a.data_root),
                              "date": a.date, "runs": []}
    for days in a.days:
        with tempfile.TemporaryDirectory(prefix="report-scale-") as tmp:
            html = Path(tmp) / "report.html"
            m = measure([sys.executable, "-m", "wattclass.cli", "-q", "report", "--data-root",
                         str(a.data_root), "--date", a.date, "--days", str(days), "--out", str(html)])
            m.pop("stdout")
            runs = out["runs"]
            assert isinstance(runs, list)
            runs.append({"days": days, **m, "html_kib": round(html.stat().st_size / 1024),
                         "target_5min_8gib": m["wall_s"] <= 300 and m["peak_rss_tree_mib"] <= 8192})
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
