"""A real Prometheus for tests: recorded H200 samples as dcgm-exporter series, backfilled with
``promtool tsdb create-blocks-from openmetrics``, served by ``prometheus`` on 127.0.0.1.

The recording's GPU is exported the way dcgm-exporter exports it (DCGM field names, units, the
``gpu``/``UUID``/``Hostname``/``modelName`` labels and ``hpc_job`` while a job holds the GPU), so
the importer sees what a site's Prometheus holds.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from free_ports import free_port

from wattclass.gpu.replay import JOB_GRACE_S, ReplayBackend

HOST = "gpu-h200-03"

#: DCGM field -> (recorded column, scale): what dcgm-exporter would publish for each recorded poll.
FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_instant_mw", 1e-3),
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_FB_USED": ("fb_used_mib", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clock_event_reasons", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("gpm_sm_util", 0.01),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gpm_sm_occupancy", 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpm_any_tensor_util", 0.01),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpm_dram_bw_util", 0.01),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("gpm_fp64_util", 0.01),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("gpm_fp32_util", 0.01),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("gpm_fp16_util", 0.01),
    "DCGM_FI_PROF_PIPE_INT_ACTIVE": ("gpm_int_util", 0.01),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gpm_pcie_tx_mibs", 2.0**20),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gpm_pcie_rx_mibs", 2.0**20),
}


@dataclass
class Recorded:
    """The recording as scrapes: times (ms-rounded, as Prometheus stores them), job per scrape."""

    uuid: str
    index: int
    t: list[float]
    job: list[str | None]
    values: dict[str, list[float | None]]  # DCGM field -> value per scrape


def recorded(raw: Path) -> Recorded:
    b = ReplayBackend(raw, realtime=False)
    (g,) = b._gpus  # the bundled recording is one GPU
    t = [round(x, 3) for x in g.ts]
    job = []
    for x in g.ts:
        running = [j.job_id for j in g.jobs if j.start <= x <= j.end + JOB_GRACE_S]
        job.append(running[0] if running else None)
    vals: dict[str, list[float | None]] = {}
    for name, (col, scale) in FIELDS.items():
        src = g.cols.get(col)
        if src is not None:
            vals[name] = [None if v is None else float(v) * scale for v in src]
    return Recorded(g.info.uuid, g.info.gpu_index, t, job, vals)


@dataclass
class Variant:
    """One exported GPU: the recording under a host name and UUID, possibly altered."""

    rec: Recorded
    host: str = HOST
    uuid_suffix: str = ""
    drop: tuple[str, ...] = ()  # fields this exporter does not export
    keep: Callable[[int], bool] = lambda i: True  # scrapes that happened (False: a missed scrape)

    @property
    def uuid(self) -> str:
        return self.rec.uuid + self.uuid_suffix


def openmetrics(variants: list[Variant]) -> str:
    """OpenMetrics text (families contiguous, each series in time order, ``# EOF``)."""
    out: list[str] = []
    for name in FIELDS:
        fam: list[str] = []
        for v in variants:
            vals = v.rec.values.get(name)
            if vals is None or name in v.drop:
                continue
            series: dict[str, list[str]] = {}
            for i, (t, x) in enumerate(zip(v.rec.t, vals, strict=True)):
                if x is None or not v.keep(i):
                    continue
                job = v.rec.job[i]
                lab = (f'gpu="{v.rec.index}",UUID="{v.uuid}",Hostname="{v.host}",modelName="NVIDIA H200"'
                       + (f',hpc_job="{job}"' if job else ""))
                series.setdefault(lab, []).append(f"{name}{{{lab}}} {x!r} {t:.3f}")
            for lines in series.values():
                fam += lines
        if fam:
            out += [f"# TYPE {name} gauge", *fam]
    out.append("# EOF")
    return "\n".join(out) + "\n"


def have_prometheus() -> bool:
    return bool(shutil.which("prometheus") and shutil.which("promtool"))


def backfill(text: str, tsdb: Path) -> None:
    src = tsdb.parent / "samples.om"
    src.write_text(text)
    tsdb.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(src), str(tsdb)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@contextlib.contextmanager
def prometheus(tsdb: Path, scrape: str | None = None, interval_s: float = 1.0) -> Iterator[str]:
    """Run Prometheus on ``tsdb`` (127.0.0.1, a free port); with ``scrape`` (host:port) it scrapes
    that target every ``interval_s``. Yields the base URL."""
    port = free_port()
    cfg = tsdb.parent / f"prometheus-{port}.yml"
    lines = [f"global:\n  scrape_interval: {interval_s:g}s\n  evaluation_interval: {interval_s:g}s"]
    if scrape:
        lines.append(f"scrape_configs:\n  - job_name: wattclass\n    static_configs:\n"
                     f"      - targets: ['{scrape}']")
    cfg.write_text("\n".join(lines) + "\n")
    log = (tsdb.parent / f"prometheus-{port}.log").open("w")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tsdb}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                tail = (tsdb.parent / f"prometheus-{port}.log").read_text()[-2000:]
                raise RuntimeError(f"prometheus exited: {tail}")
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready in 60 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
