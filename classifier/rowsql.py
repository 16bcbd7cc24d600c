"""The GPM window rule and the input rules (issue 9's reject rules, the ``date=`` day check, and the
nightly's check of a job window against its Slurm record) as DuckDB expressions: the one SQL text of
``rules.window_labels`` (the nightly scan, ``wattclass report`` and ``wattclass simulate`` build
their queries from it; tests/test_classifier_rules.py runs all three against the numpy rule).

Both test the common case first (all seven GPM values present; a forward window with a plausible
energy and power) with a few comparisons on the raw columns, and send only the other rows down
the full chain, whose every branch mirrors the numpy code it stands for (``rules.window_labels``,
``validity.impossible_rows``): on 86 M rows a day the chains cost more than the read.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wattclass.classifier import rules
from wattclass.classifier.validity import (
    ENERGY_SPAN_FLOOR_S,
    JOB_TIME_SLACK_S,
    MAX_GPU_POWER_W,
    MAX_WINDOW_S,
    PARTITION_SLACK_S,
    REJECT_DAY,
    REJECT_ENERGY,
    REJECT_JOB_HOST,
    REJECT_JOB_TIME,
    REJECT_JOB_USER,
    REJECT_LONG,
    REJECT_NULL,
    REJECT_POWER,
    REJECT_TIME,
)


def is_nan_sql(x: str) -> str:
    """SQL true where the double ``x`` is NaN (NULL where it is NULL), as ``isnan`` should be.

    Why not ``isnan``: DuckDB 2.0 folds ``isnan`` of a Parquet column (and of sums of them) to
    false where the file's statistics show only numbers, and Parquet statistics leave NaN out: a
    NaN among numbers was never seen (a NaN energy kept, a NaN rule input not read as missing).
    ``isfinite`` and ``isinf`` are not folded that way."""
    return f"(NOT isfinite({x}) AND NOT isinf({x}))"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _val(col: str, dropped: frozenset[str], column: Callable[[str], str] = _q) -> str:
    """A float column with NaN read as missing (NULL), as ``features.column_f64`` + NaN checks.

    ``column``: how the query names a present column (a quoted name, or a caller's cast)."""
    if col in dropped:
        return "CAST(NULL AS DOUBLE)"
    c = column(col)
    return f"CASE WHEN {is_nan_sql(c)} THEN NULL ELSE CAST({c} AS DOUBLE) END"


def _raw(col: str, dropped: frozenset[str]) -> str:
    """A float column as read (NaN kept), for values numpy reads with NaN as missing anyway."""
    return "CAST(NULL AS DOUBLE)" if col in dropped else f"CAST({_q(col)} AS DOUBLE)"


@dataclass(frozen=True)
class RuleInputs:
    """What the window rule reads, as SQL: ``sm``, ``dram`` and ``comp`` (the busiest measured
    compute pipe) are DOUBLE with NaN read as missing (NULL); ``gap`` is true where a compute pipe
    was not measured. Either expressions (``rule_inputs_sql``) or the names a subquery gave them,
    so a query that also aggregates ``comp`` computes it once per window."""

    sm: str
    dram: str
    comp: str
    gap: str


def rule_inputs_sql(dropped: frozenset[str] = frozenset(), column: Callable[[str], str] = _q) -> RuleInputs:
    """The rule's inputs from the GPM columns (``dropped``: columns the data lacks, read as NULL)."""
    sm, dram = _val("sm_util_pct", dropped, column), _val("dram_bw_util_pct", dropped, column)
    pipes = [_val(u, dropped, column) for u in rules.COMPUTE_UNITS]
    return RuleInputs(sm=sm, dram=dram, comp="greatest(" + ", ".join(pipes) + ")",  # NULLs skipped
                      gap=" OR ".join(f"({p}) IS NULL" for p in pipes))


def rule_chain_sql(x: RuleInputs) -> str:
    """``rules.window_labels`` branch by branch on ``x``: NO_GPM without sm, DRAM or any pipe; IDLE
    under SM_ACTIVE_PCT; COMPUTE where the busiest pipe is at least as busy as DRAM; PIPE_GAP where
    memory would need a pipe that was not measured; else MEMORY."""
    return (f"CASE WHEN ({x.sm}) IS NULL OR ({x.dram}) IS NULL OR ({x.comp}) IS NULL THEN {rules.NO_GPM} "
            f"WHEN ({x.sm}) < {rules.SM_ACTIVE_PCT} THEN {rules.IDLE} "
            f"WHEN ({x.comp}) >= ({x.dram}) THEN {rules.COMPUTE} "
            f"WHEN {x.gap} THEN {rules.PIPE_GAP} ELSE {rules.MEMORY} END")


def rule_code_sql(dropped: frozenset[str] = frozenset(), column: Callable[[str], str] = _q) -> str:
    """``rules.window_labels`` as a SQL expression (NO_GPM = -1, PIPE_GAP = -2: a memory verdict
    needs every compute pipe measured); ``column`` as in ``_val``.

    Most windows have all seven GPM values: their sum is then a number (NULL if one is NULL, NaN if
    one is NaN, or if infinities of both signs meet), and the three-way test on the raw columns
    decides. The others take the full
    chain, where NaN reads as missing."""
    full = rule_chain_sql(rule_inputs_sql(dropped, column))
    if any(c in dropped for c in rules.RULE_COLUMNS):
        return f"({full})"
    raw = {c: column(c) for c in rules.RULE_COLUMNS}
    total = " + ".join(f"CAST({c} AS DOUBLE)" for c in raw.values())
    # all seven present and none NaN: the sum not NaN (NULL if one is NULL, NaN if one is NaN);
    # not "sum <= infinity" nor isnan, which DuckDB decides from the Parquet statistics (is_nan_sql)
    present = f"(NOT {is_nan_sql(total)})"
    quick = (f"CASE WHEN {raw['sm_util_pct']} < {rules.SM_ACTIVE_PCT} THEN {rules.IDLE} "
             f"WHEN greatest({', '.join(raw[u] for u in rules.COMPUTE_UNITS)}) >= {raw['dram_bw_util_pct']} "
             f"THEN {rules.COMPUTE} ELSE {rules.MEMORY} END")
    return f"(CASE WHEN {present} THEN {quick} ELSE {full} END)"


_DAY_MS = 86_400_000
_PARTITION = re.compile(r"date=(\d{4}-\d{2}-\d{2})$")
#: Above this many runs of one date in a file list, the day is parsed from the file's name: a
#: CASE's cost grows with its branches, the parse's does not.
_MAX_DAY_RUNS = 4


def partition_day_ms(path: Path | str) -> int | None:
    """The UTC midnight (epoch ms) of the ``date=YYYY-MM-DD`` folder ``path`` sits in, else None."""
    if isinstance(path, Path):
        # The telemetry layout (.../date=D/host=H/<file>): the folder two up is read from the
        # path's text, as a Path's text has no empty or "." parts; parsing 3,000 paths into
        # parts cost a 1,000-GPU night 0.02 s (issue 15). Anything else is parsed below.
        bits = str(path).rsplit("/", 3)
        m = _PARTITION.match(bits[1]) if len(bits) == 4 and all(bits[1:]) else None
        if m and not _PARTITION.match(bits[2]):
            return _day_ms(m.group(1))
    for part in reversed(Path(path).parts[:-1]):
        m = _PARTITION.match(part)
        if m:
            return _day_ms(m.group(1))
    return None


@functools.lru_cache(maxsize=64)
def _day_ms(text: str) -> int | None:
    """The UTC midnight (epoch ms) of the date ``text`` (YYYY-MM-DD), None if it is no date."""
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        return None
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()) * 1000


def partition_day_sql(files: Sequence[Path | str], offset: int = 0) -> str | None:
    """Per row, the day of its file's ``date=`` partition (epoch ms; NULL: not in one), from
    DuckDB's ``file_index`` (``offset``: where ``files`` start in it); None when no file is in one.

    A constant where the files share a day (a night: one comparison per row, nothing more); else a
    CASE over the runs of one day (files are listed day by day); past _MAX_DAY_RUNS runs, the day
    parsed from the row's ``filename`` (``FILENAME_DAY_SQL``). Both cost no CPU that three days of
    1,000 GPUs (26 M rows, CPU2) could show; a per-file list of days looked up by ``file_index``
    cost about 45% more."""
    days = [partition_day_ms(f) for f in files]
    known = {d for d in days if d is not None}
    if not known:
        return None
    if len(known) == 1 and None not in days:
        return str(known.pop())
    runs: list[tuple[int, int | None]] = []  # (end index, day)
    for i, d in enumerate(days):
        if runs and runs[-1][1] == d:
            runs[-1] = (i + 1, d)
        else:
            runs.append((i + 1, d))
    if len(runs) <= _MAX_DAY_RUNS:
        return ("CASE " + " ".join(f"WHEN file_index < {end + offset} THEN {'NULL' if d is None else d}"
                                   for end, d in runs) + " END")
    return FILENAME_DAY_SQL


#: The day of a row's ``date=`` partition from its file's name (the virtual ``filename`` column):
#: the innermost date= folder, as ``partition_day_ms`` reads it (``^.*`` is greedy), not a dated
#: folder above the data root.
FILENAME_DAY_SQL = ("epoch_ms(TRY_CAST(regexp_extract(filename, '^.*/date=([0-9]{4}-[0-9]{2}-[0-9]{2})/', 1) "
                    "AS DATE))")


def _in_day_sql(day: str) -> str:
    """Whether ``ts_start`` lies within ``day``'s UTC day, +- PARTITION_SLACK_S (NULL: no day)."""
    slack = PARTITION_SLACK_S * 1000
    return f"(epoch_ms(ts_start) - ({day}) BETWEEN {-slack} AND {_DAY_MS + slack - 1})"


#: ``_reject_sql``'s code for a window longer than MAX_WINDOW_S (tested after code 2; numbered
#: after the job codes, which scan.py takes as the range JOB_HOST..JOB_USER).
LONG = 9


def _reject_sql(absent: frozenset[str], day: str | None = None) -> str:
    """``validity.impossible_rows`` as a SQL code: 0 valid, else 1 + the first broken rule.

    Nearly every row is valid, so a cheap test of the common case comes first and only the rows
    it does not pass get the full rule chain (NULL, NaN and infinity fail the cheap test: a
    comparison with NULL is NULL, and DuckDB orders NaN above every number).

    ``absent``: columns the data lacks, read as NULL; ``gpu_uuid`` among them (a report over a
    DataFrame of windows without it) is not tested rather than failing every row. ``day``: the
    row's partition day (``partition_day_sql``; NULL or None: not tested), code 5 outside it.
    A window longer than MAX_WINDOW_S gets code LONG (tested right after code 2)."""
    def f(c: str) -> str:
        return "CAST(NULL AS DOUBLE)" if c in absent else f"CAST({_q(c)} AS DOUBLE)"

    dur = "((epoch_ms(ts_end) - epoch_ms(ts_start)) / 1000.0)"
    e = f("energy_j")
    bad_e = f"({e} IS NOT NULL AND (NOT isfinite({e}) OR {e} < 0))"  # NaN or an infinity

    def over(x: str) -> str:  # NaN and NULL count as 0 (np.nan_to_num), +inf as too much
        return f"coalesce(CASE WHEN {is_nan_sql(x)} THEN 0 ELSE {x} END, 0) > {MAX_GPU_POWER_W!r}"

    too_long = f"epoch_ms(ts_end) - epoch_ms(ts_start) > {MAX_WINDOW_S * 1000}"
    span = f"greatest({dur}, {ENERGY_SPAN_FLOOR_S!r})"  # a row's energy may reach past its end
    mean_w = f"CASE WHEN {bad_e} THEN NULL ELSE {e} / {span} END"
    uuid_null = "FALSE" if "gpu_uuid" in absent else "gpu_uuid IS NULL"
    in_day = "TRUE" if day is None else f"coalesce({_in_day_sql(day)}, TRUE)"
    full = (f"CASE WHEN ts_start IS NULL OR ts_end IS NULL OR {uuid_null} THEN 1 "
            f"WHEN epoch_ms(ts_end) <= epoch_ms(ts_start) THEN 2 WHEN {too_long} THEN {LONG} "
            f"WHEN {bad_e} THEN 3 "
            f"WHEN {over(f('power_avg_w'))} OR {over(f('power_max_w'))} OR {over(mean_w)} THEN 4 "
            f"WHEN NOT {in_day} THEN 5 ELSE 0 END")
    # Valid for sure: no NULL key, a forward window, a finite energy >= 0 whose mean power and both
    # power columns are at most MAX_GPU_POWER_W (a missing power column: only the mean counts),
    # within its partition's day.
    powers = [f"{f(c)} <= {MAX_GPU_POWER_W!r}" for c in ("power_avg_w", "power_max_w") if c not in absent]
    key = "TRUE" if "gpu_uuid" in absent else "gpu_uuid IS NOT NULL"
    # isfinite: DuckDB may decide "e >= 0" and "e / span <= max" from the Parquet statistics, which
    # leave NaN out, so a NaN energy passed the cheap test (is_nan_sql)
    ok = " AND ".join([key, "epoch_ms(ts_end) > epoch_ms(ts_start)", f"NOT ({too_long})", f"isfinite({e})",
                       f"{e} >= 0",
                       f"{e} / {span} <= {MAX_GPU_POWER_W!r}", *powers, *([] if day is None else [in_day])])
    return f"CASE WHEN {ok} THEN 0 ELSE {full} END"


#: ``dedup_code_sql``'s code for a copy of a window kept from another file (not a reject reason).
DUPLICATE = -1


def files_meet(by_file: Any) -> bool:
    """Whether two files of one host have window-start ranges that meet (``by_file``, a DataFrame
    of one row per host and file: host, start, last_start, its first and last window start):
    only then may they hold the same windows (a file copied under another name, an import over
    the daemon's span), and the exact de-duplication (``dedup_code_sql``, a window over every
    row) is needed; a day's successive files of a host do not meet. ``wattclass report`` and
    ``simulate`` take the ranges from their main scan (a grouping set), as the nightly's pass
    does (``scan._meeting_hosts``)."""
    f = by_file.sort_values(["host", "start"], kind="stable")
    prev_last = f.groupby("host", dropna=False)["last_start"].transform(lambda s: s.cummax().shift())
    return bool((f["start"] <= prev_last).any())


def dedup_code_sql(bad: str, file: str) -> str:
    """A row's code ``bad`` (``_reject_sql``'s), with every copy of a valid window but one marked
    DUPLICATE: per (gpu_uuid, job_id, ts_start), the copy of the first file by name (``file``),
    then the first in that file (``file_row_number``), is kept, as the nightly keeps it
    (``scan._dedup_sql``); a rejected row never shadows a valid one."""
    w = f"PARTITION BY gpu_uuid, job_id, ts_start, ({bad}) = 0 ORDER BY {file}, file_row_number"
    return f"CASE WHEN ({bad}) <> 0 THEN ({bad}) WHEN row_number() OVER ({w}) = 1 THEN 0 ELSE {DUPLICATE} END"


#: The codes of ``job_check_sql`` (after ``_reject_sql``'s 1..5).
JOB_HOST, JOB_TIME, JOB_USER = 6, 7, 8


def job_check_sql(record: str, user: str) -> str:
    """Per row joined to its job's Slurm record (alias ``record``: hosts VARCHAR[], t0_ms, t1_ms
    BIGINT, "user"), 0 or the code of the first contradiction: the row's host is not among the
    job's (JOB_HOST), the window reaches more than JOB_TIME_SLACK_S before the job's start or
    after its end (JOB_TIME; a running job has no end yet), its ``user`` (the daemon's, from the
    Prolog's job file or the process's checked environment; ``user``: that column's SQL, NULL
    where the data has none) is not the record's (JOB_USER). A NULL on either side is not tested;
    a row without a record (``record``.t0_ms and all NULL) gets 0."""
    r, slack = record, JOB_TIME_SLACK_S * 1000
    ru = f'{r}."user"'
    user_bad = f"({user} IS NOT NULL AND {ru} IS NOT NULL AND {user} <> {ru})"
    return (f"CASE WHEN {r}.hosts IS NOT NULL AND NOT list_contains({r}.hosts, host) THEN {JOB_HOST} "
            f"WHEN epoch_ms(ts_start) < {r}.t0_ms - {slack} OR epoch_ms(ts_end) > {r}.t1_ms + {slack} "
            f"THEN {JOB_TIME} WHEN {user_bad} THEN {JOB_USER} ELSE 0 END")


def job_group_check_sql(record: str, group: str) -> tuple[str, str]:
    """``job_check_sql`` per group of rows of one job, host, file and reject code (alias ``group``:
    host, bad, ts_start_ms = epoch_ms of the smallest ts_start, ts_end_ms of the largest ts_end,
    "user" and user_max = the smallest and largest non-NULL user), joined to the job's record
    (alias ``record``; NULL where it has none): (the group's reject code, whether it must be
    checked row by row).

    Why it can decide a group: the host is the group's own, so a foreign host rejects every row
    (JOB_HOST, first in ``job_check_sql``'s order, whatever the times and users); where the
    group's time range lies within the job's (+- slack) and its users are all the record's (or
    NULL), no row is rejected. Any other group of valid rows (a range reaching past the job, a
    user not the record's) may hold rows of both kinds: only the rows tell, so it is flagged for
    the exact pass. Every comparison is ``job_check_sql``'s, on the group's extremes; the
    extremes bound every row's value, and a NULL record field tests nothing in both."""
    g, r, slack = group, record, JOB_TIME_SLACK_S * 1000
    ru = f'{r}."user"'
    host_bad = f"coalesce({r}.hosts IS NOT NULL AND NOT list_contains({r}.hosts, {g}.host), FALSE)"
    time_over = f"{g}.ts_start_ms < {r}.t0_ms - {slack} OR {g}.ts_end_ms > {r}.t1_ms + {slack}"
    user_over = f'{ru} IS NOT NULL AND ({g}."user" <> {ru} OR {g}.user_max <> {ru})'
    checked = f"{g}.bad = 0 AND {r}.job_id IS NOT NULL"
    code = f"CASE WHEN {checked} AND {host_bad} THEN {JOB_HOST} ELSE {g}.bad END"
    recheck = f"({checked} AND NOT {host_bad} AND coalesce(({time_over}) OR ({user_over}), FALSE))"
    return code, recheck


#: ``_reject_sql``'s codes 1..5 and 9 and ``job_check_sql``'s 6..8 as ``validity`` names them (the nightly
#: summary's ``rejected_rows`` keys), so ``wattclass report`` and ``simulate`` count left-out rows
#: the same way.
REJECT_REASONS: tuple[str, ...] = (REJECT_NULL, REJECT_TIME, REJECT_ENERGY, REJECT_POWER, REJECT_DAY,
                                   REJECT_JOB_HOST, REJECT_JOB_TIME, REJECT_JOB_USER, REJECT_LONG)


def reject_counts(by_code: dict[int, int]) -> dict[str, int]:
    """Rows per ``_reject_sql`` code (0 = valid, left out) as rows per validity reason, zeros dropped."""
    return {reason: int(by_code[k]) for k, reason in enumerate(REJECT_REASONS, start=1) if by_code.get(k)}
