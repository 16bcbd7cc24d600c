"""How a job's runtime and energy respond to a power cap: the default model and site calibrations.

A cap only bites when the job draws more than the cap; then the GPU lowers its SM clock until the
board fits under it, and the job slows by the share of its time that waits on the SM clock.

Default model (per job, from its own telemetry):

* ``need_w``: the power the job asks for (mean of its windows' maximum power, at most the limit it
  ran under: ``simulate.demand_w``). If the cap is at or above it, the job loses nothing and saves
  nothing. Published support: on an H200, LLM decode
  draws 137-300 W of a 700 W limit and "no cap ever triggers" (Ma, Afzal, Eitzinger, Wellein,
  "The Illusion of Power Capping in LLM Decode", arXiv 2605.11999, 2026).
* Above it, the dynamic power (above ``STATIC_SHARE`` of the default limit, the idle floor) scales
  by ``k = (cap - static) / (need - static)`` and the SM clock by ``k ** (1 / alpha)``; alpha = 3
  when voltage scales with frequency (P ~ f V^2, V ~ f), lower near the voltage floor. The band
  uses alpha 3 (lo slowdown) and 2 (hi slowdown).
* ``s``: the share of runtime bound by the SM clock. From GPM: busiest compute pipe (tensor, FP16,
  FP32, FP64) against DRAM bandwidth activity, ``s = c / (c + m)``; without GPM, a prior per label
  (``PRIOR_S``). Band: +-``S_BAND``. Runtime ratio = ``s / f + (1 - s)``: memory-bound work does
  not wait on the SM clock, so it loses little, until the cap is so deep (below ``MEM_KNEE`` of
  the default limit) that the memory clock/bandwidth is cut too: there the memory part slows by
  ``(MEM_KNEE / cap_share) ** 0.5`` (an assumption, applied to the hi band only).
* Energy ratio = (new average power / old) x runtime ratio, the dynamic part of the average power
  scaled by k.

Check against published figures: Samsi et al., "From Words to Watts: Benchmarking the Energy Costs
of Large Language Model Inference" (IEEE HPEC 2023, arXiv 2310.03003): LLaMA 65B inference on
A100s capped 250 -> 175 W used about 23% less energy with 6-7% more latency. This model with
s = 0.45 (prefill compute, decode memory), alpha = 3, static 12%: runtime x1.07, energy x0.75
(tests/test_savings.py checks this anchor). Zeus (You, Chung, Chowdhury, NSDI '23, arXiv
2208.06102) shows that the best power limit differs per job (15.3-75.8% energy-efficiency gains
from jointly tuning batch size and power limit): hence a per-job model, not one figure. A vendor
glossary (factryze.ai, "Power Capping") states an H100 capped 700 -> 600 W loses 5-8% throughput
on memory-bound LLM inference and 10-15% on transformer pretraining; not peer reviewed, quoted as
a plausibility range only.

A site calibration (``wattclass calibrate``) replaces the curve: measured runtime and energy
ratios per workload kind at each cap share, interpolated at the job's effective cap share
``cap / need`` (the kernels drew the full limit; a job drawing less sees a milder cap).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from wattclass.errors import DataError

FloatArray = npt.NDArray[np.float64]

#: Idle floor as a share of the default limit (H200: about 75-90 W idle of 700 W).
STATIC_SHARE = 0.12
ALPHA_MID, ALPHA_LO_SLOWDOWN, ALPHA_HI_SLOWDOWN = 2.5, 3.0, 2.0
#: SM-clock-bound share of runtime when the job has no GPM (by label).
PRIOR_S: dict[str, float] = {"compute": 0.85, "mixed": 0.55, "memory": 0.3, "idle": 0.1, "unlabelled": 0.55}
S_BAND = 0.15
S_BAND_NO_GPM = 0.25
MEM_KNEE = 0.45
#: Default power limits by GPU model name fragment (NVIDIA datasheets; SXM boards).
DEFAULT_LIMIT_W: dict[str, float] = {"H200": 700.0, "H100": 700.0, "A100": 400.0, "V100": 300.0,
                                     "L40S": 350.0, "B200": 1000.0}
#: Which calibrated workload stands for which label.
WORKLOAD_FOR_LABEL: dict[str, str] = {"compute": "compute", "memory": "memory", "mixed": "mix",
                                      "idle": "memory", "unlabelled": "mix"}
RESPONSE_VERSION = 1


def default_limit_w(model: str | None, observed_max_limit_w: float | None) -> float | None:
    """The GPU's default power limit: by model name, else the highest limit seen in telemetry."""
    for frag, watts in DEFAULT_LIMIT_W.items():
        if model and frag in model:
            return watts
    return observed_max_limit_w


@dataclass(frozen=True)
class Effect:
    """Per-job ratios (arrays): runtime and energy, mid and band."""

    runtime: FloatArray
    runtime_lo: FloatArray
    runtime_hi: FloatArray
    energy: FloatArray
    energy_lo: FloatArray  # fewer joules: the optimistic end
    energy_hi: FloatArray


def clock_bound_share(compute_act: FloatArray, dram_act: FloatArray, labels: npt.ArrayLike) -> tuple[
        FloatArray, FloatArray]:
    """(s, band half-width) per job: from GPM activity where present, else the label prior."""
    lab = np.asarray(labels, dtype=object)
    prior = np.array([PRIOR_S.get(str(x), PRIOR_S["unlabelled"]) for x in lab], dtype=float)
    tot = compute_act + dram_act
    has = np.isfinite(tot) & (tot > 0.01)
    s = np.where(has, compute_act / np.where(has, tot, 1.0), prior)
    return np.clip(s, 0.02, 0.98), np.where(has, S_BAND, S_BAND_NO_GPM)


def default_effect(cap_w: FloatArray, need_w: FloatArray, avg_w: FloatArray, default_w: FloatArray,
                   s: FloatArray, s_band: FloatArray) -> Effect:
    """The default model (module docstring), vectorised over jobs."""
    static = STATIC_SHARE * default_w
    bites = np.isfinite(cap_w) & np.isfinite(need_w) & (cap_w < need_w)
    k = np.where(bites, (cap_w - static) / np.maximum(need_w - static, 1e-9), 1.0)
    k = np.clip(k, 0.05, 1.0)
    cap_share = np.where(np.isfinite(cap_w) & (default_w > 0), cap_w / default_w, 1.0)
    knee = np.where(bites & (cap_share < MEM_KNEE), np.sqrt(MEM_KNEE / np.maximum(cap_share, 1e-3)), 1.0)

    def runtime(alpha: float, sv: FloatArray, mem_slow: FloatArray) -> FloatArray:
        f = k ** (1.0 / alpha)
        return np.where(bites, sv / f + (1.0 - sv) * mem_slow, 1.0)

    ones = np.ones_like(k)
    rt = runtime(ALPHA_MID, s, ones)
    rt_lo = runtime(ALPHA_LO_SLOWDOWN, np.clip(s - s_band, 0.0, 1.0), ones)
    rt_hi = runtime(ALPHA_HI_SLOWDOWN, np.clip(s + s_band, 0.0, 1.0), knee)
    avg = np.where(np.isfinite(avg_w), avg_w, need_w)
    new_avg = np.minimum(avg, static + np.maximum(avg - static, 0.0) * k)
    p_ratio = np.where(bites & (avg > 0), new_avg / np.where(avg > 0, avg, 1.0), 1.0)
    return Effect(rt, rt_lo, rt_hi, p_ratio * rt, p_ratio * rt_lo, p_ratio * rt_hi)


@dataclass(frozen=True)
class Curve:
    """A measured response: runtime and energy ratio (with band) at increasing cap shares."""

    cap_share: FloatArray
    runtime: FloatArray
    runtime_lo: FloatArray
    runtime_hi: FloatArray
    energy: FloatArray
    energy_lo: FloatArray
    energy_hi: FloatArray


@dataclass(frozen=True)
class SiteResponse:
    """A calibration file: curves per workload kind for one GPU model."""

    gpu_model: str
    curves: dict[str, Curve]
    source: str
    #: Per workload: its uncapped power as a share of the default limit (1.0 if not recorded).
    power_share: dict[str, float]

    def effect(self, labels: npt.ArrayLike, cap_w: FloatArray, need_w: FloatArray) -> Effect:
        """Interpolate each job's curve where the cap bites the kernel as hard as it bites the job.

        A job needing ``need`` W under ``cap`` W is cut to ``cap / need``; the kernel, drawing
        ``p`` (share of the default limit) uncapped, is cut as hard at the curve's ``x = cap / need * p``.
        """
        lab = np.asarray(labels, dtype=object)
        n = len(lab)
        out = {f: np.ones(n) for f in ("runtime", "runtime_lo", "runtime_hi", "energy", "energy_lo",
                                       "energy_hi")}
        share = np.where(np.isfinite(cap_w) & (need_w > 0), cap_w / np.where(need_w > 0, need_w, 1.0), 1.0)
        for label in set(lab.tolist()):
            kind = WORKLOAD_FOR_LABEL.get(str(label), "mix")
            curve = self.curves.get(kind) or self.curves.get("site") or next(iter(self.curves.values()))
            m = (lab == label) & (share < 1.0)
            x = share[m] * self.power_share.get(kind, 1.0)
            for f in out:
                xs, ys = curve.cap_share, getattr(curve, f)
                out[f][m] = np.interp(x, xs, ys, left=ys[0], right=1.0)
        return Effect(**out)


def _arr(v: Any, where: str) -> FloatArray:
    a = np.asarray(v, dtype=float)
    if a.ndim != 1 or not np.all(np.isfinite(a)):
        raise DataError(f"{where}: expected a list of finite numbers")
    return a


def load_response(path: Path) -> SiteResponse:
    """Read a response file written by ``wattclass calibrate`` (format: ``response_document``)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DataError(f"{path}: response file not found") from exc
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a JSON response file: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("version") != RESPONSE_VERSION or not isinstance(
            doc.get("workloads"), dict) or not doc["workloads"]:
        raise DataError(f"{path}: not a version {RESPONSE_VERSION} wattclass response file (keys version, "
                        "workloads)")
    if doc.get("dry_run"):
        raise DataError(f"{path}: written by calibrate --dry-run (no caps were set); it has no response")
    curves = {}
    for kind, pts in doc["workloads"].items():
        where = f"{path}: workloads.{kind}"
        if not isinstance(pts, list) or not pts or not all(isinstance(p, Mapping) for p in pts):
            raise DataError(f"{where}: expected a list of points")
        try:
            pts = sorted(pts, key=lambda p: float(p["cap_share"]))
            cols = {f: _arr([p[f] for p in pts], f"{where}.{f}") for f in (
                "cap_share", "runtime_ratio", "energy_ratio")}
            band = {f: _arr([p.get(f, p[f.rsplit("_", 1)[0]]) for p in pts], f"{where}.{f}") for f in (
                "runtime_ratio_lo", "runtime_ratio_hi", "energy_ratio_lo", "energy_ratio_hi")}
        except KeyError as exc:
            raise DataError(f"{where}: a point lacks key {exc}") from exc
        curves[kind] = Curve(cols["cap_share"], cols["runtime_ratio"], band["runtime_ratio_lo"],
                             band["runtime_ratio_hi"], cols["energy_ratio"], band["energy_ratio_lo"],
                             band["energy_ratio_hi"])
    ps = doc.get("uncapped_power_share") or {}
    if not isinstance(ps, dict) or not all(isinstance(v, int | float) and 0 < v <= 1.5 for v in ps.values()):
        raise DataError(f"{path}: uncapped_power_share: expected {{workload: share of the default limit}}")
    shares = {str(k): float(v) for k, v in ps.items()}
    return SiteResponse(str(doc.get("gpu_model", "?")), curves, str(path), shares)
