"""The GPM roofline rule: the ground truth wherever GPM metrics exist (docs/design.md, "Labels").

Window: ``idle`` if sm_util < 10; else ``compute`` if max(tensor, fp64, fp32, fp16, int util) >=
dram_bw_util, else ``memory`` (the busiest unit is the bottleneck). ``memory`` needs every compute
pipe measured: where one is missing (dcgm-exporter's default counters lack the FP64/FP32/FP16 and
integer pipes) the window is ``PIPE_GAP``, not memory, since an FP64 job looks memory-bound to a rule
that cannot see its pipe; such jobs go to the model like jobs without GPM, and their label says why.

The integer pipe counts since issue 13 round 7: before, the rule compared DRAM with the tensor and
floating-point pipes only, so a job whose busiest unit is the integer pipe (pooling and top-k
selection, layout permutes, random-number generation, sparse and graph kernels, index-heavy
convolutions: 82% integer against 15% DRAM for max pooling on an H200) was called memory-bound and
capped, although its speed follows the SM clock the cap lowers. 241 of the 997 recorded H200 jobs
change label with it, 224 of them memory -> compute (docs/benchmarks.md, issue 13 round 7).
Job: ``idle`` if under half its windows are active; else ``compute`` if >= 70% of the active
windows are compute, ``memory`` if <= 30%, else ``mixed``. Windows are *counted* (not weighted by
duration), exactly as the reference converter that produced the bundled jobs.csv.

Confidence (our choice, see ``job_confidence``): the probability that the job's label would stay
the same if we saw more windows of the same job. Each job label is a statement about two shares
(active share vs 0.5, compute share of active windows vs 0.3/0.7); with k of n windows on one side
the share's posterior under a Jeffreys prior is Beta(k + 1/2, n - k + 1/2), and the confidence is
the posterior mass on the label's side of its thresholds. It grows with evidence (3 unanimous
windows: 0.84, 30: >0.999) and falls near a threshold (3 of 4 compute: 0.46). The same formula
takes the model's soft counts (sums of window probabilities), so rule and model confidences mean
the same thing.

Everything is vectorised over numpy arrays: these run on every window of a cluster-day.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Window classes (model targets) in code order; negative codes: the rule cannot tell.
WINDOW_CLASSES: tuple[str, ...] = ("idle", "compute", "memory")
IDLE, COMPUTE, MEMORY = 0, 1, 2
NO_GPM = -1
#: Active, no measured pipe as busy as DRAM, but a compute pipe was not measured: memory or compute?
PIPE_GAP = -2

#: Job labels in code order.
JOB_LABELS: tuple[str, ...] = ("idle", "compute", "memory", "mixed")
J_IDLE, J_COMPUTE, J_MEMORY, J_MIXED = 0, 1, 2, 3

SM_ACTIVE_PCT = 10.0
ACTIVE_SHARE = 0.5
COMPUTE_SHARE = 0.7
MEMORY_SHARE = 0.3

#: Compute pipes compared against DRAM bandwidth activity.
COMPUTE_UNITS: tuple[str, ...] = ("tensor_util_pct", "fp64_util_pct", "fp32_util_pct", "fp16_util_pct",
                                  "int_util_pct")
#: The rule's compute pipes before issue 13 round 7 (no integer pipe): what the reference labels of
#: tests/data/former-engine-labels and the recordings' ``*_fp_only`` columns were made with.
COMPUTE_UNITS_FP_ONLY: tuple[str, ...] = COMPUTE_UNITS[:4]
#: GPM columns the window rule reads.
RULE_COLUMNS: tuple[str, ...] = ("sm_util_pct", "dram_bw_util_pct", *COMPUTE_UNITS)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int8]


def window_labels(
    sm_util: npt.ArrayLike,
    dram_bw: npt.ArrayLike,
    compute_units: list[npt.ArrayLike],
) -> IntArray:
    """Window codes (IDLE/COMPUTE/MEMORY, NO_GPM or PIPE_GAP) from GPM metric arrays (NaN = null).

    A window has GPM when sm_util and dram_bw are present and at least one compute pipe is. A
    present pipe at least as busy as DRAM is enough for ``compute``; ``memory`` needs all pipes
    present, else the window is PIPE_GAP (see module docstring).
    """
    sm = np.asarray(sm_util, dtype=np.float64)
    dram = np.asarray(dram_bw, dtype=np.float64)
    comp = np.full(sm.shape, np.nan)
    pipe_missing = np.zeros(sm.shape, dtype=bool)
    for u in compute_units:
        a = np.asarray(u, dtype=np.float64)
        comp = np.fmax(comp, a)
        pipe_missing |= np.isnan(a)
    has_gpm = ~np.isnan(sm) & ~np.isnan(dram) & ~np.isnan(comp)
    out = np.where(comp >= dram, COMPUTE, MEMORY).astype(np.int8)
    out[(out == MEMORY) & pipe_missing] = PIPE_GAP
    out[sm < SM_ACTIVE_PCT] = IDLE
    out[~has_gpm] = NO_GPM
    return out


def job_labels(n_idle: npt.ArrayLike, n_compute: npt.ArrayLike, n_memory: npt.ArrayLike) -> IntArray:
    """Job label codes (J_*) from window counts; counts may be soft (sums of probabilities).

    Jobs with no windows at all are labelled idle (callers only pass jobs with windows).
    """
    ni = np.asarray(n_idle, dtype=np.float64)
    nc = np.asarray(n_compute, dtype=np.float64)
    nm = np.asarray(n_memory, dtype=np.float64)
    n = ni + nc + nm
    active = nc + nm
    with np.errstate(invalid="ignore", divide="ignore"):
        fc = np.where(active > 0, nc / np.where(active > 0, active, 1.0), 0.0)
    out = np.full(n.shape, J_MIXED, dtype=np.int8)
    out[fc >= COMPUTE_SHARE] = J_COMPUTE
    out[fc <= MEMORY_SHARE] = J_MEMORY
    # Tiny tolerance so soft counts that are exactly half (up to float error) match the rule.
    out[(active < ACTIVE_SHARE * n - 1e-9) | (n <= 0)] = J_IDLE
    return out


def _beta_mass_above(k: FloatArray, n: FloatArray, threshold: float) -> FloatArray:
    """P(share >= threshold) for the share's Jeffreys posterior Beta(k + 1/2, n - k + 1/2)."""
    from scipy.special import betainc  # here: the scan imports this module, and needs no SciPy

    a = np.maximum(k, 0.0) + 0.5
    b = np.maximum(n - k, 0.0) + 0.5
    return np.asarray(1.0 - betainc(a, b, threshold), dtype=np.float64)


def job_confidence(
    n_idle: npt.ArrayLike, n_compute: npt.ArrayLike, n_memory: npt.ArrayLike, labels: npt.ArrayLike
) -> FloatArray:
    """Posterior probability that each job's label holds (see module docstring)."""
    ni = np.asarray(n_idle, dtype=np.float64)
    nc = np.asarray(n_compute, dtype=np.float64)
    nm = np.asarray(n_memory, dtype=np.float64)
    lab = np.asarray(labels)
    n = ni + nc + nm
    active = nc + nm
    p_active = _beta_mass_above(active, n, ACTIVE_SHARE)
    p_c_hi = _beta_mass_above(nc, active, COMPUTE_SHARE)
    p_c_lo = 1.0 - _beta_mass_above(nc, active, MEMORY_SHARE)
    conf = np.select(
        [lab == J_IDLE, lab == J_COMPUTE, lab == J_MEMORY],
        [1.0 - p_active, p_active * p_c_hi, p_active * p_c_lo],
        default=p_active * np.clip(1.0 - p_c_hi - p_c_lo, 0.0, 1.0),
    )
    return np.asarray(np.clip(conf, 0.0, 1.0), dtype=np.float64)


def label_names(codes: npt.ArrayLike) -> npt.NDArray[np.object_]:
    """Job label strings for job label codes."""
    return np.asarray(JOB_LABELS, dtype=object)[np.asarray(codes, dtype=np.int64)]
