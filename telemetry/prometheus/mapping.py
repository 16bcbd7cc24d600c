"""dcgm-exporter's names: DCGM fields -> telemetry v1 inputs, and the labels that identify GPU and job.

The counters a site must enable are in deploy/dcgm-exporter-counters.csv (dcgm-exporter's
``-f`` file). dcgm-exporter's default file lacks the FP64/FP32/FP16 pipes and SM_ACTIVE; without
them the GPM rule cannot call a job memory-bound and the job is labelled by the model instead
(classifier/rules.py ``PIPE_GAP``).
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # counter, mJ since the driver loaded

#: DCGM gauge -> (GpuSample field, scale to the field's unit). Where two names exist (DCGM renamed
#: throttle reasons to clock-event reasons), both are listed; the first with a finite sample wins
#: (``windows._gauge``). The enforced limit before the management limit: ``power_limit_w`` is the
#: limit in force (the daemon reads ``nvmlDeviceGetEnforcedPowerLimit``), which is lower where the
#: board's power is shared or budgeted (a GH200 with its CPU, a node power budget).
GAUGES: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),  # W
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_w", 1.0),  # W
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", 1.0),  # W
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_pct", 1.0),  # %
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_pct", 1.0),  # %
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),  # MHz
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),  # MHz
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),  # C
    "DCGM_FI_DEV_FB_USED": ("fb_used_mib", 1.0),  # MiB
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", 1.0),  # NVML bitmask
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clock_event_reasons", 1.0),  # older name
}

#: DCGM profiling field (ratio 0-1, or bytes/s) -> (GpmMetrics field, scale). The GPM equivalents:
#: DCGM reads the same hardware counters on V100, A100 and H100 (and later).
PROF: dict[str, tuple[str, float]] = {
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_util_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_util_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_bw_util_pct", 100.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("fp64_util_pct", 100.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("fp32_util_pct", 100.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("fp16_util_pct", 100.0),
    "DCGM_FI_PROF_PIPE_INT_ACTIVE": ("int_util_pct", 100.0),  # field 1016 (DCGM 3.x)
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx_mibs", 1.0 / 2**20),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx_mibs", 1.0 / 2**20),
}

#: DCGM field of a GPU constant -> (GpuInfo field, scale): the NVML maximum SM clock the daemon
#: records (``nvmlDeviceGetMaxClockInfo``). Without it every imported row lacked
#: ``sm_clock_max_mhz`` and the model's clock features (clock / max clock) were unknown.
INFO: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("sm_clock_max_mhz", 1.0),  # MHz
}

#: Fields the model's ratio features need (power / limit, clock / max clock), each as the
#: alternative names that give it; a GPU that exports none of one group is reported by the import.
MODEL_FIELDS: tuple[tuple[str, ...], ...] = (
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    ("DCGM_FI_DEV_MAX_SM_CLOCK",),
)

#: Fields the GPM rule needs; a missing one is reported by the import (see module docstring).
RULE_FIELDS: tuple[str, ...] = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_PIPE_INT_ACTIVE",
)

ALL_FIELDS: tuple[str, ...] = (ENERGY, *GAUGES, *INFO, *PROF)

#: The PromQL selector of every field the import reads.
SELECTOR = '{__name__=~"' + "|".join(ALL_FIELDS) + '"}'

#: dcgm-exporter's labels.
HOST_LABELS = ("Hostname", "hostname", "instance")
UUID_LABEL = "UUID"
INDEX_LABEL = "gpu"
MODEL_LABEL = "modelName"
PCI_LABEL = "pci_bus_id"
#: Set on a MIG instance's series (beside its GPU's UUID): the GPU instance id.
MIG_INSTANCE_LABEL = "GPU_I_ID"
#: The job label dcgm-exporter writes with ``--hpc-job-mapping-dir``.
DEFAULT_JOB_LABEL = "hpc_job"


class GpuKey(NamedTuple):
    host: str
    uuid: str


def gpu_key(labels: dict[str, str]) -> GpuKey | None:
    """Which GPU a series belongs to (host from Hostname, else instance without the port)."""
    uuid = labels.get(UUID_LABEL)
    if not uuid:
        return None
    host = next((labels[k] for k in HOST_LABELS if labels.get(k)), "")
    if host and "Hostname" not in labels and "hostname" not in labels:
        host = host.rsplit(":", 1)[0]
    try:  # an address (an instance label without a Hostname) is kept whole: 10.0.0.1 is not host "10"
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        host = host.split(".")[0]
    return GpuKey(host or "unknown", uuid)
