"""The GPM window rule and issue 9's reject rules as DuckDB expressions: the one SQL text of
``rules.window_labels`` (the nightly scan, ``wattclass report`` and ``wattclass simulate`` build
their queries from it; tests/test_classifier_rules.py runs all three against the numpy rule).

Both test the common case first (all seven GPM values present; a forward window with a plausible
energy and power) with a few comparisons on the raw columns, and send only the other rows down
the full chain, whose every branch mirrors the numpy code it stands for (``rules.window_labels``,
``validity.impossible_rows``): on 86 M rows a day the chains cost more than the read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from wattclass.classifier import rules
from wattclass.classifier.validity import (
    MAX_GPU_POWER_W,
    REJECT_ENERGY,
    REJECT_NULL,
    REJECT_POWER,
    REJECT_TIME,
)


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
    return f"CASE WHEN isnan({c}) THEN NULL ELSE CAST({c} AS DOUBLE) END"


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
    comparison with NULL is NULL, and DuckDB orders NaN above every number).

    ``absent``: columns the data lacks, read as NULL; ``gpu_uuid`` among them (a report over a
    DataFrame of windows without it) is not tested rather than failing every row."""
    def f(c: str) -> str:
        return "CAST(NULL AS DOUBLE)" if c in absent else f"CAST({_q(c)} AS DOUBLE)"

    dur = "((epoch_ms(ts_end) - epoch_ms(ts_start)) / 1000.0)"
    e = f("energy_j")
    bad_e = f"({e} IS NOT NULL AND (isnan({e}) OR isinf({e}) OR {e} < 0))"

    def over(x: str) -> str:  # NaN and NULL count as 0 (np.nan_to_num), +inf as too much
        return f"coalesce(CASE WHEN isnan({x}) THEN 0 ELSE {x} END, 0) > {MAX_GPU_POWER_W!r}"

    mean_w = f"CASE WHEN {bad_e} THEN NULL ELSE {e} / {dur} END"
    uuid_null = "FALSE" if "gpu_uuid" in absent else "gpu_uuid IS NULL"
    full = (f"CASE WHEN ts_start IS NULL OR ts_end IS NULL OR {uuid_null} THEN 1 "
            f"WHEN epoch_ms(ts_end) <= epoch_ms(ts_start) THEN 2 WHEN {bad_e} THEN 3 "
            f"WHEN {over(f('power_avg_w'))} OR {over(f('power_max_w'))} OR {over(mean_w)} THEN 4 ELSE 0 END")
    # Valid for sure: no NULL key, a forward window, a finite energy >= 0 whose mean power and both
    # power columns are at most MAX_GPU_POWER_W (a missing power column: only the mean counts).
    powers = [f"{f(c)} <= {MAX_GPU_POWER_W!r}" for c in ("power_avg_w", "power_max_w") if c not in absent]
    key = "TRUE" if "gpu_uuid" in absent else "gpu_uuid IS NOT NULL"
    ok = " AND ".join([key, "epoch_ms(ts_end) > epoch_ms(ts_start)", f"{e} >= 0",
                       f"{e} / {dur} <= {MAX_GPU_POWER_W!r}", *powers])
    return f"CASE WHEN {ok} THEN 0 ELSE {full} END"


#: ``_reject_sql``'s codes 1, 2, 3, 4 as ``validity`` names them (the nightly summary's
#: ``rejected_rows`` keys), so ``wattclass report`` and ``simulate`` count left-out rows the same way.
REJECT_REASONS: tuple[str, ...] = (REJECT_NULL, REJECT_TIME, REJECT_ENERGY, REJECT_POWER)


def reject_counts(by_code: dict[int, int]) -> dict[str, int]:
    """Rows per ``_reject_sql`` code (0 = valid, left out) as rows per validity reason, zeros dropped."""
    return {reason: int(by_code[k]) for k, reason in enumerate(REJECT_REASONS, start=1) if by_code.get(k)}
