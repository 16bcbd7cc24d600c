"""Round 11's test families (issue 13): kinds of work that no earlier set, training or test, holds.

Why: round 11's never-seen test set for the shipped model (with its evidence cap). Written before
any of it was recorded, recorded once and scored once; nothing is chosen on it. Each family is a
kind of work that none of the earlier modules (catalog's dense, hpc, nets, phases, starved; sweep,
fresh, latency, fresh4, fresh5, fresh6) builds -- their FFTs, sorts, SpMV/SpMM, histograms, scans,
normalisations, int8 GEMMs, kNN, GNN gathers, interpolation, RNNs and top-p sampling are all taken.
Sizes, dtypes and modes are drawn per run so that a family spans both sides of its ridge where it
has one. The GPM rule on the device decides each run's truth, whatever the family intended.

* ``ntt_modmul``         a number-theoretic transform (as in homomorphic encryption and
                         zero-knowledge provers): radix-2 butterflies in int64 modular arithmetic
                         over 1-32 RNS limbs of 2^12-2^22 coefficients, reduced by ``%`` (integer
                         division) or Barrett (fp64 quotient estimate), forward or a whole
                         polynomial product (two forward, pointwise, one inverse).
* ``ising_metropolis``   lattice Monte Carlo: checkerboard Metropolis sweeps of a 2-D or 3-D Ising
                         model (int8 spins, neighbour sums by shifts, 1-8 hits per site, acceptance
                         from a table) over lattices of 2^16-2^28 sites.
* ``md_neighbor``        short-range molecular dynamics: Lennard-Jones forces over 8-128 neighbours
                         per particle (a CuPy kernel), neighbours from a list (spatially sorted or
                         shuffled particles) or from a fixed lattice stencil (no list read), fp32 or
                         fp64, then a velocity-Verlet update.
* ``hash_join``          database operators: an open-addressing hash table (atomicCAS, linear
                         probing; a CuPy kernel) built from 2^14-2^25 keys at load factor 0.25-0.9,
                         probed by 2^22-2^28 keys of 1-100% selectivity, or used for a group-by
                         (a count per key by atomics); fewer build keys at high load, where one
                         build launch would pass ~50 ms (runs.csv keeps the drawn values).
* ``tree_ensemble``      gradient-boosted tree inference (as in XGBoost/FIL predict; a CuPy kernel):
                         16-2048 complete trees of depth 3-12 over 16-1024 features, samples row- or
                         feature-major: data-dependent walks through models of 4 KiB-100 MiB (fewer
                         trees where one thread's walk would pass ~25 ms; runs.csv keeps the drawn
                         values).
* ``dfa_scan``           text scanning by a deterministic finite automaton (regex/lexer; a CuPy
                         kernel): 16-65536 states x 256 bytes (a table in L1 to HBM), one dependent
                         table load per byte over 64-4096-byte chunks of a 256 MiB-4 GiB text.
* ``concurrent_streams`` two CUDA streams at once: a GEMM (bf16 or fp32) on one and a copy, add or
                         random gather on the other, the compute stream's share of the queued time
                         drawn 0.1-0.9 (the kernels overlap in space, not in time as duty_mix does).
* ``spgemm``             sparse x sparse products (cuSPARSE SpGEMM via CSR @ CSR, as in algebraic
                         multigrid setup and multi-hop graph queries): 2^14-2^22 rows, 2-32 nonzeros
                         per row, random or banded, fp32 or fp64; the output's size is unknown until
                         a symbolic pass has run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.workloads.fresh4 import _job
from h200_collect.workloads.fresh6 import BLOCK, GRID, _launch_elems
from h200_collect.workloads.sizing import HBM_BPS, STEP_S, loguniform

#: Threads one CuPy launch keeps in flight (GRID x BLOCK): latency-bound launches are sized by it.
THREADS = GRID[0] * BLOCK[0]
#: Rough dependent-load latencies (s) by where the data sits, for sizing launches (not for labels).
LAT_L1_S, LAT_L2_S, LAT_HBM_S = 40e-9, 300e-9, 700e-9
L2_BYTES = 50 << 20


def _lat_s(table_bytes: float) -> float:
    return LAT_L1_S if table_bytes <= 128 << 10 else (LAT_L2_S if table_bytes <= L2_BYTES else LAT_HBM_S)


# --------------------------------------------------------------------------- number-theoretic transform


#: An NTT-friendly prime below 2^31 (15 * 2^27 + 1) and a generator of its multiplicative group;
#: products of two residues fit int64.
NTT_Q, NTT_G = 2013265921, 31


def p_ntt(rng: random.Random) -> dict[str, Any]:
    return {"log_n": rng.randint(12, 22), "limbs": rng.choice([1, 2, 4, 8, 16, 32]),
            "reduce": rng.choice(["mod", "barrett"]), "op": rng.choice(["forward", "polymul"])}


def b_ntt(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        log_n, limbs = int(p["log_n"]), int(p["limbs"])
        while limbs > 1 and (limbs << log_n) > 1 << 25:  # 256 MiB of int64 per operand at most
            limbs //= 2
        if c.small:
            log_n, limbs = 6, 2
        n, q = 1 << log_n, NTT_Q
        inv_q = 1.0 / q

        def red(x: Any) -> Any:
            if p["reduce"] == "mod":
                return x % q
            r = x - (x.double() * inv_q).floor().long() * q  # Barrett by an fp64 quotient estimate
            r = t.where(r < 0, r + q, r)
            return t.where(r >= q, r - q, r)

        # the twiddles of every stage (half-length h: w_h^j, j < h), built by doubling on the device
        tw: list[Any] = []
        for s in range(log_n):
            h = 1 << s
            w = pow(NTT_G, (q - 1) // (2 * h), q)
            v = t.ones(1, dtype=t.int64, device=c.dev)
            while v.numel() < h:
                v = t.cat([v, red(v * pow(w, v.numel(), q))])
            tw.append(v)

        def ntt(x: Any) -> Any:
            # iterative radix-2 Cooley-Tukey (decimation in time): the NTT of x read in bit-reversed
            # order, which for random x is as good an input as any
            for s in range(log_n):
                h = 1 << s
                y = x.view(limbs, n // (2 * h), 2, h)
                a, b = y[:, :, 0], red(y[:, :, 1] * tw[s])
                x = t.stack([red(a + b), red(a - b + q)], 2).view(limbs, n)
            return x
        x1 = t.randint(0, q, (limbs, n), dtype=t.int64, device=c.dev)
        x2 = t.randint(0, q, (limbs, n), dtype=t.int64, device=c.dev)
        if p["op"] == "forward":
            def op() -> None:
                ntt(x1)
        else:
            def op() -> None:
                ntt(red(ntt(x1) * ntt(x2)))  # the inverse: the same butterflies (roots and scale aside)
        passes = log_n * (1 if p["op"] == "forward" else 3)
        return _job(c, op, [x1, x2, tw], float(passes * limbs * n * 8 * 6), "B")
    return build


# --------------------------------------------------------------------------- lattice Monte Carlo


def p_ising(rng: random.Random) -> dict[str, Any]:
    return {"dims": rng.choice([2, 3]), "log_sites": rng.randint(16, 28), "hits": rng.choice([1, 1, 2, 4, 8]),
            "beta": round(rng.uniform(0.1, 0.6), 3)}


def b_ising(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dims, hits, beta = int(p["dims"]), int(p["hits"]), float(p["beta"])
        log_sites = int(p["log_sites"]) if not c.small else 3 * dims
        side = 1 << (log_sites // dims)
        shape = (side,) * dims
        s = (t.randint(0, 2, shape, device=c.dev, dtype=t.int8) * 2 - 1).to(t.int8)
        parity = sum(t.arange(side, device=c.dev).view(*[-1 if d == k else 1 for d in range(dims)])
                     for k in range(dims)) % 2
        colors = [(parity == k).expand(shape) for k in (0, 1)]
        # acceptance exp(-beta dE) for dE = 2 s nb, indexed by s*nb + 2*dims (0 .. 4*dims)
        lut = t.tensor([min(1.0, math.exp(-beta * 2 * (e - 2 * dims))) for e in range(4 * dims + 1)],
                       device=c.dev)

        def sweep() -> None:
            for color in colors:
                nb = sum(t.roll(s, sh, d) for d in range(dims) for sh in (1, -1))  # int8: |nb| <= 6
                for _ in range(hits):
                    acc = (t.rand(shape, device=c.dev) < lut[(s * nb).long() + 2 * dims]) & color
                    s.copy_(t.where(acc, -s, s))
        nbytes = float(side ** dims * (2 * dims + 2 + hits * 14))
        return _job(c, sweep, [s, colors, lut], nbytes, "B")
    return build


# --------------------------------------------------------------------------- molecular dynamics


LJ_SRC = r"""
extern "C" __global__ void lj(const REAL* __restrict__ pos, const int* __restrict__ nbr,
                              const int* __restrict__ offs, REAL* __restrict__ force, long long n,
                              int k, int use_list, long long n_launch, long long offset) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_launch; i += step) {
        long long p = (offset + i) % n;
        REAL xi = pos[4 * p], yi = pos[4 * p + 1], zi = pos[4 * p + 2];
        REAL fx = 0, fy = 0, fz = 0;
        for (int j = 0; j < k; ++j) {
            long long q = use_list ? (long long)nbr[p * k + j] : (p + offs[j] + n) % n;
            REAL dx = xi - pos[4 * q], dy = yi - pos[4 * q + 1], dz = zi - pos[4 * q + 2];
            REAL r2 = dx * dx + dy * dy + dz * dz + (REAL)0.8;
            REAL inv2 = (REAL)1 / r2;
            REAL inv6 = inv2 * inv2 * inv2;
            REAL f = (r2 < (REAL)6.25) ? (REAL)24 * inv6 * ((REAL)2 * inv6 - (REAL)1) * inv2 : (REAL)0;
            fx += dx * f; fy += dy * f; fz += dz * f;
        }
        force[4 * p] = fx; force[4 * p + 1] = fy; force[4 * p + 2] = fz;
    }
}
"""
MD_FLOP_PER_PAIR = 23.0


def p_md(rng: random.Random) -> dict[str, Any]:
    return {"log_particles": rng.randint(16, 24), "neighbors": rng.choice([8, 16, 32, 64, 128]),
            "order": rng.choice(["sorted", "shuffled", "stencil"]),
            "dtype": rng.choice(["fp32", "fp32", "fp64"])}


def md_neighbors(t: Any, n: int, k: int, order: str, dev: str) -> tuple[Any, Any]:
    """Neighbour list (n x k, int32) and the fixed stencil offsets (k): near in index when sorted."""
    offs = t.tensor(random.Random(k).sample([o for o in range(-2 * k, 2 * k + 1) if o], k), dtype=t.int32,
                    device=dev)
    if order == "shuffled":
        return t.randint(0, n, (n, k), dtype=t.int32, device=dev), offs
    # sorted: a cell-sorted system's neighbours sit a few indices away (with jitter); int32 throughout
    nbr = t.randint(-8, 9, (n, k), dtype=t.int32, device=dev)
    nbr += t.arange(n, device=dev, dtype=t.int32).unsqueeze(1)
    nbr += offs
    return nbr.remainder_(n), offs


def b_md(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        n, k = 1 << int(p["log_particles"]), int(p["neighbors"])
        if c.small:
            n, k = 256, min(k, 8)
        esize = 4 if p["dtype"] == "fp32" else 8
        dtype = t.float32 if esize == 4 else t.float64
        use_list = p["order"] != "stencil"
        nbr, offs = md_neighbors(t, n, k, str(p["order"]), c.dev)
        pos = t.rand(n, 4, device=c.dev, dtype=dtype) * (n ** (1 / 3))
        vel = t.zeros_like(pos)
        force = t.zeros_like(pos)
        dt_s = 1e-3
        flop = MD_FLOP_PER_PAIR * n * k
        if not c.cuda:  # CPU check: the same forces by gathers in torch, tiny
            q_idx = nbr.long() if use_list else (t.arange(n).unsqueeze(1) + offs.long()) % n

            def ref() -> None:
                d = pos[:, None, :3] - pos[q_idx][:, :, :3]
                r2 = d.square().sum(-1) + 0.8
                inv6 = r2.reciprocal() ** 3
                f = t.where(r2 < 6.25, 24 * inv6 * (2 * inv6 - 1) / r2, t.zeros_like(r2))
                force[:, :3] = (d * f.unsqueeze(-1)).sum(1)
                vel.add_(force, alpha=dt_s)
                pos.add_(vel, alpha=dt_s)
            return Job(ref, flop, "FLOP", [pos, vel, force, nbr, offs])
        import cupy as cp

        kern = cp.RawKernel(LJ_SRC.replace("REAL", "float" if esize == 4 else "double"), "lj")
        pos_c, nbr_c, offs_c, f_c = (cp.asarray(x) for x in (pos, nbr, offs, force))
        # per pair: a 4-byte index (list), and a 32-byte sector of a random particle (shuffled) at a
        # quarter of HBM's rate; or the pair's arithmetic (divisions included) at a cautious rate
        shuffled = p["order"] == "shuffled"
        pair_s = max((4 if use_list else 0) / HBM_BPS + (32 * 4 / HBM_BPS if shuffled else 0),
                     MD_FLOP_PER_PAIR / (25e12 if esize == 4 else 10e12))
        per_elem_s = k * pair_s
        n_launch = _launch_elems(n, per_elem_s)
        st = {"off": 0}

        def op() -> None:
            t.cuda.current_stream().synchronize()  # torch's and CuPy's streams stay ordered
            kern(GRID, BLOCK, (pos_c, nbr_c, offs_c, f_c, cp.int64(n), cp.int32(k), cp.int32(int(use_list)),
                               cp.int64(n_launch), cp.int64(st["off"])))
            cp.cuda.get_current_stream().synchronize()
            st["off"] = (st["off"] + n_launch) % n
            vel.add_(force, alpha=dt_s)  # velocity Verlet: kick and drift (all particles)
            pos.add_(vel, alpha=dt_s)
        return _job(c, op, [pos, vel, force, nbr, offs, kern], MD_FLOP_PER_PAIR * n_launch * k, "FLOP")
    return build


# --------------------------------------------------------------------------- hash join / group-by


HASHJOIN_SRC = r"""
__device__ __forceinline__ unsigned int mix32(unsigned int h) {
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16; return h;
}
extern "C" __global__ void hj_build(const unsigned int* __restrict__ keys, unsigned int* tkeys,
                                    unsigned int* tvals, long long n, unsigned int mask, int agg) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        unsigned int k = keys[i];
        unsigned int h = mix32(k) & mask;
        for (unsigned int probe = 0; probe <= mask; ++probe) {
            unsigned int prev = atomicCAS(&tkeys[h], 0u, k);
            if (prev == 0u || prev == k) {
                if (agg) atomicAdd(&tvals[h], 1u); else tvals[h] = (unsigned int)i;
                break;
            }
            h = (h + 1u) & mask;
        }
    }
}
extern "C" __global__ void hj_probe(const unsigned int* __restrict__ keys,
                                    const unsigned int* __restrict__ tkeys,
                                    const unsigned int* __restrict__ tvals, unsigned int* __restrict__ out,
                                    long long n, long long n_launch, long long offset, unsigned int mask) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_launch; i += step) {
        long long j = (offset + i) % n;
        unsigned int k = keys[j];
        unsigned int h = mix32(k) & mask, v = 0xffffffffu;
        for (unsigned int probe = 0; probe <= mask; ++probe) {
            unsigned int tk = tkeys[h];
            if (tk == k) { v = tvals[h]; break; }
            if (tk == 0u) break;
            h = (h + 1u) & mask;
        }
        out[j] = v;
    }
}
"""
#: odd multiplier: key(i) = i * KEY_MUL mod 2^32 is a bijection, never 0 (the empty slot) for 0 < i < 2^32
KEY_MUL = 2654435761


def p_hashjoin(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(["probe", "probe", "build", "groupby"]), "log_build": rng.randint(14, 25),
            "load": round(rng.uniform(0.25, 0.9), 2), "log_probe": rng.randint(22, 28),
            "selectivity": round(loguniform(rng, 0.01, 1.0), 3)}


def hashjoin_keys(t: Any, n_build: int, n_probe: int, sel: float, dev: str) -> tuple[Any, Any]:
    """Unique build keys, and probe keys of which a fraction ``sel`` are in the build side."""
    ids = t.arange(1, n_build + 1, dtype=t.int64, device=dev)
    hit = t.rand(n_probe, device=dev) < sel
    pid = t.where(hit, t.randint(1, n_build + 1, (n_probe,), device=dev),
                  t.randint(n_build + 1, 1 << 31, (n_probe,), device=dev))
    return (ids * KEY_MUL) % (1 << 32), (pid * KEY_MUL) % (1 << 32)


def int32_bits(t: Any, x: Any) -> Any:
    """int64 values in [0, 2^32) as int32 with the same bits (CuPy then views them as uint32)."""
    return t.where(x >= 1 << 31, x - (1 << 32), x).to(t.int32)


def b_hashjoin(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        n_build, n_probe = 1 << int(p["log_build"]), 1 << int(p["log_probe"])
        if c.small:
            n_build, n_probe = 64, 256
        if p["op"] == "groupby":  # group-by: n_build / 8 distinct keys (the groups)
            n_build = max(1, n_build // 8)
        # expected probes per lookup under linear probing, ~ (1 + 1/(1-load)^2)/2 at the worst
        probes = 0.5 * (1 + 1 / (1 - float(p["load"])) ** 2)
        while n_build * probes > 1 << 30 and n_build > 1 << 14:
            n_build //= 2  # one build launch (every op builds the table once) stays well under ~50 ms
        slots = 1 << max(4, (int(n_build / float(p["load"])) - 1).bit_length())
        bkeys, pkeys = hashjoin_keys(t, n_build, n_probe, float(p["selectivity"]), c.dev)
        if p["op"] == "groupby":  # rows to aggregate: n_probe rows, each the key of a random group
            pkeys = bkeys[t.randint(0, n_build, (n_probe,), device=c.dev)]
        if not c.cuda:  # CPU check: the same join by a sorted table and searchsorted, tiny
            tk = bkeys.sort().values

            def ref() -> None:
                j = t.searchsorted(tk, pkeys).clamp(max=n_build - 1)
                hit = tk[j] == pkeys
                if p["op"] == "groupby":
                    t.zeros(n_build, dtype=t.int64).index_add_(0, j, hit.long())
            return Job(ref, float(n_probe * 8), "B", [tk, pkeys])
        import cupy as cp

        mods = cp.RawModule(code=HASHJOIN_SRC)
        k_build, k_probe = mods.get_function("hj_build"), mods.get_function("hj_probe")
        bk, pk = (cp.asarray(int32_bits(t, keys)).view(cp.uint32) for keys in (bkeys, pkeys))
        tkeys, tvals = cp.zeros(slots, dtype=cp.uint32), cp.zeros(slots, dtype=cp.uint32)
        out = cp.empty(n_probe, dtype=cp.uint32)
        mask = cp.uint32(slots - 1)
        k_build(GRID, BLOCK, (bk, tkeys, tvals, cp.int64(n_build), mask, cp.int32(0)))  # the table probed
        lat = _lat_s(slots * 8.0)
        st = {"off": 0}
        if p["op"] == "build":
            def op() -> None:
                tkeys.fill(0)
                tvals.fill(0)
                k_build(GRID, BLOCK, (bk, tkeys, tvals, cp.int64(n_build), mask, cp.int32(0)))
                cp.cuda.get_current_stream().synchronize()
            return _job(c, op, [bk, pk, tkeys, tvals, out, mods], float(n_build * 4 + slots * 16), "B")
        if p["op"] == "groupby":
            n_launch = _launch_elems(n_probe, max(8 / HBM_BPS, probes * lat / THREADS * 4))

            def op() -> None:
                k_build(GRID, BLOCK, (pk[st["off"]:st["off"] + n_launch], tkeys, tvals, cp.int64(n_launch),
                                      mask, cp.int32(1)))
                cp.cuda.get_current_stream().synchronize()
                st["off"] = (st["off"] + n_launch) % max(1, n_probe - n_launch)
            return _job(c, op, [bk, pk, tkeys, tvals, out, mods], float(n_launch * 4), "B")
        n_launch = _launch_elems(n_probe, max(8 / HBM_BPS, probes * lat / THREADS))

        def probe() -> None:
            k_probe(GRID, BLOCK, (pk, tkeys, tvals, out, cp.int64(n_probe), cp.int64(n_launch),
                                  cp.int64(st["off"]), mask))
            cp.cuda.get_current_stream().synchronize()
            st["off"] = (st["off"] + n_launch) % n_probe
        return _job(c, probe, [bk, pk, tkeys, tvals, out, mods], float(n_launch * 8), "B")
    return build


# --------------------------------------------------------------------------- tree-ensemble inference


TREES_SRC = r"""
extern "C" __global__ void forest(const float* __restrict__ x, const int* __restrict__ feat,
                                  const float* __restrict__ thr, const float* __restrict__ leaf,
                                  float* __restrict__ out, long long n, int nf, int trees, int depth,
                                  int feature_major, long long n_launch, long long offset) {
    long long step = (long long)gridDim.x * blockDim.x;
    int inner = (1 << depth) - 1;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_launch; i += step) {
        long long s = (offset + i) % n;
        float acc = 0.0f;
        for (int tr = 0; tr < trees; ++tr) {
            int node = 0;
            for (int d = 0; d < depth; ++d) {
                long long f = feat[(long long)tr * inner + node];
                float v = feature_major ? x[f * n + s] : x[s * nf + f];
                node = 2 * node + 1 + (v > thr[(long long)tr * inner + node] ? 1 : 0);
            }
            acc += leaf[((long long)tr << depth) + (node - inner)];
        }
        out[s] = acc;
    }
}
"""


def p_trees(rng: random.Random) -> dict[str, Any]:
    return {"trees": round(loguniform(rng, 16, 2048)), "depth": rng.randint(3, 12),
            "features": rng.choice([16, 64, 256, 1024]), "log_samples": rng.randint(14, 22),
            "layout": rng.choice(["row_major", "feature_major"])}


def b_trees(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        T, D, F = int(p["trees"]), int(p["depth"]), int(p["features"])
        n = 1 << int(p["log_samples"])
        # one thread's walk (~3 dependent loads per level) through all trees stays under ~25 ms
        while T > 1 and T * D * 3 * (_lat_s(T * (((1 << D) - 1) * 8 + (4 << D))) + LAT_HBM_S) > 0.025:
            T //= 2
        if c.small:
            T, D, F, n = 4, 3, 8, 64
        inner = (1 << D) - 1
        x = t.rand(n, F, device=c.dev)
        if p["layout"] == "feature_major":
            x = x.t().contiguous()
        feat = t.randint(0, F, (T, inner), device=c.dev, dtype=t.int32)
        thr = t.rand(T, inner, device=c.dev)
        leaf = t.randn(T, 1 << D, device=c.dev)
        model_b = T * (inner * 8 + (4 << D))
        if not c.cuda:  # CPU check: the same walk, vectorised over samples and trees, tiny
            xs = x.t() if p["layout"] == "feature_major" else x
            tr = t.arange(T).unsqueeze(0)

            def ref() -> None:
                node = t.zeros(n, T, dtype=t.long)
                for _ in range(D):
                    f = feat[tr, node].long()
                    v = xs.gather(1, f)
                    node = 2 * node + 1 + (v > thr[tr, node]).long()
                leaf[tr, node - inner].sum(1)
            return Job(ref, float(n * T * D * 8), "B", [x, feat, thr, leaf])
        import cupy as cp

        kern = cp.RawKernel(TREES_SRC, "forest")
        xc, fc, tc, lc = (cp.asarray(a) for a in (x, feat, thr, leaf))
        out = cp.empty(n, dtype=cp.float32)
        lat = _lat_s(model_b) + (LAT_HBM_S if p["layout"] == "row_major" and n * F * 4 > L2_BYTES else 0)
        n_launch = _launch_elems(n, max(T * D * 8 / HBM_BPS, T * D * 3 * lat / THREADS))
        st = {"off": 0}

        def op() -> None:
            kern(GRID, BLOCK, (xc, fc, tc, lc, out, cp.int64(n), cp.int32(F), cp.int32(T), cp.int32(D),
                               cp.int32(int(p["layout"] == "feature_major")), cp.int64(n_launch),
                               cp.int64(st["off"])))
            cp.cuda.get_current_stream().synchronize()
            st["off"] = (st["off"] + n_launch) % n
        return _job(c, op, [x, feat, thr, leaf, out, kern], float(n_launch * T * D * 8), "B")
    return build


# --------------------------------------------------------------------------- DFA text scan


DFA_SRC = r"""
extern "C" __global__ void dfa(const unsigned int* __restrict__ text, const unsigned int* __restrict__ table,
                               unsigned int* __restrict__ matches, long long chunks, int words,
                               unsigned int accept_below, long long n_launch, long long offset) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_launch; i += step) {
        long long ch = (offset + i) % chunks;
        unsigned int state = 0, hits = 0;
        for (int w = 0; w < words; ++w) {
            unsigned int four = text[ch * words + w];
            #pragma unroll
            for (int b = 0; b < 4; ++b) {
                state = table[state * 256u + ((four >> (8 * b)) & 255u)];
                hits += state < accept_below ? 1u : 0u;
            }
        }
        matches[ch] = hits;
    }
}
"""


def p_dfa(rng: random.Random) -> dict[str, Any]:
    return {"states": round(loguniform(rng, 16, 65536)), "chunk": rng.choice([64, 256, 1024, 4096]),
            "text_mib": round(loguniform(rng, 256, 4096)), "alphabet": rng.choice([4, 26, 96, 256])}


def b_dfa(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        S, C, A = int(p["states"]), int(p["chunk"]), int(p["alphabet"])
        nbytes = int(p["text_mib"]) << 20 if not c.small else 4096
        if c.small:
            S, C = min(S, 32), 64
        chunks = max(1, nbytes // C)
        text = t.randint(0, A, (chunks * C,), device=c.dev, dtype=t.uint8)
        table = t.randint(0, S, (S, 256), device=c.dev, dtype=t.int32)
        accept = max(1, S // 8)
        if not c.cuda:  # CPU check: the same automaton over all chunks at once (byte by byte), tiny
            tb = text.view(chunks, C).long()

            def ref() -> None:
                state = t.zeros(chunks, dtype=t.long)
                hits = t.zeros(chunks, dtype=t.long)
                for b in range(C):
                    state = table[state, tb[:, b]].long()
                    hits += state < accept
            return Job(ref, float(chunks * C), "B", [text, table])
        import cupy as cp

        kern = cp.RawKernel(DFA_SRC, "dfa")
        tx = cp.asarray(text).view(cp.uint32)
        tab = cp.asarray(table).view(cp.uint32)
        matches = cp.empty(chunks, dtype=cp.uint32)
        lat = _lat_s(S * 256 * 4.0)
        n_launch = _launch_elems(chunks, max(C / HBM_BPS, C * lat / THREADS))
        st = {"off": 0}

        def op() -> None:
            kern(GRID, BLOCK, (tx, tab, matches, cp.int64(chunks), cp.int32(C // 4), cp.uint32(accept),
                               cp.int64(n_launch), cp.int64(st["off"])))
            cp.cuda.get_current_stream().synchronize()
            st["off"] = (st["off"] + n_launch) % chunks
        return _job(c, op, [text, table, matches, kern], float(n_launch * C), "B")
    return build


# --------------------------------------------------------------------------- concurrent streams


def p_streams(rng: random.Random) -> dict[str, Any]:
    return {"compute": rng.choice(["gemm_bf16", "gemm_fp32"]), "gemm_n": rng.choice([1024, 2048, 4096, 8192]),
            "memory": rng.choice(["copy", "add", "gather"]), "mib": round(loguniform(rng, 64, 4096)),
            "share": round(rng.uniform(0.1, 0.9), 2)}


def b_streams(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        m = int(p["gemm_n"]) if not c.small else 32
        n = (int(p["mib"]) << 20) // 4 if not c.small else 4096
        share = float(p["share"])
        dtype = t.bfloat16 if p["compute"] == "gemm_bf16" and c.cuda else t.float32
        a = t.randn(m, m, device=c.dev, dtype=dtype)
        x = t.randn(n, device=c.dev)
        y = t.empty_like(x)
        idx = t.randint(0, n, (n,), device=c.dev) if p["memory"] == "gather" else None

        def comp() -> None:
            t.mm(a, a)

        def mem() -> None:
            if idx is not None:
                t.index_select(x, 0, idx, out=y)
            elif p["memory"] == "add":
                t.add(x, y, out=y)
            else:
                y.copy_(x)
        mem_b = float(n * 4 * (2 if p["memory"] == "copy" else 3))
        if not c.cuda:  # CPU check: the two queues one after the other, tiny
            def seq() -> None:
                comp()
                mem()
            return Job(seq, mem_b, "B", [a, x, y, idx])

        def per_call_s(op: Callable[[], None]) -> float:
            import time

            op()
            c.sync()
            t0 = time.perf_counter()
            for _ in range(3):
                op()
            c.sync()
            return (time.perf_counter() - t0) / 3
        # each stream is given its share of a step's time, as if alone; queued together, they overlap
        reps_c = max(1, min(4000, int(share * STEP_S / max(per_call_s(comp), 1e-7))))
        reps_m = max(1, min(4000, int((1 - share) * STEP_S / max(per_call_s(mem), 1e-7))))
        main = t.cuda.current_stream()
        sc, sm = t.cuda.Stream(), t.cuda.Stream()

        def step() -> None:
            sc.wait_stream(main)
            sm.wait_stream(main)
            with t.cuda.stream(sc):
                for _ in range(reps_c):
                    comp()
            with t.cuda.stream(sm):
                for _ in range(reps_m):
                    mem()
            main.wait_stream(sc)
            main.wait_stream(sm)
        return Job(step, reps_m * mem_b, "B", [a, x, y, idx, sc, sm])
    return build


# --------------------------------------------------------------------------- sparse x sparse


def p_spgemm(rng: random.Random) -> dict[str, Any]:
    return {"log_rows": rng.randint(14, 22), "nnz_per_row": rng.choice([2, 4, 8, 16, 32]),
            "structure": rng.choice(["random", "banded"]), "dtype": rng.choice(["fp32", "fp64"]),
            "op": rng.choice(["square", "times_other"])}


def spgemm_csr(t: Any, n: int, k: int, structure: str, dtype: Any, dev: str, seed: int) -> Any:
    """n x n CSR, int32 indices, k distinct sorted columns per row: random, or within a band.

    Random: one column in each of k equal stripes of the row (distinct and sorted by construction).
    Banded: k distinct offsets within +-2k of the diagonal, wrapped, then sorted.
    """
    g = t.Generator(device=dev).manual_seed(seed)
    if structure == "random":
        width = n // k
        col = t.randint(0, width, (n, k), device=dev, generator=g) + t.arange(k, device=dev) * width
    else:
        offs = t.tensor(random.Random(seed).sample(range(-2 * k, 2 * k + 1), k), device=dev)
        col = ((t.arange(n, device=dev).unsqueeze(1) + offs) % n).sort(dim=1).values
    crow = t.arange(0, n * k + 1, k, device=dev, dtype=t.int32)
    val = t.randn(n * k, device=dev, dtype=dtype, generator=g)
    return t.sparse_csr_tensor(crow, col.reshape(-1).to(t.int32), val, (n, n))


def b_spgemm(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        n, k = 1 << int(p["log_rows"]), int(p["nnz_per_row"])
        while n * k * k > 1 << 24 and n > 1 << 12:  # the products (n k^2) under 16M: a call ~ < 50 ms
            n //= 2
        if c.small:
            n, k = 64, min(k, 4)
        dtype = t.float32 if p["dtype"] == "fp32" else t.float64
        A = spgemm_csr(t, n, k, str(p["structure"]), dtype, c.dev, 1)
        B = A if p["op"] == "square" else spgemm_csr(t, n, k, str(p["structure"]), dtype, c.dev, 2)

        def op() -> None:
            A @ B
        esize = 4 + (4 if p["dtype"] == "fp32" else 8)
        return _job(c, op, [A, B], float(n * k * k * esize * 2), "B")
    return build


#: family -> (parameter sampler, builder factory): round 11's test families
FRESH7_TEST: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                             Callable[[dict[str, Any]], Callable[[Ctx], Job]]]] = {
    "ntt_modmul": (p_ntt, b_ntt),
    "ising_metropolis": (p_ising, b_ising),
    "md_neighbor": (p_md, b_md),
    "hash_join": (p_hashjoin, b_hashjoin),
    "tree_ensemble": (p_trees, b_trees),
    "dfa_scan": (p_dfa, b_dfa),
    "concurrent_streams": (p_streams, b_streams),
    "spgemm": (p_spgemm, b_spgemm),
}


def fresh7_intended(family: str, p: dict[str, Any]) -> str:
    """What a round-11 test run was built to be (informational: the GPM rule gives the truth)."""
    if family == "ntt_modmul":  # int64 division is emulated: many integer ops per byte
        return "compute" if p["reduce"] == "mod" else "memory"
    if family == "md_neighbor":
        return "compute" if p["order"] == "stencil" or int(p["neighbors"]) >= 64 else "memory"
    if family == "concurrent_streams":
        return "compute" if float(p["share"]) >= 0.5 else "memory"
    if family == "dfa_scan":  # a table in L1: dependent loads on chip, no DRAM traffic to speak of
        return "compute" if int(p["states"]) * 1024 <= 128 << 10 else "memory"
    if family == "tree_ensemble":  # a forest of under 1 MiB is walked from on-chip caches
        depth = int(p["depth"])
        return "compute" if int(p["trees"]) * (((1 << depth) - 1) * 8 + (4 << depth)) <= 1 << 20 else "memory"
    if family == "hash_join":
        return "compute" if int(p["log_build"]) <= 17 and p["op"] != "build" else "memory"
    return "memory"

