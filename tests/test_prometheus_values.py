"""dcgm-exporter values a real Prometheus can hold but the recordings never had: NaN and infinite
samples (a scrape of a field DCGM could not read, a federated or recording-rule series). The
import must treat them as missing, not fail with a traceback (``round(nan)``) or write them.

Found by review: a NaN energy sample made ``wattclass telemetry import`` fail with ValueError
("cannot convert float NaN to integer"), an infinite one with OverflowError; an infinite PROF
sample took the GPM of every later window of its GPU in the import (NaN means, read as missing)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from wattclass.telemetry.prometheus import mapping
from wattclass.telemetry.prometheus.client import Series
from wattclass.telemetry.prometheus.windows import GpuTimeline, gpu_rows, merge, missing_fields

LABELS = {"UUID": "GPU-1", "Hostname": "node1", "gpu": "0", "hpc_job": "42"}
N, T0 = 60, 1_800_000_000.0  # one scrape a second


def _rows(energy: list[float], sm: list[float]) -> list[dict]:  # type: ignore[type-arg]
    t = [T0 + i for i in range(N)]
    series = [Series({**LABELS, "__name__": mapping.ENERGY}, t, energy),
              Series({**LABELS, "__name__": "DCGM_FI_DEV_POWER_USAGE"}, t, [300.0] * N),
              Series({**LABELS, "__name__": "DCGM_FI_PROF_SM_ACTIVE"}, t, sm)]
    (tl,) = merge([series], mapping.DEFAULT_JOB_LABEL, None).values()
    return gpu_rows(tl, T0, 10.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_or_infinite_energy_sample_is_a_missing_sample(bad: float) -> None:
    energy = [1e9 + 300_000.0 * i for i in range(N)]  # 300 W in mJ
    clean = _rows(energy, [0.5] * N)
    energy[25] = bad
    got = _rows(energy, [0.5] * N)
    assert [r["job_id"] for r in got] == [r["job_id"] for r in clean]
    total = sum(r["energy_j"] or 0.0 for r in got)
    assert math.isfinite(total)
    assert total == pytest.approx(sum(r["energy_j"] or 0.0 for r in clean), rel=1e-9)


def test_an_infinite_prof_sample_is_left_out_of_the_windows_mean() -> None:
    energy = [1e9 + 300_000.0 * i for i in range(N)]
    sm = [0.5] * N
    sm[25] = math.inf
    got = _rows(energy, sm)
    # the window holding it averages its other scrapes; the later windows keep their GPM (a running
    # sum through inf made every later window's mean NaN, read as no GPM: their jobs left the rule)
    assert [r["sm_util_pct"] for r in got] == pytest.approx([50.0] * len(got))


def test_mig_instances_of_one_gpu_are_not_merged_into_one_timeline(tmp_path: Path) -> None:
    """dcgm-exporter labels a MIG instance's series with its GPU's UUID and the instance's
    ``GPU_I_ID``; merged by UUID alone, the instances overwrote each other's samples scrape by
    scrape: one instance's job got the whole GPU's windows and the other's none (found by review).
    The import cannot split a MIG GPU's readings per instance: it leaves the instances' series out
    and says so (per GPU, in the result and a warning), rather than book them on one job."""
    t = [T0 + i for i in range(N)]
    series = []
    for gi, job in (("1", "101"), ("2", "202")):
        lab = {**LABELS, "GPU_I_ID": gi, "GPU_I_PROFILE": "3g.71gb", "hpc_job": job}
        series += [Series({**lab, "__name__": mapping.ENERGY}, t, [1e9 + 300_000.0 * i for i in range(N)]),
                   Series({**lab, "__name__": "DCGM_FI_PROF_SM_ACTIVE"}, t, [0.5] * N)]
    gpus = merge([series], mapping.DEFAULT_JOB_LABEL, None)
    jobs = {r["job_id"] for tl in gpus.values() for r in gpu_rows(tl, T0, 10.0)}
    assert jobs <= {None}  # neither instance's job gets the GPU's windows
    (tl,) = gpus.values()
    assert tl.mig_series == 4


def test_a_host_from_an_ip_instance_label_is_the_whole_address() -> None:
    """Without a Hostname label the host is the ``instance`` label without its port; cut at its
    first dot as a host name is, every node at 10.x.x.x became host "10" (found by review): their
    files went into one host=10 folder, and their windows named a host Slurm never had."""
    from wattclass.telemetry.prometheus.mapping import gpu_key

    a = gpu_key({"UUID": "GPU-a", "instance": "10.0.0.1:9400"})
    b = gpu_key({"UUID": "GPU-b", "instance": "10.0.0.2:9400"})
    assert a is not None and b is not None and (a.host, b.host) == ("10.0.0.1", "10.0.0.2")
    n = gpu_key({"UUID": "GPU-c", "instance": "node7.cluster.example:9400"})
    assert n is not None and n.host == "node7"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_a_clock_event_reasons_sample_that_is_no_bitmask_is_missing(bad: float) -> None:
    """The reasons gauge is a float in Prometheus: a NaN sample failed the whole import with
    ValueError (``int(nan)``), an infinite one with OverflowError, and a negative one set every bit
    of the mask (counted as power-throttled). Such a sample is missing; the window's share comes
    from its other scrapes."""
    t = [T0 + i for i in range(N)]
    reasons = [0.0] * N
    reasons[25] = bad
    series = [Series({**LABELS, "__name__": mapping.ENERGY}, t, [1e9 + 300_000.0 * i for i in range(N)]),
              Series({**LABELS, "__name__": "DCGM_FI_DEV_POWER_USAGE"}, t, [300.0] * N),
              Series({**LABELS, "__name__": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}, t, reasons)]
    (tl,) = merge([series], mapping.DEFAULT_JOB_LABEL, None).values()
    rows = gpu_rows(tl, T0, 10.0)
    assert len(rows) == 6 and all(r["throttle_power_frac"] == 0.0 for r in rows)
    assert tl.bad_reasons == 1


def test_the_max_sm_clock_reaches_the_rows_and_the_models_clock_features() -> None:
    """Every imported row had ``sm_clock_max_mhz`` null: the import never read DCGM's max SM clock,
    so the model's clock features (SM clock / max clock, its spread, the clock drop under power
    throttling) were missing on every dcgm-exporter GPU, A100s above all, whose jobs the model
    labels where the rule cannot (found by review). ``DCGM_FI_DEV_MAX_SM_CLOCK`` is the NVML
    maximum the daemon records."""
    from wattclass.classifier.features import window_features
    from wattclass.schema import conform
    from wattclass.telemetry.sink import rows_to_table

    tl = _steady_gpu(DCGM_FI_DEV_POWER_MGMT_LIMIT=400.0, DCGM_FI_DEV_SM_CLOCK=1200.0,
                     DCGM_FI_DEV_MAX_SM_CLOCK=1410.0)
    rows = gpu_rows(tl, T0, 10.0)
    assert rows and all(r["sm_clock_max_mhz"] == 1410.0 for r in rows)
    feats = window_features(conform(rows_to_table(rows)))
    assert feats["clock_frac"] == pytest.approx([1200.0 / 1410.0] * len(rows))
    assert missing_fields(tl) == [f for f in mapping.RULE_FIELDS]


def test_model_inputs_an_exporter_lacks_are_named() -> None:
    """Without the power limit or the max SM clock the model's power and clock fractions are
    unknown on every window: the import says so, as it does for the rule's fields."""
    tl = _steady_gpu()
    miss = missing_fields(tl)
    assert "DCGM_FI_DEV_MAX_SM_CLOCK" in miss and "DCGM_FI_DEV_ENFORCED_POWER_LIMIT" in miss


def test_the_enforced_limit_is_the_rows_limit_where_both_limits_are_exported() -> None:
    """Telemetry v1's ``power_limit_w`` is the limit enforced during the window, what the daemon
    reads (``nvmlDeviceGetEnforcedPowerLimit``). The import took DCGM's management limit first: on a
    board whose enforced limit is below it (a GH200 whose module power is shared with the CPU, a
    node power budget) the model's power fractions were taken against a limit the GPU never ran
    under (found by review)."""
    tl = _steady_gpu(DCGM_FI_DEV_POWER_MGMT_LIMIT=900.0, DCGM_FI_DEV_ENFORCED_POWER_LIMIT=650.0)
    rows = gpu_rows(tl, T0, 10.0)
    assert rows and all(r["power_limit_w"] == 650.0 for r in rows)


def test_a_nan_enforced_limit_falls_back_to_the_management_limit() -> None:
    """Since the enforced limit is read first, a GPU whose exporter writes it as NaN (a field DCGM
    could not read) lost its limit on every row although the management limit was there: the
    model's power fractions unknown, the report's caps taken from the board's default (found by
    the session review; before the reorder the management limit was read). A non-finite sample
    of one name now gives way to a finite one of the next."""
    tl = _steady_gpu(DCGM_FI_DEV_POWER_MGMT_LIMIT=900.0, DCGM_FI_DEV_ENFORCED_POWER_LIMIT=float("nan"))
    rows = gpu_rows(tl, T0, 10.0)
    assert rows and all(r["power_limit_w"] == 900.0 for r in rows)


def _steady_gpu(**gauges: float) -> GpuTimeline:
    """One GPU's merged series: its energy counter at 300 W, power 300 W, and each DCGM gauge
    named in ``gauges`` at its constant value, one scrape a second."""
    t = [T0 + i for i in range(N)]
    series = [Series({**LABELS, "__name__": mapping.ENERGY}, t, [1e9 + 300_000.0 * i for i in range(N)]),
              Series({**LABELS, "__name__": "DCGM_FI_DEV_POWER_USAGE"}, t, [300.0] * N),
              *(Series({**LABELS, "__name__": name}, t, [value] * N) for name, value in gauges.items())]
    (tl,) = merge([series], mapping.DEFAULT_JOB_LABEL, None).values()
    return tl


def test_a_gpu_two_jobs_share_splits_its_windows_between_both_jobs() -> None:
    """dcgm-exporter gives a GPU whose job-mapping file names two jobs (a shared GPU: the Prolog
    writes every job on it, docs/admin.md) one copy of each series per job, differing only in
    ``hpc_job``. Merged by GPU, the last copy's job overwrote the other's at every scrape: one job
    got the whole GPU's windows and energy, unshared, and the other none at all (found by a
    fresh-eyes review of shared GPUs in the import). Each window is now split between the jobs
    equally (DCGM has no per-process activity), marked shared, and adds up to the counter."""
    t = [T0 + i for i in range(N)]
    series = []
    for job, user in (("101", "alice"), ("202", "bob")):
        lab = {**LABELS, "hpc_job": job, "user": user}
        series += [Series({**lab, "__name__": mapping.ENERGY}, t, [1e9 + 300_000.0 * i for i in range(N)]),
                   Series({**lab, "__name__": "DCGM_FI_DEV_POWER_USAGE"}, t, [300.0] * N)]
    (tl,) = merge([series], mapping.DEFAULT_JOB_LABEL, "user").values()
    rows = gpu_rows(tl, T0, 10.0)
    by_job: dict[str, float] = {}
    for r in rows:
        by_job[r["job_id"]] = by_job.get(r["job_id"], 0.0) + r["energy_j"]
    assert sorted(by_job) == ["101", "202"]
    assert by_job["101"] == pytest.approx(by_job["202"], abs=1e-3)
    assert sum(by_job.values()) == pytest.approx(300.0 * (N - 1))  # the counter's delta, once
    assert {(r["job_id"], r["user"]) for r in rows} == {("101", "alice"), ("202", "bob")}
    assert all(r["shared_jobs"] == 2 and r["share_basis"] == "equal" and r["share_ratio"] == 0.5
               and r["power_avg_w"] == pytest.approx(150.0) for r in rows)
