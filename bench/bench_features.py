"""Benchmark: per-job feature building (window features + mergeable partial aggregates), one core.

Input: the real H200 windows tiled in memory to N windows (GENERATED: new job ids every ~360
windows, 8 GPUs per host). Measures ``window_features`` + the GPM window rule + ``batch_partials``
per batch and a final ``merge_partials`` + ``finalize``, single-threaded (Arrow CPU pool = 1).
Target: >= 1,000,000 windows per second per core.

    python bench/bench_features.py [--windows 2000000] [--batch 2880 65536]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent


def tiled(n: int) -> pa.Table:
    from wattclass.schema import conform

    real = conform(pq.read_table(REPO / "wattclass/data/h200/telemetry.parquet"))
    idx = np.arange(n) % real.num_rows
    t = real.take(pa.array(idx))
    job = (np.arange(n) // 360).astype(str)
    host = (np.arange(n) // 2880 % 125).astype(str)
    t = t.set_column(t.schema.get_field_index("job_id"), "job_id", pa.array(job, pa.string()))
    return t.set_column(t.schema.get_field_index("host"), "host", pa.array(host, pa.string()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, nargs="+", default=[2880, 65536])
    a = ap.parse_args()
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    from wattclass.classifier import features as F
    from wattclass.classifier.training import window_rule_codes

    t = tiled(a.windows)
    for batch in a.batch:
        batches = [t.slice(i, batch) for i in range(0, t.num_rows, batch)]
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            parts = []
            for b in batches:
                feats = F.window_features(b)
                codes = window_rule_codes(b)
                counts = {"n_idle": codes == 0, "n_compute": codes == 1, "n_memory": codes == 2}
                parts.append(F.batch_partials(b, feats, counts))
            merged = F.merge_partials(parts)
            assert merged is not None
            jobs = F.finalize(merged)
            best = min(best, time.process_time() - t0)
        print(f"batch {batch:>6} rows: {t.num_rows:,} windows -> {len(jobs):,} jobs in {best:.2f} s CPU "
              f"= {t.num_rows / best / 1e6:.2f} M windows/s per core (target >= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
