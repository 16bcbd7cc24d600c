"""Runs workloads one after another with the sampler labelling each poll; the entry point."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
import traceback
import warnings
from dataclasses import replace
from typing import Any

from h200_collect.catalog import print_table, select, workloads
from h200_collect.config import FLUSH_EVERY_S, USERS, Config
from h200_collect.context import Ctx, Job, Workload
from h200_collect.output import _atomic_bytes, write_runs, write_samples
from h200_collect.sampler import Sampler, read_caps


class Runner:
    def __init__(self, cfg: Config, torch: Any, nvml: Any, handle: Any, sampler: Sampler | None,
                 t_start: float, index: dict[str, int] | None = None) -> None:
        self.cfg, self.torch, self.N, self.h, self.sampler = cfg, torch, nvml, handle, sampler
        self.t_start = t_start  # process start: the deadline counts torch import and CUDA init too
        self.ctx = Ctx(torch, cfg.device, cfg.smoke or cfg.device == "cpu", cfg.dur)
        self.runs: list[dict[str, Any]] = []
        self.prefix = os.path.join(cfg.out, cfg.tag)
        # job id = JOB_BASE + position in the table (or in the sweep plan): stable across PARTs
        self.index = index if index is not None else {w.name: i for i, w in enumerate(workloads())}
        uuid = nvml.nvmlDeviceGetUUID(handle) if nvml is not None else None
        self.uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        self._lock = threading.Lock()
        self._flusher_stop = threading.Event()

    def set_job(self, name: str) -> None:
        if self.sampler:
            self.sampler.job = name

    def energy_mj(self) -> int | None:
        return self.N.nvmlDeviceGetTotalEnergyConsumption(self.h) if self.N else None

    def flush(self) -> None:
        with self._lock:
            write_runs(f"{self.prefix}_runs.csv", self.runs)
            rows = list(self.sampler.rows) if self.sampler else []
            write_samples(f"{self.prefix}_samples_1hz.parquet", rows)

    def _flusher(self) -> None:
        while not self._flusher_stop.wait(FLUSH_EVERY_S):
            try:
                self.flush()
            except Exception:
                traceback.print_exc()

    def free(self) -> None:
        gc.collect()
        if self.ctx.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
            try:
                import cupy as cp
                cp.get_default_memory_pool().free_all_blocks()
            except Exception:
                pass
        self.torch.backends.cuda.matmul.allow_tf32 = False

    def job_identity(self, w: Workload) -> tuple[str, str]:
        """Slurm-like job id and user for a workload: stable across runs (JOB_BASE + table index)."""
        i = self.index[w.name]
        return str(self.cfg.job_base + i), USERS[i % len(USERS)]

    def write_spool(self, job_id: str | None, user: str | None) -> None:
        """Act as the Prolog/Epilog would: the GPU -> job file the telemetry daemon reads.

        Same format as wattclass.jobmap (kept standalone: this tool runs without wattclass).
        """
        if not self.cfg.spool or not self.uuid:
            return
        path = os.path.join(self.cfg.spool, f"{self.uuid}.json")
        if job_id is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        doc = {"version": 1, "job_id": job_id, "user": user, "uid": None, "written_at": time.time()}
        os.makedirs(self.cfg.spool, exist_ok=True)
        _atomic_bytes(path, (json.dumps(doc, sort_keys=True) + "\n").encode())

    def timed(self, w: Workload, job: Job) -> dict[str, Any]:
        c, dur = self.ctx, self.cfg.dur if self.cfg.smoke else (w.dur or self.cfg.dur)
        c.dur = dur
        c.sync()
        job_id, user = self.job_identity(w)
        self.write_spool(job_id, user)
        self.set_job(w.name)
        t0 = c.t0 = time.time()
        e0 = self.energy_mj()
        n = 0
        while time.time() - t0 < dur:
            job.step()
            n += 1
            c.sync()
        t1 = time.time()
        e1 = self.energy_mj()
        self.set_job("gap")
        self.write_spool(None, None)
        energy = (e1 - e0) / 1e3 if e0 is not None and e1 is not None else None
        return {"job": w.name, "label": w.label, "start": t0, "end": t1, "steps": n,
                "rate": n * job.work / (t1 - t0) if job.work else None, "unit": job.unit,
                "energy_j": energy, "avg_power_w": energy / (t1 - t0) if energy is not None else None,
                "job_id": job_id, "user": user, "family": w.family,
                "params": json.dumps(w.params, sort_keys=True) if w.params else ""}

    def run_one(self, w: Workload) -> bool:
        t_gap = time.time()
        job: Job | None = None
        try:
            job = w.build(self.ctx)
            self.ctx.t0 = time.time()
            job.step()  # warm-up: kernels selected, plans made, allocator primed
            self.ctx.sync()
            setup = time.time() - t_gap
            time.sleep(max(0.0, self.cfg.gap - setup))
            run = self.timed(w, job)
        except Exception:
            self.set_job("gap")
            if self.sampler:  # the job failed: its samples are no job's
                for r in self.sampler.rows:
                    if r["job"] == w.name:
                        r["job"] = "gap"
            traceback.print_exc()
            print(f"FAIL {w.name}", flush=True)
            return False
        finally:
            job = None
            self.free()
        with self._lock:
            self.runs.append(run)
        rate = f"{run['rate'] / 1e12:9.3f} T{run['unit']}/s" if run["rate"] else " " * 14
        pw = f"{run['avg_power_w']:5.0f} W" if run["avg_power_w"] is not None else "    - W"
        print(f"OK   {w.name:34s} {w.label:8s} setup={setup:5.2f}s steps={run['steps']:6d} {rate} {pw}",
              flush=True)
        self.flush()
        return True

    def run(self, ws: list[Workload]) -> int:
        start = self.t_start
        fl = threading.Thread(target=self._flusher, daemon=True)
        fl.start()
        ok, failed, skipped = 0, [], []
        for w in ws:
            elapsed = time.time() - start
            dur = (w.dur or self.cfg.dur) if not self.cfg.smoke else self.cfg.dur
            if self.cfg.deadline and elapsed + dur + self.cfg.gap + 3 > self.cfg.deadline:
                skipped.append(w.name)
                continue
            if self.run_one(w):
                ok += 1
            else:
                failed.append(w.name)
        time.sleep(min(2.0, self.cfg.gap))  # a little idle tail after the last job
        self._flusher_stop.set()
        fl.join()
        if self.sampler:
            self.sampler.stop()
        self.flush()
        print(f"done: {ok} ok, {len(failed)} failed, {len(skipped)} skipped in {time.time() - start:.0f} s; "
              f"files {self.prefix}_*", flush=True)
        if failed:
            print("FAILED: " + ",".join(failed), flush=True)
        if skipped:
            print("SKIPPED (deadline); rerun with ONLY=" + ",".join(skipped), flush=True)
        if self.sampler and self.sampler.rows:
            rows = self.sampler.rows
            med = sorted(r["nvml_basic_us"] for r in rows)[len(rows) // 2]
            gmed = sorted(r["nvml_gpm_us"] for r in rows)[len(rows) // 2]
            print(f"samples {len(rows)} nvml_basic_us median {med:.0f} gpm_us median {gmed:.0f}")
        return 0 if not failed else 1


def main(env: dict[str, str]) -> int:
    t_start = time.time()
    cfg = Config.from_env(env)
    all_w = workloads()
    index: dict[str, int] | None = None
    if cfg.sweep:
        from h200_collect.workloads.sweep import plan

        ws = plan(cfg.seed, cfg.sweep, cfg.families)
        index = {w.name: i for i, w in enumerate(ws)}  # job ids stay the plan's, also under ONLY
        ws = select(ws, replace(cfg, part=None))
        if cfg.run_dur is not None:
            ws = [replace(w, dur=cfg.run_dur) for w in ws]
        if cfg.list_only:
            for w in ws:
                print(f"{index[w.name]:5d} {w.label:8s} {w.family:12s} {w.name:28s} {w.dur or cfg.dur:5.1f}s "
                      f"{w.desc}")
            return 0
    elif cfg.list_only:
        print_table(all_w, cfg)
        return 0
    else:
        ws = select(all_w, cfg)
    warnings.filterwarnings("ignore")
    os.makedirs(cfg.out, exist_ok=True)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    nvml: Any = None
    handle: Any = None
    sampler: Sampler | None = None
    if cfg.device.startswith("cuda"):
        import pynvml as nvml

        nvml.nvmlInit()
        handle = nvml_handle(nvml, torch, cfg.gpu)
        caps = read_caps(nvml, handle)
        _atomic_bytes(f"{cfg.out}/{cfg.tag}_caps.json", json.dumps(caps, indent=1, default=str).encode())
        print(json.dumps(caps, default=str), flush=True)
        sampler = Sampler(nvml, handle, caps.get("gpm_supported") == 1)
        sampler.start()
        torch.zeros(1, device=cfg.device)  # CUDA context during `startup`, not in the first job
        time.sleep(3)
    print(f"{len(ws)} workloads, DUR={cfg.dur:g} GAP={cfg.gap:g} device={cfg.device} tag={cfg.tag}",
          flush=True)
    return Runner(cfg, torch, nvml, handle, sampler, t_start, index).run(ws)


def nvml_handle(nvml: Any, torch: Any, gpu: int) -> Any:
    """The NVML handle of the GPU torch computes on (CUDA_VISIBLE_DEVICES renumbers CUDA, not NVML).

    Matched by UUID (CUDA reports it without NVML's ``GPU-`` prefix); NVML index ``gpu`` if not found.
    """
    try:
        want = str(torch.cuda.get_device_properties(0).uuid).lower().removeprefix("gpu-")
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            u = nvml.nvmlDeviceGetUUID(h)
            u = (u.decode() if isinstance(u, bytes) else u).lower().removeprefix("gpu-")
            if u == want:
                return h
        print(f"no NVML device has CUDA device 0's UUID {want}; using NVML index {gpu}", flush=True)
    except Exception as e:
        print(f"UUID match failed ({e}); using NVML index {gpu}", flush=True)
    return nvml.nvmlDeviceGetHandleByIndex(gpu)

