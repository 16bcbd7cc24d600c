"""Peak dense rates per GPM pipe, by GPU board: the useful-work estimate's only assumption.

Why a table by board, not one GPU's figures: the report's TFLOP/s estimate is pipe activity x the
pipe's peak rate, and the peaks differ threefold between GPUs (an A100's BF16 tensor pipe peaks at
312 TFLOP/s, an H200's at 989.5). With one GPU's peaks for every window, a fleet of A100s (whose
pipe activity comes from DCGM's profiling fields, ``dcgm_import``) was credited three times the
work it did. A board the table does not know is left out of the estimate and named on the page,
never guessed: a PCIe or NVL board runs the same GPU at other clocks and power (an H100 PCIe peaks
at 756 TFLOP/s, not the SXM board's 989.4), so ``caps.board_key`` gives them no key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from wattclass.caps import board_key

#: The GPM pipes whose activity the estimate counts, in this order everywhere (SQL columns too).
PIPES: tuple[str, ...] = ("tensor_util_pct", "fp64_util_pct", "fp32_util_pct", "fp16_util_pct")

#: TFLOP/s per pipe (``PIPES`` order) of SXM boards, from NVIDIA's datasheets and architecture
#: whitepapers, the with-sparsity figures halved. The tensor pipe is counted at the BF16/FP16
#: rate: GPM's "any tensor" activity does not say which precision ran, so TF32 or FP64 tensor
#: work is overestimated and FP8 work underestimated. FP16 non-tensor is 2x FP32 on Ampere's
#: and Hopper's SMs (A100 whitepaper: 78 TFLOP/s; H100 SXM5: 133.8).
PEAK_TFLOPS: dict[str, tuple[float, float, float, float]] = {
    "H200": (989.5, 34.0, 67.0, 134.0),  # H200 SXM datasheet
    "H100": (989.5, 34.0, 67.0, 134.0),  # H100 SXM datasheet (BF16 1,979 with sparsity)
    "GH200": (989.5, 34.0, 67.0, 134.0),  # GH200 datasheet: the H100 SXM's rates
    "A100": (312.0, 9.7, 19.5, 78.0),  # A100 SXM datasheet (FP64 non-tensor 9.7)
}

#: A ``fine`` row's TFLOP with ``_peaks`` joined: its pipes' busy seconds x their peak rates.
TFLOP_SQL = " + ".join(f"pipe_s{i} * r{i}" for i in range(len(PIPES)))


#: What ``rated_model_sql`` appends to a MIG row's model name: a MIG instance's GPM activity is
#: relative to its own slices of the GPU (docs/shared-gpus.md), which the row does not record, so
#: the whole board's peak rates would credit a 1-of-7 instance 7 times its work. Such rows are
#: left out of the estimate and named, as a board of unknown rates is (the GPU's unused slices'
#: row too: it carries the whole GPU's activity, the instances' work once more).
MIG_SUFFIX = "MIG"


def board_peaks(model: object) -> tuple[float, float, float, float] | None:
    """The peak rates of a GPU model name as NVML writes it ("NVIDIA H200", "NVIDIA
    A100-SXM4-80GB"), or None for a board the table does not know (or no name), and for a MIG
    instance ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", or a name ending in ``MIG_SUFFIX``)."""
    if not isinstance(model, str) or not model.strip():
        return None
    if MIG_SUFFIX in re.split(r"[\s_-]+", model.upper()):
        return None
    return PEAK_TFLOPS.get(board_key(model))


def rated_model_sql(model: str, share_basis: str) -> str:
    """The model name the estimate rates a row by (SQL): ``MIG_SUFFIX`` appended on MIG rows."""
    return f"CASE WHEN {share_basis} = 'mig' THEN concat_ws(' ', {model}, '{MIG_SUFFIX}') ELSE {model} END"


def share_sql(share_ratio: str) -> str:
    """A row's share of its GPU's work (SQL): ``share_ratio`` where it is one (a GPU several jobs
    shared: every row carries the whole GPU's GPM, so the jobs' rows counted its work once per
    job), else 1 (a sole job, no job, or a value that is no share). ``isfinite`` first: DuckDB
    decides the bounds from a Parquet column's statistics, which leave NaN out, so a NaN passed."""
    return (f"(CASE WHEN isfinite({share_ratio}) AND {share_ratio} >= 0 AND {share_ratio} <= 1 "
            f"THEN {share_ratio} ELSE 1.0 END)")


def share_series(w: pd.DataFrame) -> pd.Series:
    """``share_sql`` per row of a pandas window table."""
    import pandas as pd

    if "share_ratio" not in w:
        return pd.Series(1.0, index=w.index)
    r = pd.to_numeric(w["share_ratio"], errors="coerce").astype(float)
    return r.where(r.between(0.0, 1.0), 1.0)


def describe(models: Iterable[str]) -> str:
    """The rates used for these model names, for the page: "H200: tensor 989.5, fp64 34, ..."."""
    keys: dict[str, tuple[float, float, float, float]] = {}
    for m in models:
        rates = board_peaks(m)
        if rates is not None:
            keys.setdefault(board_key(m), rates)
    return "; ".join(f"{k}: " + ", ".join(f"{p.removesuffix('_util_pct')} {r:g}"
                                         for p, r in zip(PIPES, v, strict=True))
                     for k, v in sorted(keys.items()))


def register_rates(con: Any) -> tuple[tuple[str, ...], dict[str, float]]:
    """Register ``_peaks`` (gpu_model, r0..r3: the pipes' peak TFLOP/s, ``PIPES`` order) on the
    report's DuckDB connection for the boards its ``fine`` table holds GPM windows of whose rates
    are known.

    Returns those model names, and the GPM energy (kWh) of valid windows on the other boards, by
    model name: left out of the estimate, and named on the page."""
    import pyarrow as pa

    per_model = con.execute("SELECT gpu_model, sum(gpm_energy_j) FROM fine WHERE _bad = 0 "
                            "GROUP BY gpu_model").fetchall()
    # only boards with GPM windows: the page names these rates as the estimate's
    rated: dict[str, tuple[float, float, float, float]] = {}
    unrated: dict[str, float] = {}
    for m, e in per_model:
        if not e:
            continue
        if (r := board_peaks(m)) is not None:
            rated[str(m)] = r
        else:  # no name: null, or empty (an import without modelName)
            name = str(m) if m is not None and str(m).strip() else "(no model name)"
            unrated[name] = unrated.get(name, 0.0) + float(e) / 3.6e6
    cols = {"gpu_model": pa.array(list(rated), pa.string())}
    cols |= {f"r{i}": pa.array([r[i] for r in rated.values()], pa.float64()) for i in range(len(PIPES))}
    con.register("_peaks", pa.table(cols))
    return tuple(sorted(rated)), unrated


def work_table(tf: pd.DataFrame) -> pd.DataFrame:
    """Per label (the index, in ``estimates.LABEL_ORDER``): estimated TFLOP, energy (kJ) and
    TFLOP/s per kW over the windows with GPM on boards of known rates (``tf``: tflop and
    gpm_energy_j summed per label)."""
    import pandas as pd

    from wattclass.report.estimates import LABEL_ORDER

    tf = tf[tf["tflop"].notna() & (tf["gpm_energy_j"] > 0)]
    wpe = pd.DataFrame({"tflop": tf["tflop"], "energy_kj": tf["gpm_energy_j"] / 1e3})
    wpe["tflops_per_kw"] = wpe["tflop"] / wpe["energy_kj"]
    wpe = wpe.loc[[x for x in LABEL_ORDER if x in wpe.index]]
    wpe.index.name = None
    return wpe
