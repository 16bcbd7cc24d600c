"""Find telemetry files and stream them row group by row group, conformed to telemetry v1.

A data root holds ``telemetry/date=YYYY-MM-DD/host=<host>/*.parquet`` (docs/design.md). Readers never
hold a whole day in memory: each row group is conformed and handed on, then dropped. A file that
Parquet cannot read is skipped with a warning naming it (the rest of the night still counts). A
file that lacks a required column, or holds one that does not cast to the schema's type, is
skipped alike when the caller collects skips (``report``: the nightly counts them in its summary,
see ``validity``); without a report it is a DataError naming file and column (training and the
benchmarks want to know at once).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from wattclass.argtypes import is_iso_date
from wattclass.classifier.validity import SKIP_BAD_TYPE, SKIP_MISSING_COLUMN, SKIP_UNREADABLE, InputReport
from wattclass.errors import DataError
from wattclass.schema import REQUIRED_COLUMNS, TELEMETRY_V1, conform

log = logging.getLogger("wattclass.classifier")

_V1_NAMES = frozenset(TELEMETRY_V1.names)


def telemetry_root(path: Path) -> Path:
    """The folder holding date= partitions: ``path/telemetry`` if it exists, else ``path``."""
    sub = Path(path) / "telemetry"
    return sub if sub.is_dir() else Path(path)


def partition_dates(telemetry_dir: Path) -> list[str]:
    """The days (YYYY-MM-DD, oldest first) of the ``date=`` folders under ``telemetry_dir`` whose
    name is a date; others (``date=2026-11-20.bak``, a copy kept aside) are no day.

    Why: the report took such a folder for the most recent day and died in a traceback on its
    name, and simulate read it beside the real day, with no day to check its windows against;
    the nightly reads only ``date=<its date>``."""
    days = (p.name.removeprefix("date=") for p in Path(telemetry_dir).glob("date=*") if p.is_dir())
    return sorted(d for d in days if is_iso_date(d))


def telemetry_files(paths: Sequence[Path] | Path, date: str | None = None) -> list[Path]:
    """Parquet files under each path (a file, or a data root / partition folder), sorted, each
    file once.

    With ``date`` only the ``date=<date>`` partition of a data root is listed. Each once: paths
    that overlap (a root given twice, a root and one of its partitions or files) listed a file
    twice, and the scan counted every window of it twice (``classify --telemetry R R``: twice
    the energy, no duplicate reported), as the two reads of one path are one file to it.
    """
    if isinstance(paths, str | Path):
        paths = [Path(paths)]
    out: list[Path] = []
    seen: set[str] = set()

    def add(f: Path) -> None:
        key = os.path.normpath(os.path.abspath(f))
        if key not in seen:
            seen.add(key)
            out.append(f)

    for p in map(Path, paths):
        if p.is_file():
            add(p)
            continue
        if not p.exists():
            raise DataError(f"{p}: telemetry path does not exist")
        root = telemetry_root(p)
        if date is not None:
            root = root / f"date={date}"
            if not root.is_dir():
                continue
        for f in sorted(root.rglob("*.parquet")):
            if not f.name.startswith("."):
                add(f)
    return out


def _check_required(path: Path, names: Sequence[str]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise DataError(f"{path}: telemetry is missing required column(s) {', '.join(missing)}")


def iter_tables(
    files: Sequence[Path],
    drop_columns: Sequence[str] = (),
    on_file: Callable[[int, Path], None] | None = None,
    columns: Sequence[str] | None = None,
    report: InputReport | None = None,
) -> Iterator[tuple[Path, pa.Table]]:
    """Yield (file, conformed row group) for every readable row group of every file.

    ``drop_columns`` are treated as absent (the evaluation uses it to remove GPM); ``on_file`` is
    called before each file (progress display). With ``columns`` only those (plus the required
    ones) are read; the others read as null. With ``report`` skipped files are recorded there.
    """
    wanted = None if columns is None else set(columns) | set(REQUIRED_COLUMNS)
    for i, path in enumerate(files):
        if on_file is not None:
            on_file(i, path)
        try:
            pf = pq.ParquetFile(path)
            names = pf.schema_arrow.names
        except (OSError, pa.ArrowException) as exc:
            if report is not None:
                report.skip(path, SKIP_UNREADABLE, str(exc))
            else:
                log.warning("skipping unreadable telemetry file %s: %s", path, exc)
            continue
        try:
            _check_required(path, names)
        except DataError as exc:
            if report is None:
                raise
            report.skip(path, SKIP_MISSING_COLUMN, str(exc))
            continue
        cols = [n for n in names if n in _V1_NAMES and n not in drop_columns
                and (wanted is None or n in wanted)]
        for rg in range(pf.num_row_groups):
            try:
                raw = pf.read_row_group(rg, columns=cols)
            except (OSError, pa.ArrowException) as exc:
                if report is not None:
                    report.skip(path, SKIP_UNREADABLE, f"row group {rg} and after: {exc}")
                else:
                    log.warning("skipping rest of unreadable telemetry file %s (row group %d): %s",
                                path, rg, exc)
                break
            if not raw.num_rows:
                continue
            try:
                conformed = conform(raw, source=path)
            except DataError as exc:  # a column that does not cast: the file is bad, not the night
                if report is None:
                    raise
                report.skip(path, SKIP_BAD_TYPE, str(exc))
                break
            yield path, conformed
