"""Output files in the raw probe format the replay backend reads; atomic writes."""

from __future__ import annotations

import csv
import io
import os
from typing import Any

from h200_collect.config import FLOAT_COLS, INT_COLS, RUN_FIELDS


def samples_table(rows: list[dict[str, Any]]) -> Any:
    """Rows -> Arrow table with the raw-sample schema of wattclass/data/h200/raw (sorted columns)."""
    import pyarrow as pa

    types = {**{c: pa.int64() for c in INT_COLS}, **{c: pa.float64() for c in FLOAT_COLS},
             "job": pa.large_string()}
    schema = pa.schema([(k, types[k]) for k in sorted(types)])
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)


def _atomic_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_samples(path: str, rows: list[dict[str, Any]]) -> None:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(samples_table(rows), buf)
    _atomic_bytes(path, buf.getvalue())


def write_runs(path: str, runs: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=RUN_FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(runs)
    _atomic_bytes(path, buf.getvalue().encode())

