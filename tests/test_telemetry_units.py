"""Window builder, attribution, NVML error mapping and the Prometheus view, on small inputs."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from wattclass.errors import GpuInitError, GpuLostError
from wattclass.gpu.base import GpmMetrics, GpuBackend, GpuInfo, GpuProcess, GpuSample
from wattclass.jobmap import JobAssignment, JobMapReader, write_job_file
from wattclass.telemetry.attribution import Attributor, job_from_environ, parse_environ
from wattclass.telemetry.metrics import LatestWindows
from wattclass.telemetry.windows import WindowBuilder

INFO = GpuInfo(0, "GPU-t", "Test", "0000:01:00.0", 80000.0, 1980.0, 700.0, 200.0, 700.0, True)


def smp(ts: float, e: int | None, p: float = 500.0, reasons: int | None = 0x4) -> GpuSample:
    return GpuSample(ts, e, p, 700.0, 90.0, 40.0, 1800.0, 3200.0, reasons, 60.0, 1000.0)


def gpm_fn(a: object, b: object) -> GpmMetrics:
    return GpmMetrics(sm_util_pct=float(b) - float(a))  # type: ignore[arg-type]


def feed(b: WindowBuilder, polls: list[tuple[float, int | None, Any]]) -> list[dict]:
    rows: list[dict] = []
    for ts, e, job in polls:
        s = smp(ts, e)
        g = ts if b.needs_gpm(INFO, s, job) else None
        rows += b.add(INFO, s, job, g, gpm_fn)
    return rows + b.flush(INFO, polls[-1][0], gpm_fn)


def test_windows_telescope_and_close_at_the_boundary_poll() -> None:
    b = WindowBuilder("h", 10, 1)
    polls = [(100.3 + i, 1000 * i * 500, None) for i in range(35)]
    rows = feed(b, polls)
    assert sum(r["energy_j"] for r in rows) == pytest.approx(34 * 500)
    full = [r for r in rows if r["ts_end"] - r["ts_start"] == 10]
    assert [r["ts_start"] for r in full] == [110, 120]
    assert all(r["energy_j"] == pytest.approx(5000) for r in full)
    assert all(r["power_avg_w"] == pytest.approx(500) for r in full)
    assert full[0]["throttle_power_frac"] == 1.0 and full[0]["throttle_thermal_frac"] == 0.0
    assert full[0]["sm_util_pct"] == pytest.approx(10)  # GPM pair spans exactly one window


def test_job_change_splits_the_window() -> None:
    b = WindowBuilder("h", 10, 1)
    polls = [(100.5 + i, 1000 * i * 100, ("1", "a") if i < 14 else ("2", "b")) for i in range(25)]
    rows = feed(b, polls)
    w = [r for r in rows if r["ts_start"] >= 110 and r["ts_end"] <= 120]
    assert {r["job_id"] for r in w} == {"1", "2"}
    one = next(r for r in w if r["job_id"] == "1")
    two = next(r for r in w if r["job_id"] == "2")
    assert one["ts_end"] == two["ts_start"]
    assert one["energy_j"] + two["energy_j"] == pytest.approx(1000)


def test_job_change_gives_each_segment_its_own_gpm_span() -> None:
    """A boundary segment must not borrow the neighbour job's GPM (the GPM truth of short jobs)."""
    b = WindowBuilder("h", 10, 1)
    polls = [(100.5 + i, 1000 * i * 100, ("1", "a") if i < 14 else ("2", "b")) for i in range(25)]
    rows = feed(b, polls)
    w = {r["job_id"]: r for r in rows if r["ts_start"] >= 110 and r["ts_end"] <= 120}
    # gpm_fn reports the span length: job 1 from the window's GPM point (110.5) to the change
    # poll (114.5), job 2 from there to the closing poll (120.5).
    assert w["1"]["sm_util_pct"] == pytest.approx(4.0)
    assert w["2"]["sm_util_pct"] == pytest.approx(6.0)
    # a window without a job change keeps the window's whole span (100.5 -> 110.5)
    first = next(r for r in rows if r["ts_end"] == 110)
    assert first["job_id"] == "1" and first["sm_util_pct"] == pytest.approx(10.0)


def test_counter_reset_and_missing_energy() -> None:
    b = WindowBuilder("h", 10, 1)
    polls = [(100.5, 5_000_000, None), (101.5, 5_100_000, None), (102.5, 50, None), (103.5, 100_050, None)]
    rows = feed(b, polls)
    assert sum(r["energy_j"] for r in rows) == pytest.approx(200)
    b2 = WindowBuilder("h", 10, 1)
    rows2 = feed(b2, [(100.5, None, None), (101.5, None, None)])
    assert rows2[0]["energy_j"] is None and rows2[0]["power_avg_w"] is None


def test_long_gap_restarts_the_baseline() -> None:
    b = WindowBuilder("h", 10, 1, max_gap_s=60)
    rows = feed(
        b, [(100.5, 0, None), (101.5, 1000, None), (500.5, 10_000_000, None), (501.5, 10_001_000, None)]
    )
    assert sum(r["energy_j"] for r in rows) == pytest.approx(2)


def test_environ_parsing_and_array_jobs() -> None:
    env = parse_environ(
        b"PATH=/bin\0SLURM_JOB_ID=991\0SLURM_JOB_USER=ann\0SLURM_ARRAY_JOB_ID=990\0SLURM_ARRAY_TASK_ID=4\0"
    )
    assert job_from_environ(env) == ("990_4", "ann")
    assert job_from_environ(parse_environ(b"SLURM_JOB_ID=5\0")) == ("5", None)
    assert job_from_environ({}) is None


@pytest.mark.parametrize("job_id", ["12 34", "5\n6", "5\n", "5_4\n", "5+1\n", "../5", "*", "5_", "x" * 10_000,
                                    "9" * 65])
def test_a_process_claiming_what_is_no_job_id_is_ignored(job_id: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The environment is the process owner's to write: a job id that Slurm cannot have written
    (spaces, a newline, a path, a glob, 10,000 characters) is no job, logged clipped."""
    env = parse_environ(f"SLURM_JOB_ID={job_id}\0SLURM_JOB_USER=ann\0".encode())
    with caplog.at_level("WARNING", logger="wattclass"):
        assert job_from_environ(env) is None
    assert "not a Slurm job id" in caplog.text and len(caplog.text) < 400
    assert job_from_environ(parse_environ(b"SLURM_JOB_ID=123+1\0SLURM_JOB_USER=ann\0")) == ("123+1", "ann")


class ProcBackend(GpuBackend):
    """Hardware boundary: a GPU whose process list is given."""

    name = "procs"

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.calls = 0

    def gpus(self) -> list[GpuInfo]:
        return [INFO]

    def sample(self, index: int) -> GpuSample:
        return smp(0, 0)

    def processes(self, index: int) -> list[GpuProcess]:
        self.calls += 1
        return [GpuProcess(p) for p in self.pids]


def test_attribution_job_file_first_then_proc_environ(tmp_path: Path) -> None:
    import pwd

    proc = tmp_path / "proc"
    # the claim is trusted because the owner of proc/10 (this test's uid) is the job's user
    me = pwd.getpwuid(os.geteuid()).pw_name.encode()
    for pid, env in ((10, b"SLURM_JOB_ID=42\0SLURM_JOB_USER=" + me + b"\0"), (11, b"HOME=/root\0")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "environ").write_bytes(env)
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    os.chmod(spool, 0o755)
    backend = ProcBackend([10, 11, 12])
    att = Attributor(backend, JobMapReader(spool), proc_root=proc)
    assert att.job_for(INFO) == ("42", me.decode())
    assert backend.calls == 1
    write_job_file(spool, INFO.uuid, JobAssignment("7_3", "carol", 1001))
    assert att.job_for(INFO) == ("7_3", "carol")
    assert backend.calls == 1  # the process list is not asked for when the Prolog file exists
    backend.pids = [11]
    os.unlink(spool / INFO.uuid / "7_3.json")
    assert att.job_for(INFO) is None


# -- NVML error mapping, against a stand-in for the pynvml module (the hardware boundary) --------
class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_POWER_CURRENT_LIMIT = (
        83,
        186,
        190,
    )
    NVML_FI_DEV_POWER_AVERAGE = 185
    NVML_VALUE_TYPE_DOUBLE, NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG = 0, 1, 2
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_INT = 3, 4, 5
    NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"code {value}")
            self.value = value

    def __init__(self, init_fails: bool = False) -> None:
        self.init_fails = init_fails
        self.lost = False
        self.field_ids: list[int] = []  # every field id asked for
        self.energy_calls = 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise self.NVMLError(9)  # DRIVER_NOT_LOADED

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def _unsupported(self, *a: Any) -> Any:
        raise self.NVMLError(3)

    nvmlDeviceGetTemperature = nvmlGpmQueryDeviceSupport = nvmlDeviceGetCurrentClocksEventReasons = (
        _unsupported
    )
    nvmlDeviceGetPowerManagementLimitConstraints = nvmlDeviceGetPowerManagementDefaultLimit = _unsupported

    def nvmlDeviceGetFieldValues(self, h: str, ids: list[int]) -> list[Any]:
        if self.lost:
            raise self.NVMLError(15)
        self.field_ids += ids

        class V:
            uiVal = ullVal = 0

        out = []
        for fid in ids:
            v = V()
            v.ullVal = 123456
            v.uiVal = 250000 if fid != 185 else 240000
            fv = type(
                "FV",
                (),
                {"nvmlReturn": 0 if fid != 190 else 3, "valueType": 3 if fid == 83 else 1, "value": v},
            )()
            out.append(fv)
        return out

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 700000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        if self.lost:
            raise self.NVMLError(15)
        self.energy_calls += 1
        return 123456

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return type("U", (), {"gpu": 50, "memory": 20})()

    def nvmlDeviceGetClockInfo(self, h: str, c: int) -> int:
        return 1500

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return type("M", (), {"used": 2**30, "total": 80 * 2**30})()

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return "GPU-fake"

    def nvmlDeviceGetMinorNumber(self, h: str) -> int:
        return 3

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"Fake GPU"

    def nvmlDeviceGetPciInfo(self, h: str) -> Any:
        return type("P", (), {"busId": b"0000:01:00.0"})()

    def nvmlDeviceGetMaxClockInfo(self, h: str, c: int) -> int:
        return 1980


def test_nvml_unsupported_fields_are_none_and_lost_gpu_is_typed() -> None:
    from wattclass.gpu.nvml import NvmlBackend

    nv = FakeNvml()
    b = NvmlBackend(nvml_module=nv)
    info = b.gpus()[0]
    assert info.uuid == "GPU-fake" and info.model == "Fake GPU" and not info.gpm_supported
    assert info.power_limit_min_w is None
    s = b.sample(0)
    # The cheap poll never touches the energy counter (docs/benchmarks.md, "Per NVML call") ...
    assert s.energy_mj is None and s.power_w == 250.0
    assert nv.energy_calls == 0 and 83 not in nv.field_ids
    # The 1 s average power (what the energy split between job segments uses) comes in the same
    # FieldValues call as the instantaneous power: no extra NVML call.
    assert s.power_avg_w == 240.0 and nv.field_ids == [186, 190, 185]
    # ... which is read on its own, only when asked for.
    assert b.energy_mj(0) == 123456 and nv.energy_calls == 1
    assert s.power_limit_w == 700.0  # field rejected -> per-field fallback
    assert s.temp_c is None and s.clock_event_reasons is None
    assert s.util_gpu_pct == 50.0 and s.fb_used_mib == 1024.0
    assert b.gpm_snapshot(0) is None
    nv.lost = True
    with pytest.raises(GpuLostError, match="GPU 0"):
        b.sample(0)
    with pytest.raises(GpuLostError, match="GPU 0 energy_mj"):
        b.energy_mj(0)


class NanNvml(FakeNvml):
    """A driver that hands out doubles: NaN average power, infinite instant power on the first
    poll, finite ones after; GPM metrics NaN for one metric, infinite for another."""

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def nvmlDeviceGetFieldValues(self, h: str, ids: list[int]) -> list[Any]:
        self.polls += 1
        self.field_ids += ids
        first = {185: math.nan, 186: math.inf, 190: 700000.0}
        later = {185: 240000.0, 186: 250000.0, 190: 700000.0}
        vals = first if self.polls == 1 else later
        return [type("FV", (), {"nvmlReturn": 0, "valueType": self.NVML_VALUE_TYPE_DOUBLE,
                                "value": type("V", (), {"dVal": vals[fid]})()})() for fid in ids]

    NVML_GPM_METRICS_GET_VERSION = 1

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        metric = type("M", (), {"metricId": 0, "value": 0.0, "nvmlReturn": 0})
        return type("G", (), {"metrics": [metric() for _ in range(16)]})()

    def nvmlGpmMetricsGet(self, mg: Any) -> None:
        for i, m in enumerate(mg.metrics):
            m.value = (math.nan, math.inf, 42.0)[min(i, 2)]


def test_nvml_nonfinite_doubles_are_no_reading() -> None:
    """A NaN or infinite double from NVML (H200 run of 2026-11-30: a NaN crashed the daemon's
    stop) is None, like an unsupported field, and does not switch the power fields off."""
    from wattclass.gpu.nvml import GPM_METRIC_IDS, NvmlBackend

    nv = NanNvml()
    b = NvmlBackend(nvml_module=nv)
    s = b.sample(0)
    assert s.power_w is None and s.power_avg_w is None and s.power_limit_w == 700.0
    s = b.sample(0)  # the next poll still reads the fields (no fallback to the getters)
    assert s.power_w == 250.0 and s.power_avg_w == 240.0 and nv.field_ids.count(185) == 2
    m = b.gpm_metrics(0, object(), object())
    vals = [getattr(m, name) for name, _ in GPM_METRIC_IDS]
    assert vals[0] is None and vals[1] is None and vals[2:] == [42.0] * (len(vals) - 2)


def test_nvml_init_failure_is_one_clear_error() -> None:
    from wattclass.gpu.nvml import NvmlBackend

    with pytest.raises(GpuInitError, match="NVML cannot start"):
        NvmlBackend(nvml_module=FakeNvml(init_fails=True))


class LostAtStartNvml(FakeNvml):
    """Three GPUs; GPU 1 fell off the bus before the backend opened (Xid 79): NVML answers
    ``code`` for its handle."""

    def __init__(self, code: int = 15) -> None:
        super().__init__()
        self.code = code

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        if i == 1:
            raise self.NVMLError(self.code)
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return f"GPU-fake-{h}"

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return []


@pytest.mark.parametrize("code", [15, 10, 999])  # GPU_IS_LOST, TIMEOUT, UNKNOWN
def test_a_gpu_lost_at_start_up_leaves_the_others_polled(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, code: int) -> None:
    """Review finding: one GPU that did not answer while the backend opened made the whole
    backend fail (GpuLostError from discovery), so the daemon, Prolog and Epilog of a node with
    one dead GPU did nothing for the healthy ones (the daemon restarted every 5 s, forever). Now
    that GPU is left out with an ERROR and the others keep their NVML indices."""
    from wattclass.gpu.nvml import NvmlBackend
    from wattclass.telemetry.daemon import Daemon, DaemonConfig

    with caplog.at_level(logging.ERROR, logger="wattclass.gpu.nvml"):
        b = NvmlBackend(nvml_module=LostAtStartNvml(code))
    assert [(g.gpu_index, g.uuid) for g in b.gpus()] == [(0, "GPU-fake-h0"), (2, "GPU-fake-h2")]
    assert any("GPU 1: left out" in r.getMessage() for r in caplog.records)
    assert b.sample(2).power_w == 250.0 and b.energy_mj(2) == 123456
    assert b.sample(2).mono_s is not None  # the window builder tells clock steps by it
    for call in (b.sample, b.energy_mj, b.gpm_snapshot):
        with pytest.raises(GpuLostError, match="GPU 1"):
            call(1)  # type: ignore[operator]
    d = Daemon(b, DaemonConfig(data_root=tmp_path / "d", host="n1"))
    d.prepare()
    try:
        d.poll_once()
        assert [g.gpu_index for g in d.gpus] == [0, 2] and d.stats.gpu_errors == 0
        assert d.stats.energy_reads == 2  # both healthy GPUs polled (first poll: counter read)
    finally:
        d.shutdown()


def test_a_gpu_refusing_discovery_for_another_reason_is_still_an_error() -> None:
    """Only a lost GPU is left out: NO_PERMISSION at discovery (a misconfigured node) stays an
    error, not a node that silently polls fewer GPUs."""
    from wattclass.errors import GpuPermissionError
    from wattclass.gpu.nvml import NvmlBackend

    with pytest.raises(GpuPermissionError, match="NVML _discover"):
        NvmlBackend(nvml_module=LostAtStartNvml(4))


def test_metrics_latest_window_with_job_labels() -> None:
    col = LatestWindows()
    reg = CollectorRegistry()
    reg.register(col)
    base = {"gpu_index": 0, "gpu_uuid": "GPU-a", "host": "n1", "energy_j": 5000.0, "power_avg_w": 500.0}
    col.update([dict(base, ts_end=10.0, job_id="1", user="a")])
    col.update(
        [
            dict(base, ts_end=20.0, job_id="2", user="b", power_avg_w=300.0),
            dict(base, gpu_index=1, gpu_uuid="GPU-b", ts_end=20.0, job_id=None, user=None),
        ]
    )
    text = generate_latest(reg).decode()
    assert 'wattclass_gpu_power_watts{gpu="0",host="n1",job_id="2",user="b",uuid="GPU-a"} 300.0' in text
    assert 'wattclass_gpu_power_watts{gpu="0",host="n1",job_id="1"' not in text  # only the latest window
    assert 'wattclass_gpu_power_watts{gpu="1",host="n1",job_id="",user="",uuid="GPU-b"} 500.0' in text


def test_window_spread_columns_are_the_population_std_of_the_polls() -> None:
    b = WindowBuilder("h", 10, 1)
    rows: list[dict] = []
    powers = [400.0, 600.0] * 10
    for i, p in enumerate(powers):
        s = GpuSample(100.5 + i, 1000 * i * 500, p, 700.0, 90.0, 40.0 + 10 * (i % 2), 1800.0, 3200.0,
                      0x4, 60.0, 1000.0)
        rows += b.add(INFO, s, ("1", "a"), None, gpm_fn)
    assert rows and rows[0]["job_id"] == "1"
    # alternating 400/600 W and 40/50 % over the window's polls (std 100 W and 5 %, +-2% for odd counts)
    assert rows[0]["power_std_w"] == pytest.approx(100.0, rel=0.02)
    assert rows[0]["util_mem_std_pct"] == pytest.approx(5.0, rel=0.02)
    assert rows[0]["sm_clock_std_mhz"] == pytest.approx(0.0)
    # one poll has no spread: null, not 0
    one = WindowBuilder("h", 10, 1)
    one.add(INFO, smp(100.5, 0), ("1", "a"), None, gpm_fn)
    last = one.flush(INFO, 100.9, gpm_fn)
    assert all(r["power_std_w"] is None for r in last)


# -- issue 9 item 4: a process's Slurm environment is trusted only from the job's user ----------------
class FakeNvmlWithProcesses(FakeNvml):
    """NVML's compute-process list (real pids) at the hardware boundary."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__()
        self.pids = pids

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [type("P", (), {"pid": pid, "usedGpuMemory": 2**30})() for pid in self.pids]


def _spawn_as(user: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``sleep`` running as ``user`` with exactly ``env`` (a forged Slurm environment)."""
    return subprocess.Popen(["setpriv", f"--reuid={user}", f"--regid={pwd.getpwnam(user).pw_gid}",
                             "--clear-groups", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                             "sleep", "30"])


def _wait_owner(pid: int, uid: int) -> None:
    deadline = time.time() + 10
    while time.time() < deadline:
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            if os.stat(f"/proc/{pid}").st_uid == uid and b"SLURM" in environ:
                return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never ran as uid {uid}")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="starting processes of another uid needs root and setpriv")
def test_forged_slurm_environment_of_another_user_is_not_trusted(caplog: pytest.LogCaptureFixture) -> None:
    from wattclass.gpu.nvml import NvmlBackend

    nobody = pwd.getpwnam("nobody")
    victim = pwd.getpwuid(0).pw_name  # a real user other than nobody
    forged = [_spawn_as("nobody", {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": victim}) for _ in range(3)]
    no_user = _spawn_as("nobody", {"SLURM_JOB_ID": "4243"})
    ghost = _spawn_as("nobody", {"SLURM_JOB_ID": "4244", "SLURM_JOB_USER": "no-such-user-xyz"})
    own = _spawn_as("nobody", {"SLURM_JOB_ID": "77", "SLURM_JOB_USER": "nobody"})
    procs = [*forged, no_user, ghost, own]
    try:
        for p in procs:
            _wait_owner(p.pid, nobody.pw_uid)
        nv = FakeNvmlWithProcesses([p.pid for p in (*forged, no_user, ghost)])
        backend = NvmlBackend(nvml_module=nv)
        info = backend.gpus()[0]
        att = Attributor(backend, None, Path("/proc"))
        with caplog.at_level(logging.WARNING):
            assert att.job_for(info) is None  # three claims of the victim's job: none booked
        assert "not trusted" in caplog.text and "4242" in caplog.text
        # nobody's own job, claimed by nobody's process, is trusted, even next to the forged ones
        nv.pids = [p.pid for p in procs]
        assert Attributor(backend, None, Path("/proc")).job_for(info) == ("77", "nobody")
    finally:
        for p in procs:
            p.kill()
            p.wait()
