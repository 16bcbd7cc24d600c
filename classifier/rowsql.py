"""The nightly scan's per-row SQL: the GPM window rule and issue 9's reject rules as DuckDB
expressions (``scan`` builds its queries from them).

Both test the common case first (all seven GPM values present; a forward window with a plausible
energy and power) with a few comparisons on the raw columns, and send only the other rows down
the full chain, whose every branch mirrors the numpy code it stands for (``rules.window_labels``,
``validity.impossible_rows``): on 86 M rows a day the chains cost more than the read.
"""

from __future__ import annotations

from wattclass.classifier import rules
from wattclass.classifier.validity import MAX_GPU_POWER_W


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _val(col: str, dropped: frozenset[str]) -> str:
    """A float column with NaN read as missing (NULL), as ``features.column_f64`` + NaN checks."""
    if col in dropped:
        return "CAST(NULL AS DOUBLE)"
    c = _q(col)
    return f"CASE WHEN isnan({c}) THEN NULL ELSE CAST({c} AS DOUBLE) END"


def _raw(col: str, dropped: frozenset[str]) -> str:
    """A float column as read (NaN kept), for values numpy reads with NaN as missing anyway."""
    return "CAST(NULL AS DOUBLE)" if col in dropped else f"CAST({_q(col)} AS DOUBLE)"


def rule_code_sql(dropped: frozenset[str] = frozenset()) -> str:
    """``rules.window_labels`` as a SQL expression (NO_GPM = -1, PIPE_GAP = -2: a memory verdict
    needs every compute pipe measured).

    Most windows have all seven GPM values: their sum is then a number (NULL if one is NULL, NaN if
    one is NaN, or if infinities of both signs meet), and the three-way test on the raw columns
    decides. The others take the full
    chain, where NaN reads as missing."""
    sm, dram = _val("sm_util_pct", dropped), _val("dram_bw_util_pct", dropped)
    pipes = [_val(u, dropped) for u in rules.COMPUTE_UNITS]
    comp = "greatest(" + ", ".join(pipes) + ")"  # NULLs skipped
    gap = " OR ".join(f"({p}) IS NULL" for p in pipes)
    full = (f"CASE WHEN ({sm}) IS NULL OR ({dram}) IS NULL OR ({comp}) IS NULL THEN {rules.NO_GPM} "
            f"WHEN ({sm}) < {rules.SM_ACTIVE_PCT} THEN {rules.IDLE} "
            f"WHEN ({comp}) >= ({dram}) THEN {rules.COMPUTE} "
            f"WHEN {gap} THEN {rules.PIPE_GAP} ELSE {rules.MEMORY} END")
    gpm = ("sm_util_pct", "dram_bw_util_pct", *rules.COMPUTE_UNITS)
    if any(c in dropped for c in gpm):
        return f"({full})"
    raw = {c: _q(c) for c in gpm}
    total = " + ".join(f"CAST({c} AS DOUBLE)" for c in raw.values())
    # all seven present and none NaN: NOT isnan() of the sum (NULL if one is NULL, NaN if one is NaN);
    # not "sum <= infinity", which DuckDB may decide from the Parquet statistics, which leave NaN out
    present = f"(NOT isnan({total}))"
    quick = (f"CASE WHEN {raw['sm_util_pct']} < {rules.SM_ACTIVE_PCT} THEN {rules.IDLE} "
             f"WHEN greatest({', '.join(raw[u] for u in rules.COMPUTE_UNITS)}) >= {raw['dram_bw_util_pct']} "
             f"THEN {rules.COMPUTE} ELSE {rules.MEMORY} END")
    return f"(CASE WHEN {present} THEN {quick} ELSE {full} END)"


def _reject_sql(absent: frozenset[str]) -> str:
    """``validity.impossible_rows`` as a SQL code: 0 valid, else 1 + the first broken rule.

    Nearly every row is valid, so a cheap test of the common case comes first and only the rows
    it does not pass get the full rule chain (NULL, NaN and infinity fail the cheap test: a
    comparison with NULL is NULL, and DuckDB orders NaN above every number)."""
    def f(c: str) -> str:
        return "CAST(NULL AS DOUBLE)" if c in absent else f"CAST({_q(c)} AS DOUBLE)"

    dur = "((epoch_ms(ts_end) - epoch_ms(ts_start)) / 1000.0)"
    e = f("energy_j")
    bad_e = f"({e} IS NOT NULL AND (isnan({e}) OR isinf({e}) OR {e} < 0))"

    def over(x: str) -> str:  # NaN and NULL count as 0 (np.nan_to_num), +inf as too much
        return f"coalesce(CASE WHEN isnan({x}) THEN 0 ELSE {x} END, 0) > {MAX_GPU_POWER_W!r}"

    mean_w = f"CASE WHEN {bad_e} THEN NULL ELSE {e} / {dur} END"
    full = ("CASE WHEN ts_start IS NULL OR ts_end IS NULL OR gpu_uuid IS NULL THEN 1 "
            f"WHEN epoch_ms(ts_end) <= epoch_ms(ts_start) THEN 2 WHEN {bad_e} THEN 3 "
            f"WHEN {over(f('power_avg_w'))} OR {over(f('power_max_w'))} OR {over(mean_w)} THEN 4 ELSE 0 END")
    # Valid for sure: no NULL key, a forward window, a finite energy >= 0 whose mean power and both
    # power columns are at most MAX_GPU_POWER_W (a missing power column: only the mean counts).
    powers = [f"{f(c)} <= {MAX_GPU_POWER_W!r}" for c in ("power_avg_w", "power_max_w") if c not in absent]
    ok = " AND ".join(["gpu_uuid IS NOT NULL", "epoch_ms(ts_end) > epoch_ms(ts_start)", f"{e} >= 0",
                       f"{e} / {dur} <= {MAX_GPU_POWER_W!r}", *powers])
    return f"CASE WHEN {ok} THEN 0 ELSE {full} END"
