"""Shared GPUs and MIG: the job map holds several jobs per GPU, the daemon splits each window's
energy among them exactly, MIG instances get their parent's energy by slices and activity.

The hardware boundary is the file-state backend (processes, per-process utilisation and MIG
instances live in its JSON file) with a virtual clock and an energy counter added here.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from wattclass.gpu.base import GpuSample, ProcessUtil
from wattclass.gpu.filestate import FileStateBackend
from wattclass.jobmap import (
    JobAssignment,
    JobMapReader,
    jobs_on_gpu,
    legacy_path,
    remove_job_file,
    write_job_file,
)
from wattclass.telemetry.daemon import Daemon, DaemonConfig
from wattclass.telemetry.sharing import mig_shares, split_mj, split_shares

T0 = 1_796_000_000.0
POWER_W = 500.0


class ClockedFileState(FileStateBackend):
    """File-state GPUs with a virtual clock and an energy counter rising at POWER_W."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.t = T0

    def now(self) -> float:
        return self.t

    def sample(self, index: int) -> GpuSample:
        return super().sample(index)._replace(ts=self.t, power_w=POWER_W)

    def energy_mj(self, index: int) -> int | None:
        return round((self.t - T0) * POWER_W * 1000) + 123_456

    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtil]:
        now_us = int(self.t * 1e6)
        return [s._replace(ts_us=now_us) for s in super().process_utilization(index, 0)] \
            if now_us > since_us else []


def _spool(tmp_path: Path) -> Path:
    spool = tmp_path / "jobs"
    spool.mkdir(mode=0o755)
    os.chmod(spool, 0o755)
    return spool


def _run(backend: ClockedFileState, spool: Path, root: Path, seconds: int, at: dict[int, object]
         ) -> pd.DataFrame:
    """Poll once a second for ``seconds``; ``at[k]()`` runs before the poll at second k."""
    d = Daemon(backend, DaemonConfig(data_root=root, host="n1", job_spool=spool))
    d.prepare()
    for k in range(seconds + 1):
        backend.t = T0 + k
        if k in at:
            at[k]()  # type: ignore[operator]
        d.record(d.poll_once())
    d.shutdown()
    return pd.concat([pd.read_parquet(f) for f in sorted((root / "telemetry").rglob("*.parquet"))])


# -- the job map -------------------------------------------------------------------------------
def test_job_map_holds_several_jobs_per_gpu_and_reads_the_old_layout(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    uuid = "GPU-aaaa"
    write_job_file(spool, uuid, JobAssignment("7", "alice", 1000))
    write_job_file(spool, uuid, JobAssignment("8_2", "bob", 1001))
    # A job started by the previous Prolog version: one file per GPU.
    legacy_path(spool, uuid).write_text(json.dumps({"version": 1, "job_id": "5", "user": "eve"}))
    reader = JobMapReader(spool)
    assert [j.job_id for j in reader.jobs(uuid)] == ["5", "7", "8_2"]
    assert reader.jobs("GPU-none") == []
    # The second job's Epilog removes only its own file; the neighbour keeps its mapping.
    assert remove_job_file(spool, uuid, "8_2")
    assert not remove_job_file(spool, uuid, "8_2")  # Epilogs may rerun
    assert [j.job_id for j in reader.jobs(uuid)] == ["5", "7"]
    assert remove_job_file(spool, uuid, "5")  # the legacy file naming the job goes too
    assert not legacy_path(spool, uuid).exists()
    assert [(j.job_id, j.user, j.uid) for j in jobs_on_gpu(spool, uuid)] == [("7", "alice", 1000)]


def test_job_map_skips_a_bad_file_and_keeps_the_others(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    spool = _spool(tmp_path)
    write_job_file(spool, "GPU-b", JobAssignment("7", "alice", 1000))
    (spool / "GPU-b" / "9.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert [j.job_id for j in jobs_on_gpu(spool, "GPU-b")] == ["7"]
    assert "9.json" in caplog.text
    with pytest.raises(Exception, match="invalid job id"):
        write_job_file(spool, "GPU-b", JobAssignment("../x", None, None))


# -- the model ---------------------------------------------------------------------------------
def test_split_is_exact_and_follows_utilisation_above_the_static_share() -> None:
    s = split_shares(["a", "b"], {"a": 300.0, "b": 100.0}, {"a": 1.0, "b": 9.0}, energy_j=5000.0,
                     duration_s=10.0, idle_w=100.0)
    assert s.basis == "util"
    # static 1000 J split equally; dynamic 4000 J by SM utilisation 3:1
    assert s.ratios["a"] == pytest.approx((500 + 3000) / 5000)
    assert split_shares(["a", "b"], {}, {"a": 1.0, "b": 3.0}, 5000.0, 10.0, 100.0).basis == "memory"
    eq = split_shares(["a", "b"], {}, {}, 5000.0, 10.0, 100.0)
    assert eq.basis == "equal" and eq.ratios == {"a": 0.5, "b": 0.5}
    parts = split_mj(1_000_001, {"x": 1 / 3, "y": 1 / 3, "z": 1 / 3})
    assert sum(parts.values()) == 1_000_001 and max(parts.values()) - min(parts.values()) == 1


def test_mig_split_static_by_slices_dynamic_by_activity() -> None:
    s = mig_shares({"m1": 3, "m2": 2}, {"m1": 80.0, "m2": 20.0}, 7, energy_j=7000.0, duration_s=10.0,
                   idle_w=140.0)
    static, dyn = 1400.0, 5600.0
    assert s.ratios["m1"] == pytest.approx((static * 3 / 7 + dyn * 240 / 280) / 7000)
    assert s.ratios["m2"] == pytest.approx((static * 2 / 7 + dyn * 40 / 280) / 7000)
    assert s.ratios[""] == pytest.approx(static * 2 / 7 / 7000)  # unused slices: unattributed
    assert sum(s.ratios.values()) == pytest.approx(1.0)


# -- the daemon --------------------------------------------------------------------------------
def test_daemon_splits_a_shared_gpu_per_job_and_exactly(tmp_path: Path) -> None:
    be = ClockedFileState.create(tmp_path / "gpus.json", n=1)
    assert isinstance(be, ClockedFileState)
    spool = _spool(tmp_path)
    uuid = be.gpus()[0].uuid
    procs = [{"pid": 11, "job_id": "7", "user": "alice", "used_mib": 1000, "sm_util_pct": 75.0}]

    def start_first() -> None:
        write_job_file(spool, uuid, JobAssignment("7", "alice", 1000))
        be.update_gpu(0, processes=procs)

    def start_second() -> None:
        write_job_file(spool, uuid, JobAssignment("8", "bob", 1001))
        be.update_gpu(0, processes=[*procs, {"pid": 12, "job_id": "8", "user": "bob", "used_mib": 8000,
                                             "sm_util_pct": 25.0}])

    t = _run(be, spool, tmp_path / "d", 40, {0: start_first, 10: start_second})
    assert t.energy_j.sum() == pytest.approx(40 * POWER_W, abs=1e-6)  # nothing lost or doubled
    assert set(t.job_id) == {"7", "8"}  # no composite key leaks out
    sole = t[t.ts_start < pd.Timestamp(T0 + 10, unit="s", tz="UTC")]
    assert (sole.job_id == "7").all() and (sole.share_ratio == 1.0).all() and sole.share_basis.isna().all()
    shared = t[t.shared_jobs == 2]
    for _, w in shared.groupby("ts_start"):
        assert len(w) == 2 and (w.share_basis == "util").all()
        dur = (w.ts_end.iloc[0] - w.ts_start.iloc[0]).total_seconds()
        assert w.energy_j.sum() == pytest.approx(POWER_W * dur, abs=1e-9)  # the window's counter delta
        assert w.share_ratio.sum() == pytest.approx(1.0)
    full = shared[(shared.ts_end - shared.ts_start).dt.total_seconds() == 10]
    j7 = full[full.job_id == "7"].share_ratio
    # idle estimate: min(lowest window power 500 W, 25% of the 700 W limit) = 175 W
    assert j7.to_numpy() == pytest.approx((175 / 2 + 325 * 0.75) / 500, rel=1e-4)
    assert (full[full.job_id == "8"].user == "bob").all()


def test_daemon_splits_a_mig_gpu_by_instance(tmp_path: Path) -> None:
    ClockedFileState.create(tmp_path / "gpus.json", n=2, mig={0: [3, 2]})
    be = ClockedFileState(tmp_path / "gpus.json")
    spool = _spool(tmp_path)
    inst = be.mig_instances(0)
    parent = be.gpus()[0].uuid
    assert [(m.slices, m.parent_uuid) for m in inst] == [(3, parent), (2, parent)]
    assert be.find_mig(inst[1].uuid) == inst[1]
    mig = json.loads((tmp_path / "gpus.json").read_text())["gpus"][0]["mig"]
    mig["instances"][0]["sm_util_pct"] = 80.0
    mig["instances"][1]["sm_util_pct"] = 20.0
    be.update_gpu(0, mig=mig)
    write_job_file(spool, inst[0].uuid, JobAssignment("21", "ana", 1002))
    write_job_file(spool, inst[1].uuid, JobAssignment("22", "ben", 1003))
    t = _run(be, spool, tmp_path / "d", 30, {})
    g0 = t[t.gpu_index == 0]
    assert g0.energy_j.sum() == pytest.approx(30 * POWER_W, abs=1e-6)
    full = g0[(g0.ts_end - g0.ts_start).dt.total_seconds() == 10]
    a = full[full.job_id == "21"]
    assert (a.gpu_uuid == inst[0].uuid).all() and (a.parent_gpu_uuid == parent).all()
    assert (a.share_basis == "mig").all()
    assert a.sm_util_pct.to_numpy() == pytest.approx(80.0)  # the instance's own GPM, for its label
    static, dyn = 175.0 * 10, (POWER_W - 175.0) * 10
    assert a.energy_j.to_numpy()[-1] == pytest.approx(static * 3 / 7 + dyn * 240 / 280, abs=0.01)
    unused = full[full.job_id.isna()]
    assert unused.energy_j.to_numpy()[-1] == pytest.approx(static * 2 / 7, abs=0.01)
    # GPU 1 (no MIG, no job) is untouched by the split
    assert t[t.gpu_index == 1].share_basis.isna().all()


# -- the NVML backend, against a stand-in for pynvml (the hardware boundary) -------------------
def _mig_nvml() -> object:
    from tests.test_telemetry_units import FakeNvml

    class MigNvml(FakeNvml):
        """One H200 in MIG mode: a 3-slice instance (GI 1) and a 2-slice one (GI 5), slot 1 empty."""

        def __init__(self) -> None:
            super().__init__()
            self.gpm_mig_calls: list[tuple[str, int]] = []
            self.putil_since: list[int] = []

        def nvmlGpmQueryDeviceSupport(self, h: str) -> object:
            return type("S", (), {"isSupportedDevice": 1})()

        def nvmlDeviceGetMigMode(self, h: str) -> tuple[int, int]:
            return (1, 1)

        def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
            return 3

        def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, k: int) -> str:
            if k == 1:
                raise self.NVMLError(6)  # NOT_FOUND: an empty slot
            return f"{h}/mig{k}"

        def nvmlDeviceGetAttributes(self, h: str) -> object:
            slices = {"h0": 7, "h0/mig0": 3, "h0/mig2": 2}[h]
            return type("A", (), {"gpuInstanceSliceCount": slices})()

        def nvmlDeviceGetGpuInstanceId(self, h: str) -> int:
            return {"h0/mig0": 1, "h0/mig2": 5}[h]

        def nvmlDeviceGetUUID(self, h: str) -> str:
            return "GPU-fake" if h == "h0" else f"MIG-{h[-4:]}"

        def nvmlGpmSampleAlloc(self) -> list[Any]:
            return []

        def nvmlGpmMigSampleGet(self, h: str, gi: int, buf: list[Any]) -> list[Any]:
            self.gpm_mig_calls.append((h, gi))
            buf[:] = [gi]
            return buf

        def nvmlDeviceGetProcessesUtilizationInfo(self, h: str, since: int) -> list[Any]:
            self.putil_since.append(since)
            if since >= 2000:
                raise self.NVMLError(6)  # NOT_FOUND: no sample since
            return [type("S", (), {"pid": 11, "timeStamp": 2000, "smUtil": 70, "memUtil": 30})()]

        def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
            return [type("P", (), {"pid": 11, "usedGpuMemory": 3 * 2**30})()]

    return MigNvml()


def test_nvml_backend_reads_mig_instances_and_per_process_utilisation() -> None:
    from wattclass.gpu.nvml import NvmlBackend

    nv: Any = _mig_nvml()
    b = NvmlBackend(nvml_module=nv)
    inst = b.mig_instances(0)
    assert [(m.uuid, m.gpu_instance_id, m.slices, m.total_slices, m.parent_uuid) for m in inst] == [
        ("MIG-mig0", 1, 3, 7, "GPU-fake"), ("MIG-mig2", 5, 2, 7, "GPU-fake")]
    assert b.gpm_mig_snapshot(0, 5) == [5] and nv.gpm_mig_calls == [("h0", 5)]
    assert [tuple(s) for s in b.process_utilization(0, 0)] == [(11, 2000, 70.0, 30.0)]
    assert b.process_utilization(0, 2000) == []  # NOT_FOUND is "nothing new", not an error
    assert [(p.pid, p.used_mib) for p in b.processes(0)] == [(11, 3072.0)]


# -- labels ------------------------------------------------------------------------------------
def test_label_of_a_shared_gpu_job_says_so_with_lower_confidence_unless_mig_gpm(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wattclass.classifier.engine import label_files_local
    from wattclass.schema import conform

    rows = []
    for job, shared, basis in (("1", 1, None), ("2", 2, "util"), ("3", 2, "mig")):
        for k in range(6):
            rows.append({
                "ts_start": pd.Timestamp(T0 + 10 * k, unit="s", tz="UTC"),
                "ts_end": pd.Timestamp(T0 + 10 * k + 10, unit="s", tz="UTC"),
                "host": "n1", "gpu_index": 0, "gpu_uuid": "GPU-x", "job_id": job, "user": "u",
                "energy_j": 5000.0, "sm_util_pct": 90.0, "tensor_util_pct": 80.0, "dram_bw_util_pct": 10.0,
                "shared_jobs": shared, "share_basis": basis, "share_ratio": 1.0 / shared,
            })
    f = tmp_path / "t.parquet"
    pq.write_table(conform(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False)), f)
    lab = label_files_local([f], None, "rule").labels.set_index("job_id")
    assert (lab.label == "compute").all()
    assert lab.loc["1", "source"] == "rule" and lab.loc["3", "source"] == "rule"  # MIG: own GPM
    assert lab.loc["2", "source"] == "rule+shared"
    assert lab.loc["2", "confidence"] == pytest.approx(lab.loc["1", "confidence"] * 0.5, abs=1e-4)
    assert lab.loc["3", "confidence"] == lab.loc["1", "confidence"]


# -- caps: per physical GPU, the highest cap wins, restored when the last job leaves -----------
MEM60 = "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"
MIX85 = "wattclass:label=mixed;conf=0.93;cap=85%;src=rule;mode=enforce"


def _hooks(tmp_path: Path, be: FileStateBackend, gmap: dict[str, str]):  # type: ignore[no-untyped-def]
    from wattclass.plugin.prolog import epilog, prolog

    decisions: dict[str, str | None] = {}

    def start(job: str, gpus: str, decision: str | None) -> list[dict[str, Any]]:
        decisions[job] = decision
        env = {"SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus, "SLURM_JOB_USER": "u"}
        return prolog(env, be, lambda j: decisions[j], gmap, tmp_path / "jobs", tmp_path / "caps")

    def end(job: str) -> list[str]:
        return epilog({"SLURM_JOB_ID": job}, be, tmp_path / "jobs", tmp_path / "caps")

    return start, end


def test_two_jobs_on_one_gpu_highest_cap_wins_and_last_one_restores(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 2)
    start, end = _hooks(tmp_path, be, {"0": be.gpus()[0].uuid, "1": be.gpus()[1].uuid})
    start("41", "0", MEM60)
    assert be.power_limit_w(0) == 420.0
    plan = start("42", "0", MIX85)  # a shard of the same GPU
    assert plan[0]["effective_w"] == 595.0 and plan[0]["jobs"] == ["41", "42"]
    assert be.power_limit_w(0) == 595.0  # 42 never runs under less than its own 85%
    assert end("41") == []  # 42 still runs: not restored ...
    assert be.power_limit_w(0) == 595.0  # ... and 42's cap stays
    assert [j.job_id for j in jobs_on_gpu(tmp_path / "jobs", be.gpus()[0].uuid)] == ["42"]
    assert end("42") == [be.gpus()[0].uuid]
    assert be.power_limit_w(0) == 700.0 and be.power_limit_w(1) == 700.0
    # the other order: the less capped job leaves first, the remaining one's cap applies
    start("43", "0", MEM60)
    start("44", "0", MIX85)
    end("44")
    assert be.power_limit_w(0) == 420.0
    end("43")
    assert be.power_limit_w(0) == 700.0
    assert not list((tmp_path / "caps").glob("*.json"))


def test_an_uncapped_neighbour_is_never_capped(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 1)
    start, end = _hooks(tmp_path, be, {"0": be.gpus()[0].uuid})
    start("51", "0", None)  # no decision (new user, exempt account): uncapped, nothing recorded
    assert not (tmp_path / "caps").exists() or not list((tmp_path / "caps").glob("*.json"))
    start("52", "0", MEM60)  # finds 51 in the job map and keeps the GPU uncapped for it
    assert be.power_limit_w(0) == 700.0
    end("51")
    assert be.power_limit_w(0) == 420.0  # 52 alone now: its own cap
    start("53", "0", None)  # joins the record: lifts the cap while it runs
    assert be.power_limit_w(0) == 700.0
    end("53")
    assert be.power_limit_w(0) == 420.0
    end("52")
    assert be.power_limit_w(0) == 700.0


def test_mig_instances_cap_their_parent_gpu(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 2, mig={0: [3, 2, 2]})
    inst = be.mig_instances(0)
    gmap = {"0": inst[0].uuid, "1": inst[1].uuid, "2": inst[2].uuid, "3": be.gpus()[1].uuid}
    start, end = _hooks(tmp_path, be, gmap)
    plan = start("61", "0", MEM60)
    assert [(p["uuid"], p["effective_w"]) for p in plan] == [(be.gpus()[0].uuid, 420.0)]
    assert [j.job_id for j in jobs_on_gpu(tmp_path / "jobs", inst[0].uuid)] == ["61"]  # by instance
    start("62", "1,2", MIX85)  # two instances of the same parent: one cap entry
    assert be.power_limit_w(0) == 595.0 and be.power_limit_w(1) == 700.0
    end("62")
    assert be.power_limit_w(0) == 420.0
    assert end("61") == [be.gpus()[0].uuid]
    assert be.power_limit_w(0) == 700.0
    assert not list((tmp_path / "jobs").rglob("*.json"))


def test_a_record_from_before_shared_gpus_is_restored(tmp_path: Path) -> None:
    """Upgrade: a version 1 record (one job per GPU) written by the previous Prolog."""
    be = FileStateBackend.create(tmp_path / "g.json", 1)
    uuid = be.gpus()[0].uuid
    be.set_power_limit_w(0, 420.0)
    (tmp_path / "caps").mkdir()
    (tmp_path / "caps" / f"{uuid}.json").write_text(json.dumps(
        {"version": 1, "job_id": "70", "previous_w": 650.0, "set_w": 420.0}))
    start, end = _hooks(tmp_path, be, {"0": uuid})
    start("71", "0", MIX85)
    assert be.power_limit_w(0) == 595.0
    end("71")
    assert be.power_limit_w(0) == 420.0  # job 70 still holds it
    assert end("70") == [uuid] and be.power_limit_w(0) == 650.0


def test_a_process_claiming_a_neighbours_job_is_not_counted_for_it(tmp_path: Path) -> None:
    """A user sets SLURM_JOB_ID of the neighbour's job in their own process: the Prolog file says
    which uid the job has, so the process's utilisation does not move energy onto the neighbour."""
    from wattclass.gpu.base import GpuProcess
    from wattclass.telemetry.attribution import Attributor

    spool = _spool(tmp_path)
    proc = tmp_path / "proc" / "11"
    proc.mkdir(parents=True)
    me = os.getuid()
    import pwd

    name = pwd.getpwuid(me).pw_name.encode()
    # The process runs as its owner and names them (harden-tel's owner check passes); only the job
    # file's uid shows that job 7 is the neighbour's.
    (proc / "environ").write_bytes(b"SLURM_JOB_ID=7\0SLURM_JOB_USER=" + name + b"\0")
    write_job_file(spool, "GPU-n", JobAssignment("7", "victim", me + 1))
    write_job_file(spool, "GPU-n", JobAssignment("8", "me", me))
    att = Attributor(ClockedFileState.create(tmp_path / "g.json", 1), JobMapReader(spool), tmp_path / "proc")
    assert [j[0] for j in att.jobs_for_uuid("GPU-n")] == ["7", "8"]
    assert att.job_of_process(0, GpuProcess(11)) is None
    (proc / "environ").write_bytes(b"SLURM_JOB_ID=8\0SLURM_JOB_USER=" + name + b"\0")
    att.forget_pids(0, set())
    assert att.job_of_process(0, GpuProcess(11)) == ("8", name.decode())


@pytest.mark.parametrize("later", [
    "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=shadow;arm=control",  # canary control arm
    "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=shadow",  # shadow mode, no canary
    "wattclass:label=compute;conf=0.93;src=rule;mode=shadow"])  # shadow mode, no cap
def test_an_uncapped_shadow_job_joining_a_capped_canary_job_is_not_capped(tmp_path: Path, later: str) -> None:
    """docs/shared-gpus.md: a job without a cap (no decision, shadow mode, ...) holds the GPU at
    its previous limit. A shadow-mode canary job capped for real (arm=capped) makes the record;
    a shadow-mode job that is not capped for real and starts next on the same GPU ran under the
    canary's cap (found in review: it never joined the record), and in the canary comparison
    its arm=control windows were capped."""
    be = FileStateBackend.create(tmp_path / "g.json", 1)
    start, end = _hooks(tmp_path, be, {"0": be.gpus()[0].uuid})
    start("81", "0", MEM60.replace("mode=enforce", "mode=shadow;arm=capped"))
    assert be.power_limit_w(0) == 420.0
    start("82", "0", later)
    assert be.power_limit_w(0) == 700.0  # 82 is not capped for real: never under a cap
    end("82")
    assert be.power_limit_w(0) == 420.0
    end("81")
    assert be.power_limit_w(0) == 700.0


def test_without_a_gpu_map_mig_indices_are_not_taken_for_device_minors(tmp_path: Path) -> None:
    """With MIG, Slurm numbers the instances it hands out (SLURM_JOB_GPUS=1: the second instance,
    on GPU 0), not /dev/nvidia<N>: the default GPU map (minor numbers) capped GPU 1, another job's
    whole GPU, and left the job's own GPU uncapped (found in review). docs/slurm.md says MIG needs
    an explicit --gpu-map; without one the hooks now refuse to guess."""
    import argparse

    from wattclass.errors import ConfigError
    from wattclass.plugin.prolog import discover_gpu_map, run_hook

    be = FileStateBackend.create(tmp_path / "g.json", 2, mig={0: [3, 2, 2]})
    args = argparse.Namespace(backend=f"filestate:{tmp_path / 'g.json'}", gpu_map=None,
                              jobs_dir=tmp_path / "jobs", state_dir=tmp_path / "caps",
                              hpc_job_mapping_dir=None, slurm_timeout=1.0, slurm_bin=None, dry_run=True,
                              admin_comment=MEM60)
    env = {"SLURM_JOB_ID": "91", "SLURM_JOB_GPUS": "1", "SLURM_JOB_USER": "u"}
    assert run_hook("prolog", args, env) == 0  # fail-open: logged, the job runs
    args.dry_run = False
    args.admin_comment = None
    import wattclass.slurm.commands as commands

    orig = commands.CommandSlurmClient.admin_comment
    commands.CommandSlurmClient.admin_comment = lambda _self, _j: MEM60  # type: ignore[method-assign]
    try:
        assert run_hook("prolog", args, env) == 0
    finally:
        commands.CommandSlurmClient.admin_comment = orig  # type: ignore[method-assign]
    assert [be.power_limit_w(i) for i in range(2)] == [700.0, 700.0]  # GPU 1 is not the job's
    with pytest.raises(ConfigError, match="MIG"):
        discover_gpu_map(be)
