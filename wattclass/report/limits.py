"""The power limit a window's "N%" cap is a share of, in SQL and pandas alike.

Why: the report's savings estimate takes a cap of the window's ``power_limit_w``; a row without
one (an import from a dcgm-exporter without the limit field, an NVML read that failed) was given
an H200's 700 W, so "60%" meant 420 W on every board: on a B200 (1,000 W default, the Prolog sets
600 W) the report counted savings the cap would never make, on an A100 or L40S none at all. Such
a row now takes its board's default limit by model name (``savings.response.DEFAULT_LIMIT_W``,
keyed by ``caps.board_key``, whose SQL twin is ``board_key_sql``), and where the board is unknown
too, no cap: its energy counts as not saved, never as an H200's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wattclass.caps import KNOWN_LIMITS_W, OTHER_BOARD_TOKENS, board_key, known_range_w
from wattclass.savings.response import DEFAULT_LIMIT_W

#: The characters Python's ``str.strip()`` and ``re``'s ``\\s`` take as white space
#: (``str.isspace``), which ``caps.board_key`` strips and splits a name at. RE2's ``\\s`` and
#: DuckDB's one-argument trim take only ASCII ones (not even a vertical tab), so the SQL names them.
WHITESPACE = "".join(chr(c) for c in (0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0,
                                      0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F,
                                      0x3000))


def board_key_sql(model: str) -> str:
    """``caps.board_key`` as a DuckDB expression over the SQL expression ``model`` (NULL for NULL).

    Two regular expressions over the cleaned name, not a split into a list: this runs on every
    row whose limit is missing, and a list per row cost 4 s per million rows. White space is
    ``WHITESPACE``, Python's: with RE2's ASCII ``\\s`` a name with a no-break space ("NVIDIA\\u00a0A100")
    was no board to the SQL and an A100 to the pandas reference and the Prolog."""
    chars = " || ".join(f"chr({ord(c)})" for c in WHITESPACE)
    name = f"trim(replace(replace(upper({model}), 'NVIDIA', ''), 'TESLA', ''), {chars})"
    sep = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "_-]"
    others = "|".join(sorted(OTHER_BOARD_TOKENS))
    return (f"CASE WHEN regexp_matches({name}, '{sep}+({others})({sep}|$)') THEN '' "
            f"ELSE regexp_extract({name}, '^[^{sep[1:]}*') END")


def limit_sql(limit: str, model: str) -> str:
    """The window's limit (SQL expression ``limit``), else its board's default by the SQL
    expression ``model``; NULL where neither is known. The board is read only where the limit is
    missing (a CASE, not coalesce, which DuckDB evaluates for every row). A limit that is no
    finite number (NaN or infinite, in a file another writer made) is missing, as in
    ``limit_series``: DuckDB orders NaN above every number, so as a limit it made a cap that never
    bites. ``isfinite``, not ``NOT isnan``: DuckDB 2.0 folds ``isnan`` of a Parquet column to
    false from the file's statistics, which leave NaN out."""
    whens = " ".join(f"WHEN '{k}' THEN {w!r}" for k, w in sorted(DEFAULT_LIMIT_W.items()))
    return (f"CASE WHEN isfinite({limit}) THEN {limit} "  # NULL: not true either, the board's
            f"ELSE (CASE {board_key_sql(model)} {whens} END) END")


def limit_series(w: pd.DataFrame) -> pd.Series:
    """``limit_sql`` per row of a window table (NaN where neither is known)."""
    limit = (w["power_limit_w"].astype(float) if "power_limit_w" in w
             else pd.Series(np.nan, index=w.index, dtype=float))
    limit = limit.where(np.isfinite(limit))  # an infinite limit is no limit either (limit_sql)
    if "gpu_model" not in w:
        return limit
    by_model = w["gpu_model"].map(lambda m: DEFAULT_LIMIT_W.get(board_key(m)) if isinstance(m, str) else None)
    return limit.fillna(by_model.astype(float))


#: The highest NVML minimum limit of the boards ``caps.KNOWN_LIMITS_W`` knows: a cap at or above
#: it needs no clamp, so the board is read only for lower caps.
_MIN_FLOOR_W = max(lo for _, lo, _ in KNOWN_LIMITS_W.values())


def _min_clamp_sql(raw: str, model: str) -> str:
    """The known board minimum that the SQL watts ``raw`` falls below on the board ``model``, else
    0. Each board's test is cheap first (the cap below its minimum, its key in the name) so the
    regular expressions of ``board_key_sql`` run on few rows: 3 s per 20M rows without that."""
    whens = " ".join(f"WHEN {raw} < {lo!r} AND strpos(upper({model}), '{k}') > 0 "
                     f"AND {board_key_sql(model)} = '{k}' THEN {lo!r}"
                     for k, (_, lo, _) in sorted(KNOWN_LIMITS_W.items()))
    return f"(CASE {whens} ELSE 0.0 END)"


def cap_sql(cap: str | None, limit_w: str, model: str = "NULL") -> str | None:
    """A policy cap as SQL watts: ``60%`` of the window's limit (``limit_sql`` of the SQL column
    ``limit_w``), or watts; raised to the board's NVML minimum where the board (SQL expression
    ``model``) is known, as the Prolog clamps it (a "20%" cap on an H200 is 200 W, not 140 W);
    None if unparsable.

    The common case first, on the bare column: a window with a limit whose cap is at or above every
    known minimum (the rest, a CASE that DuckDB evaluates where it is needed, cost a tenth of the
    report's scan when it was the only path)."""
    if cap is None:
        return None
    t = str(cap).strip()
    try:
        number = float(t[:-1] if t.endswith("%") else t.removesuffix("W").removesuffix("w"))
    except ValueError:
        return None
    if not t.endswith("%"):
        if number >= _MIN_FLOOR_W:
            return repr(number)
        return f"greatest({number!r}, {_min_clamp_sql(repr(number), model)})"
    share = number / 100.0
    raw = f"({share!r} * {limit_sql(limit_w, model)})"
    general = (f"CASE WHEN {raw} IS NULL OR {raw} >= {_MIN_FLOOR_W!r} THEN {raw} "
               f"ELSE greatest({raw}, {_min_clamp_sql(raw, model)}) END")
    if share <= 0:
        return f"({general})"
    return (f"(CASE WHEN {limit_w} >= {_MIN_FLOOR_W / share!r} AND isfinite({limit_w}) "
            f"THEN {share!r} * {limit_w} ELSE {general} END)")


def clamp_series(cap_w: pd.Series, models: pd.Series) -> pd.Series:
    """``cap_sql``'s clamp per row: each cap raised to its board's known NVML minimum."""
    lo = models.map(lambda m: known_range_w(m)[0] or 0.0).astype(float)
    return cap_w.where(cap_w.isna(), np.maximum(cap_w, lo))


def capped_energy_sql(pavg: str, power: str, cap_w: str, secs: str, energy: str, share: str) -> str:
    """``estimates.capped_energy_j`` in SQL: the energy scaled by min(1, cap / GPU power) where
    the row has both, else min(GPU power, cap) x its length x its share (``power``: power_avg_w or
    energy / length; ``share``: the row's share of its GPU, ``peaks.share_sql``, whose power is
    the row's over it)."""
    s = f"(CASE WHEN {share} > 0 THEN {share} ELSE 1.0 END)"
    return (f"CASE WHEN ({cap_w}) IS NULL THEN {energy} "  # no limit known: not capped
            f"WHEN {pavg} > 0 AND {energy} IS NOT NULL THEN {energy} * least(1.0, ({cap_w}) * {s} / {pavg}) "
            f"ELSE coalesce(least({power} / {s}, {cap_w}) * {secs} * {s}, {energy}) END")
