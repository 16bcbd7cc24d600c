"""Round 8's test families (issue 13): kinds of work that no earlier set, training or test, holds.

Why: round 8's never-seen test set for the classifier without GPM. Written after the shipped model
(h200-20261130-intpipe) was fixed, recorded once and scored once; nothing is chosen on it. Each
family is a kind of work that none of the earlier modules (dense, hpc, nets, phases, starved,
sweep, fresh, latency, fresh4, fresh5) builds: stream compaction, integer hashing, bit-similarity
search, dynamic programming over time, divergent control flow, CUDA-graph replay, per-sample
gradients and hash-grid encodings. Sizes, dtypes and modes are drawn per run so that a family spans
both sides of its ridge where it has one. The GPM rule on the device decides each run's truth,
whatever the family intended.

* ``stream_compact``   masked_select, nonzero, boolean indexing, unique and unique_consecutive over
                       16 MiB-2 GiB at densities 0.1-90%: scans plus a device-to-host size read.
* ``int_hash``         a CuPy kernel of 1-256 rounds of 32- or 64-bit integer mixing (murmur3 /
                       splitmix64 finalisers) per key, streamed out or set as bits in a Bloom-filter
                       table (atomicOr) in L2 or HBM: the integer pipe against memory.
* ``hamming_search``   binary codes (64-1024 bits) compared by xor + popcount against 1-1024 queries
                       (a CuPy kernel, as in binary-embedding retrieval): memory-bound at few
                       queries, integer-pipe bound at many.
* ``ctc_loss``         CTC loss (speech recognition) forward or forward + backward, 29-8000 classes,
                       100-1600 frames: a dynamic programme, sequential over time.
* ``divergent_iter``   escape-time fractal iteration (Mandelbrot, fp32 or fp64, 16-4096 iterations)
                       over regions where threads of a warp leave the loop together or apart.
* ``cuda_graph``       a small MLP or attention block (batch 1-64) captured once into a CUDA graph,
                       1-16 forward passes per graph (fewer passes, then layers, then rows where one
                       replay would pass ~50 ms; runs.csv keeps the drawn values), and replayed:
                       back-to-back small kernels with no launch gaps (eager on the CPU check).
* ``per_sample_grad``  DP-SGD: per-sample gradients by ``torch.func.vmap(grad(...))`` of an MLP over
                       1-256 tokens per sample, per-sample clipping and Gaussian noise.
* ``hash_encoding``    an instant-NGP multiresolution hash encoding (2-16 levels, 2^14-2^22-entry
                       tables: L2- to HBM-sized) with a tiny MLP, inference or training: hashed
                       gathers and scatter-added gradients.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.workloads.fresh4 import _job
from h200_collect.workloads.sizing import HBM_BPS, loguniform

#: Rough H200 integer-op rate for sizing CuPy launches (not for labels): ops/s.
INT_OPS = 25e12
#: Seconds one CuPy launch is sized to (a rolling window over the data, as fma_sweep does).
LAUNCH_S = 0.01
GRID = (132 * 8,)
BLOCK = (256,)


def _launch_elems(n: int, per_elem_s: float) -> int:
    return int(max(1024, min(n, LAUNCH_S / max(per_elem_s, 1e-15))))


# --------------------------------------------------------------------------- stream compaction


COMPACT_OPS = ("masked_select", "nonzero", "bool_index", "unique", "unique_consecutive")


def p_compact(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(COMPACT_OPS), "density": round(loguniform(rng, 0.001, 0.9), 4),
            "mib": round(loguniform(rng, 16, 2048)), "dtype": rng.choice(["bf16", "fp32", "int64"])}


def b_compact(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        keys = p["dtype"] == "int64" or p["op"] in ("unique", "unique_consecutive")  # unique: int64 keys
        esize = 8 if keys else {"bf16": 2, "fp32": 4}[p["dtype"]]
        n = (int(p["mib"]) << 20) // esize if not c.small else 4096
        dens = float(p["density"])
        if keys:
            card = max(1, int(n * dens))  # distinct keys: the density sets the output size
            x = t.randint(0, card, (n,), device=c.dev, dtype=t.int64)
            if p["op"] == "unique_consecutive":
                x = t.sort(x).values
        else:
            x = t.randn(n, device=c.dev, dtype=c.dtype(p["dtype"]) if c.cuda else t.float32)
        mask = t.rand(n, device=c.dev) < dens
        ops: dict[str, Callable[[], object]] = {
            "masked_select": lambda: t.masked_select(x, mask),
            "nonzero": lambda: t.nonzero(mask),
            "bool_index": lambda: x[mask],
            "unique": lambda: t.unique(x, return_counts=True),
            "unique_consecutive": lambda: t.unique_consecutive(x, return_counts=True),
        }
        return _job(c, ops[p["op"]], [x, mask], float(n * (esize + 1)), "B")
    return build


# --------------------------------------------------------------------------- integer hashing


HASH_SRC = r"""
extern "C" __global__ void int_hash(const UINT* __restrict__ x, UINT* __restrict__ y,
                                    unsigned int* __restrict__ table, long long n, long long n_launch,
                                    long long offset, int rounds, int bloom, unsigned long long tmask) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_launch; i += step) {
        long long k = (offset + i) % n;
        UINT h = x[k];
        for (int r = 0; r < rounds; ++r) { MIX }
        if (bloom) {
            unsigned long long b = (unsigned long long)h & tmask;
            atomicOr(&table[b >> 5], 1u << (unsigned int)(b & 31ull));
        } else {
            y[k] = h;
        }
    }
}
"""
#: width -> (C type, one mixing round, bytes per key, integer ops per round incl. 64-bit emulation)
HASH_TYPES: dict[int, tuple[str, str, int, int]] = {
    32: ("unsigned int", "h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;",
         4, 8),
    64: ("unsigned long long", "h ^= h >> 30; h *= 0xbf58476d1ce4e5b9ull; h ^= h >> 27; "
         "h *= 0x94d049bb133111ebull; h ^= h >> 31;", 8, 20),
}


def p_hash(rng: random.Random) -> dict[str, Any]:
    return {"width": rng.choice([32, 64]), "rounds": round(loguniform(rng, 1, 256)),
            "mode": rng.choice(["stream", "bloom"]), "table_mib": rng.choice([4, 16, 256, 2048]),
            "mib": round(loguniform(rng, 64, 2048))}


def b_hash(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        ctype, mix, esize, ops_per = HASH_TYPES[int(p["width"])]
        rounds, bloom = int(p["rounds"]), p["mode"] == "bloom"
        n = (int(p["mib"]) << 20) // esize if not c.small else 4096
        table_bits = (int(p["table_mib"]) << 23) if not c.small else 1 << 12  # MiB -> bits
        if not c.cuda:  # CPU check: the same mixing in torch int64, 32-bit lanes, tiny
            x = t.randint(0, 1 << 31, (n,), dtype=t.int64)
            table = t.zeros(table_bits // 32, dtype=t.int64)

            def ref() -> None:
                h = x.clone()
                for _ in range(min(rounds, 4)):
                    h = (h ^ (h >> 16)) * 0x85EBCA6B & 0xFFFFFFFF
                    h = (h ^ (h >> 13)) * 0xC2B2AE35 & 0xFFFFFFFF
                    h = h ^ (h >> 16)
                if bloom:
                    b = h & (table_bits - 1)
                    table.index_put_((b >> 5,), t.ones_like(b) << (b & 31), accumulate=True)
            return Job(ref, float(n * esize), "B", [x, table])
        import cupy as cp

        kern = cp.RawKernel(HASH_SRC.replace("UINT", ctype).replace("MIX", mix), "int_hash")
        dt = cp.uint32 if esize == 4 else cp.uint64
        x = (cp.random.random(n, dtype=cp.float64) * 2.0 ** (32 if esize == 4 else 53)).astype(dt)
        y = cp.empty_like(x) if not bloom else cp.zeros(1, dtype=dt)
        table = cp.zeros(table_bits // 32 if bloom else 1, dtype=cp.uint32)
        per_elem_s = max(esize * (1 if bloom else 2) / HBM_BPS, rounds * ops_per / INT_OPS)
        n_launch = _launch_elems(n, per_elem_s)
        st = {"off": 0}

        def op() -> None:
            kern(GRID, BLOCK, (x, y, table, cp.int64(n), cp.int64(n_launch), cp.int64(st["off"]),
                               cp.int32(rounds), cp.int32(int(bloom)), cp.uint64(table_bits - 1)))
            st["off"] = (st["off"] + n_launch) % n
        return _job(c, op, [x, y, table, kern], float(n_launch * esize * (1 if bloom else 2)), "B")
    return build


# --------------------------------------------------------------------------- bit-similarity search


HAMMING_SRC = r"""
extern "C" __global__ void hamming(const unsigned int* __restrict__ db, const unsigned int* __restrict__ q,
                                   int* __restrict__ out, long long n, long long n_launch,
                                   long long offset, int nq) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_launch; i += step) {
        long long k = (offset + i) % n;
        unsigned int code[WORDS];
        #pragma unroll
        for (int w = 0; w < WORDS; ++w) code[w] = db[k * WORDS + w];
        int best = 1 << 30;
        for (int j = 0; j < nq; ++j) {
            int d = 0;
            #pragma unroll
            for (int w = 0; w < WORDS; ++w) d += __popc(code[w] ^ q[j * WORDS + w]);
            best = min(best, d);
        }
        out[k] = best;
    }
}
"""


def p_hamming(rng: random.Random) -> dict[str, Any]:
    return {"bits": rng.choice([64, 128, 256, 512, 1024]), "queries": round(loguniform(rng, 1, 1024)),
            "mib": round(loguniform(rng, 64, 4096))}


def b_hamming(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        words, nq = int(p["bits"]) // 32, int(p["queries"])
        n = (int(p["mib"]) << 20) // (4 * words) if not c.small else 256
        if c.small:
            nq = min(nq, 4)
        if not c.cuda:  # CPU check: xor, then popcount by a byte table, tiny
            db = t.randint(0, 1 << 31, (n, words), dtype=t.int32)
            q = t.randint(0, 1 << 31, (nq, words), dtype=t.int32)
            pop = t.tensor([bin(i).count("1") for i in range(256)], dtype=t.int32)

            def ref() -> None:
                x = (db.unsqueeze(1) ^ q.unsqueeze(0)).contiguous().view(t.uint8).long()
                pop[x].sum(-1).min(1)
            return Job(ref, float(n * words * 4), "B", [db, q, pop])
        import cupy as cp

        kern = cp.RawKernel(HAMMING_SRC.replace("WORDS", str(words)), "hamming")
        db = (cp.random.random(n * words, dtype=cp.float64) * 2.0 ** 32).astype(cp.uint32)
        q = (cp.random.random(nq * words, dtype=cp.float64) * 2.0 ** 32).astype(cp.uint32)
        out = cp.empty(n, dtype=cp.int32)
        per_elem_s = max((4 * words + 4) / HBM_BPS, 3.0 * nq * words / INT_OPS)
        n_launch = _launch_elems(n, per_elem_s)
        st = {"off": 0}

        def op() -> None:
            kern(GRID, BLOCK, (db, q, out, cp.int64(n), cp.int64(n_launch), cp.int64(st["off"]),
                               cp.int32(nq)))
            st["off"] = (st["off"] + n_launch) % n
        return _job(c, op, [db, q, out, kern], float(n_launch * (4 * words + 4)), "B")
    return build


# --------------------------------------------------------------------------- CTC loss


def p_ctc(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([4, 16, 64, 256]), "frames": rng.choice([100, 200, 400, 800, 1600]),
            "classes": rng.choice([29, 80, 500, 2000, 8000]),
            "target_ratio": round(rng.uniform(0.05, 0.45), 2),
            "backward": rng.random() < 0.7}


def b_ctc(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        F = t.nn.functional
        B, T, C = int(p["batch"]), int(p["frames"]), int(p["classes"])
        while B * T * C * 4 * 3 > 12e9 and B > 1:  # log-probs, their gradient and a temporary
            B //= 2
        if c.small:
            B, T, C = 2, 16, 6
        S = max(1, int(T * float(p["target_ratio"])))
        lp = t.randn(T, B, C, device=c.dev).log_softmax(2).requires_grad_(bool(p["backward"]))
        tgt = t.randint(1, C, (B, S), device=c.dev)
        in_len = t.full((B,), T, dtype=t.long, device=c.dev)
        tgt_len = t.full((B,), S, dtype=t.long, device=c.dev)

        def loss() -> Any:
            return F.ctc_loss(lp, tgt, in_len, tgt_len, zero_infinity=True)
        if p["backward"]:
            def op() -> None:
                t.autograd.grad(loss(), lp)
        else:
            def op() -> None:
                with t.no_grad():
                    loss()
        nbytes = float(T * B * C * 4 * (3 if p["backward"] else 1))
        return _job(c, op, [lp, tgt, in_len, tgt_len], nbytes, "B")
    return build


# --------------------------------------------------------------------------- divergent iteration


ESCAPE_SRC = r"""
extern "C" __global__ void escape(REAL* __restrict__ out, long long side, long long n_launch,
                                  long long offset, REAL x0, REAL y0, REAL span, int max_iter) {
    long long n = side * side;
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_launch; i += step) {
        long long k = (offset + i) % n;
        REAL cx = x0 + span * (REAL)(k % side) / (REAL)side;
        REAL cy = y0 + span * (REAL)(k / side) / (REAL)side;
        REAL zx = 0, zy = 0;
        int it = 0;
        while (it < max_iter && zx * zx + zy * zy < (REAL)4) {
            REAL tx = zx * zx - zy * zy + cx;
            zy = (REAL)2 * zx * zy + cy;
            zx = tx;
            ++it;
        }
        out[k] = (REAL)it;
    }
}
"""
#: region -> (x0, y0, span): the whole set (mixed), its boundary (divergent warps), its inside
#: (every thread runs max_iter), its outside (every thread leaves at once: the write dominates)
REGIONS = {"whole": (-2.5, -1.25, 2.5), "boundary": (-0.76, 0.08, 0.04), "inside": (-0.4, -0.2, 0.3),
           "outside": (1.0, 1.0, 1.0)}


def p_escape(rng: random.Random) -> dict[str, Any]:
    return {"region": rng.choice(list(REGIONS)), "dtype": rng.choice(["fp32", "fp64"]),
            "max_iter": round(loguniform(rng, 16, 4096)), "side": rng.choice([1024, 4096, 8192, 16384])}


def b_escape(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        x0, y0, span = REGIONS[p["region"]]
        side = int(p["side"]) if not c.small else 32
        max_iter = int(p["max_iter"])
        esize = 4 if p["dtype"] == "fp32" else 8
        if not c.cuda:  # CPU check: the same iteration, masked, in torch, tiny
            dtype = t.float32 if esize == 4 else t.float64
            xs = x0 + span * t.arange(side, dtype=dtype) / side
            cre = xs.repeat(side, 1)
            cim = (y0 + span * t.arange(side, dtype=dtype) / side).unsqueeze(1).expand(side, side)

            def ref() -> None:
                zr, zi = t.zeros_like(cre), t.zeros_like(cre)
                its = t.zeros_like(cre)
                for _ in range(min(max_iter, 16)):
                    live = zr * zr + zi * zi < 4
                    zr, zi = t.where(live, zr * zr - zi * zi + cre, zr), t.where(live, 2 * zr * zi + cim, zi)
                    its += live
            return Job(ref, float(side * side * esize), "B", [cre, cim])
        import cupy as cp

        ctype = "float" if esize == 4 else "double"
        kern = cp.RawKernel(ESCAPE_SRC.replace("REAL", ctype), "escape")
        out = cp.zeros(side * side, dtype=cp.float32 if esize == 4 else cp.float64)
        real = cp.float32 if esize == 4 else cp.float64
        # sized as if every thread ran max_iter (the inside); elsewhere a launch is shorter
        per_elem_s = max(esize / HBM_BPS, 6.0 * max_iter / (60e12 if esize == 4 else 30e12))
        n = side * side
        n_launch = _launch_elems(n, per_elem_s)
        st = {"off": 0}

        def op() -> None:
            kern(GRID, BLOCK, (out, cp.int64(side), cp.int64(n_launch), cp.int64(st["off"]), real(x0),
                               real(y0), real(span), cp.int32(max_iter)))
            st["off"] = (st["off"] + n_launch) % n
        return _job(c, op, [out, kern], float(n_launch * esize), "B")
    return build


# --------------------------------------------------------------------------- CUDA graph replay


def p_graph(rng: random.Random) -> dict[str, Any]:
    return {"net": rng.choice(["mlp", "attn_block"]), "batch": rng.choice([1, 2, 4, 8, 16, 32, 64]),
            "width": rng.choice([256, 512, 1024, 2048, 4096]), "depth": rng.choice([2, 4, 8]),
            "seq": rng.choice([16, 64, 256]), "unroll": rng.choice([1, 4, 16]),
            "dtype": rng.choice(["bf16", "fp32"])}


def b_graph(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        nn = t.nn
        F = nn.functional
        B, W, D, S, U = (int(p[k]) for k in ("batch", "width", "depth", "seq", "unroll"))
        if c.small:
            B, W, D, S, U = 1, 32, 2, 4, 2
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        attn = p["net"] == "attn_block"
        heads = max(1, W // 128)

        def flop_of(u: int, d: int, b: int) -> float:
            return 2.0 * b * (S if attn else 1) * W * W * (8 + (4 if attn else 0)) * d * u
        while flop_of(U, D, B) / (400e12 if dtype == t.bfloat16 else 40e12) > 0.05 and B * D * U > 1:
            # one replay stays well under a step (runs.csv keeps the drawn values)
            if U > 1:
                U //= 2
            elif D > 2:
                D //= 2
            else:
                B //= 2
        flop = flop_of(U, D, B)

        class Block(nn.Module):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.norm, self.up, self.down = nn.LayerNorm(W), nn.Linear(W, 4 * W), nn.Linear(4 * W, W)
                self.qkv = nn.Linear(W, 3 * W) if attn else None
                self.proj = nn.Linear(W, W) if attn else None

            def forward(self, x: Any) -> Any:
                if self.qkv is not None and self.proj is not None:
                    q, k, v = self.qkv(self.norm(x)).view(B, S, 3, heads, W // heads).unbind(2)
                    q, k, v = (z.transpose(1, 2) for z in (q, k, v))
                    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    x = x + self.proj(a.transpose(1, 2).reshape(B, S, W))
                return x + self.down(F.gelu(self.up(self.norm(x))))

        net = nn.Sequential(*[Block() for _ in range(D)]).to(device=c.dev, dtype=dtype).eval()
        x = t.randn(*((B, S, W) if attn else (B, W)), device=c.dev, dtype=dtype)

        def forward() -> None:
            with t.no_grad():
                y = x
                for _ in range(U):
                    y = net(y)
        if not c.cuda:
            return _job(c, forward, [net, x], flop, "FLOP")
        side = t.cuda.Stream()
        side.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(side):  # warm-up off the capture stream, as capture requires
            for _ in range(3):
                forward()
        t.cuda.current_stream().wait_stream(side)
        graph = t.cuda.CUDAGraph()
        with t.cuda.graph(graph):
            forward()
        return _job(c, graph.replay, [net, x, graph], flop, "FLOP")
    return build


# --------------------------------------------------------------------------- per-sample gradients


def p_psg(rng: random.Random) -> dict[str, Any]:
    return {"width": rng.choice([128, 256, 512, 1024, 2048]), "depth": rng.choice([2, 3, 4]),
            "batch": rng.choice([16, 64, 256, 1024]), "tokens": rng.choice([1, 4, 16, 64, 256]),
            "classes": rng.choice([10, 100, 1000])}


def b_psg(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        nn = t.nn
        F = nn.functional
        from torch.func import functional_call, grad, vmap

        W, D, B, T, K = (int(p[k]) for k in ("width", "depth", "batch", "tokens", "classes"))
        while B > 1 and (B * W * W * D * 4 * 3 > 24e9 or B * T * W * 4 * D * 8 > 16e9):
            B //= 2  # per-sample gradients (and their clipped copy) and activations stay in memory
        if c.small:
            W, D, B, T, K = 16, 2, 4, min(T, 4), 5
        layers: list[Any] = []
        for _ in range(D):
            layers += [nn.Linear(W, W), nn.Tanh()]
        net = nn.Sequential(*layers, nn.Linear(W, K)).to(c.dev)
        params = {k: v.detach() for k, v in net.named_parameters()}
        x = t.randn(B, T, W, device=c.dev)
        y = t.randint(0, K, (B,), device=c.dev)

        def sample_loss(prm: dict[str, Any], xs: Any, ys: Any) -> Any:
            out = functional_call(net, prm, (xs.unsqueeze(0),)).mean(1)  # pool over the tokens
            return F.cross_entropy(out, ys.unsqueeze(0))
        per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))

        def op() -> None:
            g = per_sample(params, x, y)
            norms = t.sqrt(sum(v.flatten(1).square().sum(1) for v in g.values()))
            scale = (1.0 / (norms + 1e-6)).clamp(max=1.0)
            for k, v in g.items():  # clip per sample, sum, add noise, step
                upd = (v * scale.view(-1, *[1] * (v.dim() - 1))).sum(0)
                params[k].add_(upd + t.randn_like(upd), alpha=-1e-4 / B)
        flop = 6.0 * B * T * (D * W * W + W * K)
        return _job(c, op, [net, params, x, y], flop, "FLOP")
    return build


# --------------------------------------------------------------------------- hash-grid encoding


HASH_PRIMES = (1, 2654435761, 805459861)


def p_hashgrid(rng: random.Random) -> dict[str, Any]:
    return {"levels": rng.choice([2, 4, 8, 16]), "table_log2": rng.choice([14, 16, 18, 20, 22]),
            "dims": rng.choice([2, 3]), "points_log2": rng.choice([16, 18, 20, 21]),
            "dtype": rng.choice(["fp16", "fp32"]), "train": rng.random() < 0.5}


def b_hashgrid(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        nn = t.nn
        F = nn.functional
        L, Tl, dims, Nl = (int(p[k]) for k in ("levels", "table_log2", "dims", "points_log2"))
        if c.small:
            L, Tl, Nl = 2, 8, 6
        size, N, feat = 1 << Tl, 1 << Nl, 2
        dtype = t.float16 if c.cuda and p["dtype"] == "fp16" else t.float32
        tables = nn.Parameter(1e-4 * t.randn(L, size, feat, device=c.dev, dtype=dtype))
        mlp = nn.Sequential(nn.Linear(L * feat, 64), nn.ReLU(), nn.Linear(64, 4)).to(c.dev)
        # fp16 tables: Adam's default eps (1e-8) is 0 in fp16, and every entry without a gradient
        # in a step would turn to 0/0 = NaN (review); 1e-4 is representable
        opt = t.optim.Adam([{"params": [tables], "eps": 1e-4 if dtype == t.float16 else 1e-8},
                            {"params": list(mlp.parameters())}], lr=1e-3)
        pts = t.rand(N, dims, device=c.dev)
        target = t.rand(N, 4, device=c.dev)
        corners = t.tensor([[(i >> d) & 1 for d in range(dims)] for i in range(1 << dims)], device=c.dev)
        primes = t.tensor(HASH_PRIMES[:dims], device=c.dev, dtype=t.int64)
        res = [16.0 * (1.5 ** lvl) for lvl in range(L)]

        def encode() -> Any:
            out = []
            for lvl in range(L):
                pos = pts * res[lvl]
                base = pos.floor()
                frac = pos - base
                corner = base.long().unsqueeze(1) + corners  # N x 2^dims x dims
                idx = ((corner * primes).unbind(-1))
                h = idx[0]
                for part in idx[1:]:
                    h = h ^ part
                h = h & (size - 1)
                f = F.embedding(h, tables[lvl]).float()  # N x 2^dims x feat
                w = t.where(corners.bool(), frac.unsqueeze(1), 1 - frac.unsqueeze(1)).prod(-1)
                out.append((f * w.unsqueeze(-1)).sum(1))
            return t.cat(out, 1)
        if p["train"]:
            def op() -> None:
                loss = F.mse_loss(mlp(encode()), target)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        else:
            def op() -> None:
                with t.no_grad():
                    mlp(encode())
        esize = 2 if dtype == t.float16 else 4
        nbytes = float(N * L * (1 << dims) * feat * esize * (3 if p["train"] else 1))
        return _job(c, op, [tables, mlp, opt, pts, target], nbytes, "B")
    return build


#: family -> (parameter sampler, builder factory): round 8's test families
FRESH6_TEST: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                             Callable[[dict[str, Any]], Callable[[Ctx], Job]]]] = {
    "stream_compact": (p_compact, b_compact),
    "int_hash": (p_hash, b_hash),
    "hamming_search": (p_hamming, b_hamming),
    "ctc_loss": (p_ctc, b_ctc),
    "divergent_iter": (p_escape, b_escape),
    "cuda_graph": (p_graph, b_graph),
    "per_sample_grad": (p_psg, b_psg),
    "hash_encoding": (p_hashgrid, b_hashgrid),
}


def fresh6_intended(family: str, p: dict[str, Any]) -> str:
    """What a round-8 test run was built to be (informational: the GPM rule gives the truth)."""
    if family == "int_hash":
        ops = int(p["rounds"]) * HASH_TYPES[int(p["width"])][3]
        return "compute" if ops / INT_OPS > HASH_TYPES[int(p["width"])][2] * 2 / HBM_BPS else "memory"
    if family == "hamming_search":
        return "compute" if 3.0 * int(p["queries"]) / INT_OPS > 4 / HBM_BPS else "memory"
    if family == "divergent_iter":
        return "memory" if p["region"] == "outside" else "compute"
    if family == "cuda_graph":  # rows per weight read (as drawn; the size cap may lower it)
        tokens = int(p["batch"]) * (int(p["seq"]) if p["net"] == "attn_block" else 1)
        return "compute" if tokens >= 256 else "memory"
    if family == "per_sample_grad":
        return "compute" if int(p["tokens"]) >= 64 else "memory"
    return "memory"

