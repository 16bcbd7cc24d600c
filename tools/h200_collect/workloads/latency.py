"""Latency-bound memory work as a randomised training sweep (issue 13, round 4's data plan).

Why: the GPM-less model's misses on unseen work were memory-bound jobs that never come near HBM
bandwidth -- 3-D convolutions, sparse SpMM, GNN gathers. By GPM their DRAM activity (9-24%) beats
every pipe's (1-15%), so the roofline rule calls them memory-bound, but NVML shows them at full
clock, mid power and low memory-controller activity, like unthrottled compute. The earlier sweeps
reach that corner only by accident. This family spans it on purpose, by mechanism:

* ``latency_chase``  a CuPy kernel in which each thread follows a chain of ``hops`` random nodes
                     (``dependent``: the next index is loaded, so every hop waits a full memory
                     latency; otherwise it is hashed, so loads overlap), reads ``width`` floats per
                     node (4 B scattered reads up to 128 B rows), and runs ``iters`` FMAs per node
                     (0: pure latency; up to 256: across the ridge to compute). The working set
                     (8 MiB-8 GiB, so in L2 or in HBM) and the number of threads in flight (1 to
                     16 blocks per SM of 32-256 threads: occupancy) are drawn too. ``hops`` is an
                     upper bound: a shape whose launch would outlast half a step runs shorter
                     chains (runs.csv keeps the drawn value). The FLOP rate in runs.csv is
                     informational (the row adds count as FLOPs); labels come from GPM.

As everywhere, the GPM rule on the device decides each run's truth, whatever the family intended.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.workloads.sizing import STEP_S, calibrated_reps, loguniform

CHASE_SRC = r"""
extern "C" __global__ void chase(const int* __restrict__ nxt, const float* __restrict__ x,
                                 float* __restrict__ y, long long n, int width, int hops, int iters,
                                 int dependent, long long salt) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long j = (tid * 2654435761LL + salt) % n;
    float acc = 0.0f;
    for (int h = 0; h < hops; ++h) {
        const float* row = x + j * width;
        float v = 0.0f;
        for (int w = 0; w < width; ++w) v += row[w];
        for (int r = 0; r < iters; ++r) v = fmaf(v, 0.9999f, 0.0001f);
        acc += v;
        j = dependent ? (long long)nxt[j] : (j * 1103515245LL + 12345LL + h) % n;
    }
    y[tid] = acc;
}
"""
SMS = 132


def p_chase(rng: random.Random) -> dict[str, Any]:
    return {"ws_mib": round(loguniform(rng, 8, 8192)), "width": rng.choice([1, 1, 2, 4, 8, 16, 32]),
            "iters": 0 if rng.random() < 0.4 else round(loguniform(rng, 1, 256)),
            "dependent": rng.random() < 0.7, "blocks_per_sm": rng.choice([1, 2, 4, 8, 16]),
            "threads": rng.choice([32, 64, 128, 256]), "hops": rng.choice([16, 64, 256])}


def chase_intended(p: dict[str, Any]) -> str:
    return "compute" if int(p["iters"]) >= 64 else "memory"


def b_chase(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        width, iters, hops = int(p["width"]), int(p["iters"]), int(p["hops"])
        ws = (int(p["ws_mib"]) << 20) if not c.small else 1 << 16
        n = max(1024, min(2**31 - 1, ws // (4 + 4 * width)))
        if not c.cuda:  # CPU check: the same chase in torch, tiny
            nxt = t.randperm(n)
            x = t.rand(n, width)

            def ref() -> None:
                j = t.arange(min(n, 256)) % n
                for _ in range(min(hops, 8)):
                    v = x[j].sum(1)
                    for _ in range(min(iters, 4)):
                        v = v * 0.9999 + 0.0001
                    j = nxt[j]
            return Job(ref, 0.0, "-", [nxt, x])
        import cupy as cp

        kern = cp.RawKernel(CHASE_SRC, "chase")
        nxt = cp.random.permutation(n).astype(cp.int32)
        x = cp.random.random(n * width, dtype=cp.float32)
        blocks, threads = SMS * int(p["blocks_per_sm"]), int(p["threads"])
        y = cp.empty(blocks * threads, dtype=cp.float32)
        st = {"salt": 0, "hops": min(hops, 8)}

        def launch() -> None:
            kern((blocks,), (threads,), (nxt, x, y, cp.int64(n), cp.int32(width), cp.int32(st["hops"]),
                                         cp.int32(iters), cp.int32(bool(p["dependent"])),
                                         cp.int64(st["salt"])))
            st["salt"] += 7919

        # one launch should stay well under a step: shorten the chains of slow shapes
        probe = calibrated_reps(c, launch, cap=1 << 20)
        per_hop_s = STEP_S / probe / st["hops"]
        st["hops"] = max(1, min(hops, math.floor(0.5 * STEP_S / max(per_hop_s, 1e-9))))
        reps = calibrated_reps(c, launch)
        flop = 2.0 * blocks * threads * st["hops"] * (iters + width)

        def step() -> None:
            for _ in range(reps):
                launch()
        return Job(step, reps * flop, "FLOP", [nxt, x, y, kern])
    return build


#: family -> (parameter sampler, builder factory): training families, drawn only when FAMILIES names them
LATENCY_TRAIN: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                               Callable[[dict[str, Any]], Callable[[Ctx], Job]]]] = {
    "latency_chase": (p_chase, b_chase),
}
