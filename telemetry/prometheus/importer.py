"""``wattclass telemetry import``: fetch, merge per GPU, build windows, write Parquet.

Output: ``<data_root>/telemetry/date=D/host=H/prom-<start>-<end>.parquet``, the layout the daemon
writes, one file per day and host, written atomically. The file name carries the import's bounds,
so importing the same span again replaces its files instead of adding to them.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from wattclass.errors import ConfigError, DataError
from wattclass.telemetry.prometheus import mapping
from wattclass.telemetry.prometheus.client import DEFAULT_CHUNK_S, PrometheusClient
from wattclass.telemetry.prometheus.windows import gpu_rows, merge, missing_fields
from wattclass.telemetry.sink import rows_to_table, write_parquet_atomic
from wattclass.telemetry.windows import Row

log = logging.getLogger(__name__)

#: Scrapes before ``start`` fetched to find the baseline scrape (see windows.py).
BASELINE_MARGIN_S = 120.0


def parse_time(text: str, what: str) -> float:
    """Epoch seconds from ISO 8601 (UTC unless an offset is given) or a plain number."""
    try:
        epoch_s = float(text)
    except ValueError:
        pass
    else:  # "nan" was a ValueError traceback at the first query, "inf" a range that never ends
        if not math.isfinite(epoch_s):
            raise ConfigError(f"{what} {text!r}: expected ISO 8601 (2026-11-29T00:00Z) or epoch seconds")
        return epoch_s
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(f"{what} {text!r}: expected ISO 8601 (2026-11-29T00:00Z) or epoch seconds") from exc
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


@dataclass
class ImportResult:
    files: list[Path] = field(default_factory=list)
    rows: int = 0
    gpus: int = 0
    jobs: set[str] = field(default_factory=set)
    energy_j: float = 0.0
    missing: dict[str, list[str]] = field(default_factory=dict)  # "host/uuid" -> fields not exported
    mig: dict[str, int] = field(default_factory=dict)  # "host/uuid" -> MIG instance series left out


def import_range(
    url: str,
    start: float,
    end: float,
    data_root: Path,
    job_label: str = mapping.DEFAULT_JOB_LABEL,
    user_label: str | None = None,
    period_s: float = 10.0,
    chunk_s: float = DEFAULT_CHUNK_S,
) -> ImportResult:
    """Import the DCGM series of [start, end] from the Prometheus at ``url`` into ``data_root``."""
    if end <= start:
        raise ConfigError(f"--end must be after --start ({end} <= {start})")
    if not (period_s > 0 and math.isfinite(period_s)):  # NaN too; inf: one window for all time
        raise ConfigError(f"--period must be positive and finite, not {period_s}")
    # 0 asked Prometheus for the same empty span forever; a negative chunk walked back; inf: no chunks
    if not (chunk_s > 0 and math.isfinite(chunk_s)):
        raise ConfigError(f"--chunk must be positive and finite seconds, not {chunk_s}")
    client = PrometheusClient(url)
    gpus = merge(client.raw_chunks(mapping.SELECTOR, start - BASELINE_MARGIN_S, end, chunk_s),
                 job_label, user_label)
    if not gpus:
        raise DataError(f"Prometheus at {url}: no DCGM series with a {mapping.UUID_LABEL} label between "
                        f"{_iso(start)} and {_iso(end)} (is dcgm-exporter scraped, and are the times right?)")
    res = ImportResult(gpus=len(gpus))
    groups: dict[tuple[str, str], list[Row]] = {}
    for key, tl in sorted(gpus.items()):
        if tl.mig_series:
            res.mig[f"{key.host}/{key.uuid}"] = tl.mig_series
            log.warning("%s GPU %s: %d series of MIG instances (%s) left out: the import cannot split a "
                        "MIG GPU's readings per instance, so its instances' jobs get no windows from it",
                        key.host, key.uuid, tl.mig_series, mapping.MIG_INSTANCE_LABEL)
        miss = missing_fields(tl) if tl.fields else []  # MIG series only: said above
        if miss:
            res.missing[f"{key.host}/{key.uuid}"] = miss
            log.warning("%s GPU %s: not exported: %s%s", key.host, key.uuid, ", ".join(miss),
                        _consequence(miss))
        for r in gpu_rows(tl, start, period_s):
            if r["ts_end"] <= start:
                continue
            day = dt.datetime.fromtimestamp(float(r["ts_start"]), tz=dt.UTC).strftime("%Y-%m-%d")
            groups.setdefault((day, key.host), []).append(r)
    root = Path(data_root) / "telemetry"
    for (day, host), rows in sorted(groups.items()):
        rows.sort(key=lambda r: (r["gpu_index"], r["gpu_uuid"], r["ts_start"]))
        path = root / f"date={day}" / f"host={host}" / f"prom-{int(start)}-{int(end)}.parquet"
        write_parquet_atomic(rows_to_table(rows), path)
        res.files.append(path)
        res.rows += len(rows)
        res.energy_j += sum(float(r["energy_j"] or 0.0) for r in rows)
        res.jobs.update(str(r["job_id"]) for r in rows if r.get("job_id"))
    return res


def _consequence(missing: list[str]) -> str:
    """What the fields a GPU did not export cost, for the import's warning."""
    if mapping.ENERGY in missing:
        return "; energy unknown (null)"
    out = ""
    if set(missing) & set(mapping.RULE_FIELDS):
        out += "; the GPM rule withholds memory-bound verdicts, the model labels these jobs"
    if set(missing) & {group[0] for group in mapping.MODEL_FIELDS}:
        out += "; the model's power or clock fractions are unknown (weaker labels where it decides)"
    return out


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
