"""Constants and the environment-driven configuration (read once)."""

from __future__ import annotations

import os  # noqa: F401
from dataclasses import dataclass

LABELS = ("compute", "memory", "mixed", "low", "idle")
RUN_FIELDS = ["job", "label", "start", "end", "steps", "rate", "unit", "energy_j", "avg_power_w",
              "job_id", "user", "family", "params"]
USERS = ("ayaka", "bruno", "chen", "dana", "emeka", "farah")
GPM_IDS = {
    "gpm_sm_util": 2, "gpm_sm_occupancy": 3, "gpm_int_util": 4, "gpm_any_tensor_util": 5,
    "gpm_dfma_tensor_util": 6, "gpm_hmma_tensor_util": 7, "gpm_dmma_tensor_util": 8,
    "gpm_dram_bw_util": 10, "gpm_fp64_util": 11, "gpm_fp32_util": 12, "gpm_fp16_util": 13,
    "gpm_pcie_tx_mibs": 20, "gpm_pcie_rx_mibs": 21, "gpm_graphics_util": 1,
}
INT_COLS = ("clock_event_reasons", "energy_mj", "mem_clock_mhz", "mem_temp_c", "n_procs", "power_instant_mw",
            "power_mem_avg_mw", "power_mw", "pstate", "sm_clock_mhz", "temp_c", "util_gpu", "util_mem")
#: NVML field ids of the polls' field-value read: the instantaneous board power; since issue 13
#: round 13 the HBM's own 1 s average power (POWER_AVERAGE at scope MEMORY = 2) and the HBM
#: temperature (MEMORY_TEMP), which earlier recordings lack (null where a GPU does not answer).
FIELD_POWER_INSTANT, FIELD_POWER_AVERAGE, FIELD_MEMORY_TEMP, SCOPE_MEMORY = 186, 185, 82, 2
FLOAT_COLS = ("fb_used_mib", "nvml_basic_us", "nvml_gpm_us", "ts", *GPM_IDS)
STARTUP_S = 15.0  # torch import + CUDA context + sampler lead-in, measured order of magnitude
FLUSH_EVERY_S = 30.0


# -- configuration


@dataclass(frozen=True)
class Config:
    """Everything the environment decides, read once."""

    out: str
    dur: float
    gap: float
    part: int | None
    parts: int
    only: tuple[str, ...]
    list_only: bool
    smoke: bool
    device: str
    deadline: float
    tag: str
    job_base: int
    spool: str | None
    #: SWEEP=N: N randomised runs from workloads/sweep.py instead of the fixed table (0 = table).
    sweep: int = 0
    seed: int = 0
    families: tuple[str, ...] = ()
    #: NVML index of the GPU to sample when CUDA does not report a UUID (GPU=i; default 0).
    gpu: int = 0
    #: RUN_DUR=s: every run lasts s seconds, the sweep runs' own durations too (long re-runs of
    #: recorded runs, issue 13 round 9: do longer jobs separate the twins?).
    run_dur: float | None = None

    @staticmethod
    def from_env(env: dict[str, str]) -> Config:
        smoke = env.get("SMOKE", "") not in ("", "0")
        part = int(env["PART"]) if env.get("PART", "") != "" else None
        parts = int(env.get("PARTS", "2"))
        if part is not None and not 0 <= part < parts:
            raise SystemExit(f"PART={part} must be in 0..{parts - 1} (PARTS={parts})")
        dur = 0.3 if smoke else float(env.get("DUR", "13"))
        gap = float(env.get("GAP", "0.2" if smoke else "2"))
        deadline = float(env.get("DEADLINE", "110" if smoke else "530"))
        sweep = int(env.get("SWEEP", "0"))
        seed = int(env.get("SEED", "0"))
        tag = env.get("TAG") or ("smoke" if smoke else f"sweep_s{seed}" if sweep
                                 else f"collect_part{part}" if part is not None else "collect_all")
        only = tuple(x.strip() for x in env.get("ONLY", "").split(",") if x.strip())
        return Config(out=env.get("OUT", "/tmp/out"), dur=dur, gap=gap, part=part, parts=parts,
                      only=only, list_only=env.get("LIST", "") not in ("", "0"), smoke=smoke,
                      device=env.get("DEVICE", "cuda"), deadline=deadline, tag=tag,
                      job_base=int(env.get("JOB_BASE", str(6000 + 100 * (part or 0)))),
                      spool=env.get("SPOOL") or None, sweep=sweep, seed=seed,
                      families=tuple(x.strip() for x in env.get("FAMILIES", "").split(",") if x.strip()),
                      gpu=int(env.get("GPU", "0")),
                      run_dur=float(env["RUN_DUR"]) if env.get("RUN_DUR", "") != "" else None)

