"""Randomised mechanism sweeps: the runs that teach the classifier the mechanism, not a list of apps.

Why: a model trained on a few dozen named applications learns those applications. Memory- vs
compute-bound is a property of arithmetic intensity against the ridge point of the pipe in use,
of the access pattern, the working set (L2 vs HBM), the occupancy and the time structure. Each
family here draws those parameters at random per run, so the recordings cover the space
continuously; the GPM rule on the device decides the truth, whatever the family intended.

Families (``plan`` draws runs from them; each run's parameters go into runs.csv ``params``):

* ``fma_sweep``     a CuPy kernel: per element loaded, a chain of ``iters`` FMAs (fp32/fp64/fp16x2),
                    streaming / strided / random-gather access, L2- or HBM-sized working set,
                    full or tiny grids. Intensity sweeps 0.1-500 FLOP/byte across each pipe's ridge.
* ``gemm_sweep``    (M x K) @ (K x N) with M from 1 to 8192: skinny (weight streaming) to square, on
                    the tensor pipe (bf16, fp16, fp8, int8, tf32, fp64 DMMA) and fp32 SIMT.
* ``attn_prefill``  causal scaled-dot-product attention over whole sequences (flash kernels).
* ``attn_decode``   one query token (or a few) against a long KV cache, batched: the KV read dominates.
* ``embedding``     embedding-bag gathers over large tables, forward or forward+sparse backward.
* ``conv``          dense 2-D convolutions (channels-last, bf16), inference or training.
* ``dwconv``        depthwise 2-D convolutions (groups = channels), inference or training.
* ``cholesky``      fp64 Cholesky: batches of small matrices, or one large one.
* ``mlp_train``     small eager MLP training (fp32 or bf16 autocast), random width/depth/batch.
* ``gpt2_eager``    GPT-2-like training in eager PyTorch, fp32 or autocast, small to medium.
* ``elementwise``   framework elementwise/normalisation chains (layernorm, softmax, GELU, add).
* ``duty_mix``      compute / memory / idle phases alternating with a period of 1-5 s.

Ridge families (issue 13; weight 0: drawn only when FAMILIES names them, so the plans of earlier
seeds stay what they were). They aim at the region where the GPM-less model made its costly
errors -- work a few percent on the compute side of the ridge that NVML cannot tell from
memory-bound training (DLRM training, batch-256 decode, a skinny fp32 GEMM):

* ``gemm_ridge``    GEMMs with M from 16 to 1024 rows (log-uniform) on fp32, tf32, bf16, fp16:
                    weight streaming to just past the ridge.
* ``dlrm_mix``      DLRM-like recommender (embedding bags + bottom/top MLPs), random table count,
                    rows, width, bag and batch, training or inference: gather vs MLP share varies.
* ``decode_batch``  KV-cache decode of the 3.1B GQA GPT at batch 32-512: the weight-read /
                    matmul balance crosses the ridge around batch 100-300.

Later rounds' families, also weight 0: ``fresh.py`` (round 2's and 3's test families and ridge2),
``latency.py`` (``latency_chase``: latency-bound random chains, round 4's data plan) and
``fresh4.py`` (round 4's eight test families), ``fresh5.py`` (round 6's eight test families),
``fresh6.py`` (round 8's eight test families), ``fresh7.py`` (round 11's eight test families),
``fresh8.py`` (round 12's eight test families: framework workloads).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job, Workload
from h200_collect.workloads.fresh import (
    FRESH3_TEST,
    FRESH_TEST,
    fresh_intended,
    p_decode_wide,
    p_gemm_ridge2,
)
from h200_collect.workloads.fresh4 import FRESH4_TEST, fresh4_intended
from h200_collect.workloads.fresh5 import FRESH5_TEST, fresh5_intended
from h200_collect.workloads.fresh6 import FRESH6_TEST, fresh6_intended
from h200_collect.workloads.fresh7 import FRESH7_TEST, fresh7_intended
from h200_collect.workloads.fresh8 import FRESH8_TEST, fresh8_intended
from h200_collect.workloads.latency import LATENCY_TRAIN, chase_intended
from h200_collect.workloads.nets import b_gpt_decode
from h200_collect.workloads.sizing import HBM_BPS, STEP_S, loguniform

#: Rough H200 ceilings for sizing launches (not for labels): FLOP/s per pipe (HBM: sizing.py).
PEAK_FLOPS = {"fp32": 60e12, "fp64": 60e12, "fp16": 120e12, "bf16": 800e12, "fp8": 1500e12,
              "int8": 1500e12, "tf32": 400e12}
L2_BYTES = 50 << 20

FMA_SRC = r"""
extern "C" __global__ void fma_sweep(const REAL* __restrict__ x, REAL* __restrict__ y,
                                     const int* __restrict__ idx, long long n, long long n_launch,
                                     long long offset, int iters, int mode, long long stride) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_launch; i += step) {
        long long k = (offset + i) % n;
        long long j = mode == 0 ? k : (mode == 1 ? (k * stride) % n : (long long)idx[k]);
        REAL v = x[j];
        REAL a = MUL;
        REAL b = ADD;
        for (int r = 0; r < iters; ++r) { v = FMA; }
        y[k] = v;
    }
}
"""
#: dtype -> (C type, multiplier, addend, the FMA expression, bytes per element, FLOP per FMA)
FMA_TYPES: dict[str, tuple[str, str, str, str, int, int]] = {
    "fp32": ("float", "0.9999f", "0.0001f", "fmaf(v, a, b)", 4, 2),
    "fp64": ("double", "0.9999", "0.0001", "fma(v, a, b)", 8, 2),
    "fp16": ("__half2", "__float2half2_rn(0.999f)", "__float2half2_rn(0.001f)", "__hfma2(v, a, b)", 4, 4),
}
PATTERNS = ("stream", "strided", "gather")


def _reps_for(seconds_per_rep: float) -> int:
    return max(1, min(256, round(STEP_S / max(seconds_per_rep, 1e-6))))


# --------------------------------------------------------------------------- fma_sweep


def p_fma(rng: random.Random) -> dict[str, Any]:
    return {"dtype": rng.choice(list(FMA_TYPES)), "iters": round(loguniform(rng, 1, 1024)),
            "pattern": rng.choice(PATTERNS), "in_l2": rng.random() < 0.25,
            "ws_mib": round(loguniform(rng, 256, 4096)), "blocks": rng.choice([0, 0, 0, 0, 2, 8, 32]),
            "stride": rng.choice([3, 17, 33, 129])}


def b_fma(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        ctype, mul, add, fma, esize, flop_per = FMA_TYPES[p["dtype"]]
        ws = (8 << 20 if p["in_l2"] else p["ws_mib"] << 20) if not c.small else 1 << 16
        n = max(1024, ws // (2 * esize + (4 if p["pattern"] == "gather" else 0)))
        iters = int(p["iters"])
        bytes_per = 2 * esize + (4 if p["pattern"] == "gather" else 0)
        flop_each = flop_per * iters
        if not c.cuda:  # CPU check: the same arithmetic chain in torch, tiny
            x = t.rand(n, dtype=t.float64 if p["dtype"] == "fp64" else t.float32)
            idx = t.randperm(n)

            def ref() -> None:
                v = x[idx] if p["pattern"] == "gather" else x
                for _ in range(min(iters, 8)):
                    v = v * 0.9999 + 0.0001
            return Job(ref, float(n * flop_each), "FLOP", [x, idx])
        import cupy as cp

        head = "#include <cuda_fp16.h>\n" if p["dtype"] == "fp16" else ""  # only fp16 needs the header
        src = head + (FMA_SRC.replace("REAL", ctype).replace("MUL", mul).replace("ADD", add)
               .replace("FMA;", fma + ";"))
        kern = cp.RawKernel(src, "fma_sweep")
        cdt = {"fp32": cp.float32, "fp64": cp.float64, "fp16": cp.float32}[p["dtype"]]  # half2 = 4 B
        x = cp.random.random(n, dtype=cp.float64).astype(cdt)
        if p["dtype"] == "fp16":
            x = (cp.random.random(2 * n, dtype=cp.float32).astype(cp.float16)).view(cp.float32)
        y = cp.empty_like(x)
        idx = (cp.random.permutation(n).astype(cp.int32) if p["pattern"] == "gather"
               else cp.zeros(1, dtype=cp.int32))
        elem_s = max(bytes_per / HBM_BPS, flop_each / PEAK_FLOPS[p["dtype"]])
        blocks = int(p["blocks"]) or 132 * 8
        elem_s /= min(1.0, blocks * 256 / (132 * 2048))  # a tiny grid uses a fraction of the GPU
        n_launch = int(max(1024, min(n, 0.01 / elem_s)))
        reps = _reps_for(n_launch * elem_s)
        st = {"off": 0}

        def step() -> None:
            for _ in range(reps):
                kern((blocks,), (256,), (x, y, idx, cp.int64(n), cp.int64(n_launch), cp.int64(st["off"]),
                                         cp.int32(iters), cp.int32(PATTERNS.index(p["pattern"])),
                                         cp.int64(p["stride"])))
                st["off"] = (st["off"] + n_launch) % n
            cp.cuda.get_current_stream().synchronize()
        return Job(step, float(reps * n_launch * flop_each), "FLOP", [x, y, idx, kern])
    return build


# --------------------------------------------------------------------------- gemm_sweep


def p_gemm(rng: random.Random) -> dict[str, Any]:
    dt = rng.choice(["bf16", "bf16", "fp16", "fp8", "int8", "tf32", "fp32", "fp64"])
    return {"dtype": dt, "m": round(loguniform(rng, 1, 8192)), "k": rng.choice([2048, 4096, 8192, 16384]),
            "n": rng.choice([2048, 4096, 8192, 16384])}


def b_gemm_sweep(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dt = p["dtype"]
        k, n = (int(p["k"]), int(p["n"])) if not c.small else (64, 64)
        m = int(p["m"]) if not c.small else min(int(p["m"]), 64)
        if dt in ("fp8", "int8"):  # kernels need multiples of 16 (int8: more than 16 rows)
            m = max(32 if dt == "int8" else 16, (m + 15) // 16 * 16)
        if dt == "tf32":
            t.backends.cuda.matmul.allow_tf32 = True
        if dt == "int8" and c.cuda:
            a = t.randint(-127, 127, (m, k), dtype=t.int8, device=c.dev)
            b = t.randint(-127, 127, (k, n), dtype=t.int8, device=c.dev)
            def op() -> object: return t._int_mm(a, b)
        elif dt == "fp8" and c.cuda:
            a = t.randn(m, k, device=c.dev).to(t.float8_e4m3fn)
            b = t.randn(n, k, device=c.dev).to(t.float8_e4m3fn).t()
            one = t.tensor(1.0, device=c.dev)
            def op() -> object: return t._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16)
        else:
            dtype = c.dtype(dt) if dt not in ("fp8", "int8") else t.float32
            a = t.randn(m, k, device=c.dev, dtype=dtype)
            b = t.randn(k, n, device=c.dev, dtype=dtype)
            def op() -> object: return a @ b
        esize = {"fp8": 1, "int8": 1, "bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4, "fp64": 8}[dt]
        flop = 2.0 * m * k * n
        rep_s = max(esize * (m * k + k * n + m * n) / HBM_BPS, flop / PEAK_FLOPS.get(dt, 60e12))
        reps = _reps_for(rep_s) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                op()
        return Job(step, reps * flop, "FLOP", [a, b])
    return build


# --------------------------------------------------------------------------- attention


def p_attn_prefill(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([1, 2, 4, 8, 16]), "seq": rng.choice([512, 1024, 2048, 4096, 8192]),
            "heads": rng.choice([8, 16, 32]), "head_dim": rng.choice([64, 128]),
            "dtype": rng.choice(["bf16", "fp16"])}


def b_attn_prefill(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, T, H, D = int(p["batch"]), int(p["seq"]), int(p["heads"]), int(p["head_dim"])
        if c.small:
            B, T, H = 1, 64, 2
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        q, k, v = (t.randn(B, H, T, D, device=c.dev, dtype=dtype) for _ in range(3))
        F = t.nn.functional
        flop = 2.0 * B * H * T * T * D  # causal: half of 4*B*H*T^2*D
        reps = _reps_for(flop / 400e12) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return Job(step, reps * flop, "FLOP", [q, k, v])
    return build


def p_attn_decode(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([1, 4, 16, 32, 64, 128]),
            "ctx": rng.choice([2048, 8192, 32768, 65536, 131072]),
            "q_heads": rng.choice([32, 64]), "kv_heads": rng.choice([4, 8, 32]), "head_dim": 128,
            "q_len": rng.choice([1, 1, 1, 4])}


def b_attn_decode(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, L, Hq, Hk, D = (int(p[x]) for x in ("batch", "ctx", "q_heads", "kv_heads", "head_dim"))
        # keep the KV cache under ~40 GB: shorten the context for big batches
        while B * L * Hk * D * 2 * 2 > 40e9:
            L //= 2
        if c.small:
            B, L, Hq, Hk, D = 1, 128, 4, 2, 16
        Hk = min(Hk, Hq)
        dtype = t.bfloat16 if c.cuda else t.float32
        q = t.randn(B, Hq, int(p["q_len"]), D, device=c.dev, dtype=dtype)
        k = t.randn(B, Hk, L, D, device=c.dev, dtype=dtype)
        v = t.randn(B, Hk, L, D, device=c.dev, dtype=dtype)
        F = t.nn.functional
        kv_bytes = 2.0 * B * Hk * L * D * 2
        reps = _reps_for(kv_bytes / HBM_BPS) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=Hk != Hq)
        return Job(step, reps * kv_bytes, "B", [q, k, v])
    return build


# --------------------------------------------------------------------------- embeddings


def p_embedding(rng: random.Random) -> dict[str, Any]:
    return {"rows_m": rng.choice([1, 4, 16, 32]), "dim": rng.choice([32, 64, 128, 256, 512]),
            "batch": rng.choice([1024, 8192, 65536]), "bag": rng.choice([1, 8, 32, 128]),
            "mode": rng.choice(["sum", "mean"]), "train": rng.random() < 0.5}


def b_embedding(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        rows = int(p["rows_m"]) * 1_000_000 if not c.small else 1000
        dim, B, bag = int(p["dim"]), int(p["batch"]), int(p["bag"])
        while rows * dim * 4 > 16e9:  # the table stays under 16 GB
            rows //= 2
        if c.small:
            B = 64
        emb = t.nn.EmbeddingBag(rows, dim, mode=p["mode"], sparse=True, device=c.dev)
        opt = t.optim.SGD(emb.parameters(), lr=0.01)
        idx = t.randint(0, rows, (B * bag,), device=c.dev)
        offsets = t.arange(0, B * bag, bag, device=c.dev)
        nbytes = 4.0 * B * bag * dim

        def step() -> None:
            for _ in range(8):
                if p["train"]:
                    out = emb(idx, offsets)
                    opt.zero_grad(set_to_none=True)
                    out.sum().backward()
                    opt.step()
                else:
                    with t.no_grad():
                        emb(idx, offsets)
        return Job(step, 8 * nbytes, "B", [emb, opt, idx, offsets])
    return build


# --------------------------------------------------------------------------- convolutions


def p_conv(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([8, 32, 64, 128]), "ch": rng.choice([32, 64, 128, 256, 512]),
            "img": rng.choice([14, 28, 56, 112]), "k": rng.choice([1, 3, 3, 5]), "train": rng.random() < 0.5}


def p_dwconv(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([16, 32, 64, 128]), "ch": rng.choice([64, 128, 256, 512, 1024]),
            "img": rng.choice([14, 28, 56, 112]), "k": rng.choice([3, 5, 7]), "train": rng.random() < 0.5}


def b_conv(p: dict[str, Any], depthwise: bool) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, C, S, K = int(p["batch"]), int(p["ch"]), int(p["img"]), int(p["k"])
        mult = 3 if p["train"] else 1
        while B > 1 and (4 * 2.0 * B * S * S * C * K * K * (1 if depthwise else C) * mult / 200e12 > 0.3
                         or 4 * 3 * B * C * S * S * 2 * mult / HBM_BPS > 0.3):
            B //= 2  # one step (4 passes) stays under about a second
        if c.small:
            B, C, S = 2, 8, 16
        layers = []
        for _ in range(4):
            layers += [t.nn.Conv2d(C, C, K, padding=K // 2, groups=C if depthwise else 1, bias=False),
                       t.nn.BatchNorm2d(C), t.nn.ReLU()]
        net = t.nn.Sequential(*layers).to(c.dev).to(memory_format=t.channels_last)
        x = t.randn(B, C, S, S, device=c.dev).to(memory_format=t.channels_last)
        opt = t.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        flop = 4 * 2.0 * B * S * S * C * K * K * (1 if depthwise else C)

        def step() -> None:
            for _ in range(4):
                with c.autocast():
                    if p["train"]:
                        loss = net(x).float().square().mean()
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        opt.step()
                    else:
                        with t.no_grad():
                            net(x)
        return Job(step, 4 * flop * mult, "FLOP", [net, x, opt])
    return build


# --------------------------------------------------------------------------- Cholesky


def p_cholesky(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.7:
        return {"n": rng.choice([8, 16, 32, 64, 128, 256]), "batch": rng.choice([1024, 8192, 32768])}
    return {"n": rng.choice([4096, 8192, 16384]), "batch": 1}


def b_cholesky(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        n, B = int(p["n"]), int(p["batch"])
        while B * n * n * 8 > 8e9:  # at most ~8 GB of matrices
            B //= 2
        if c.small:
            n, B = min(n, 16), min(B, 8)
        a = t.randn(B, n, n, device=c.dev, dtype=t.float64)
        spd = a @ a.transpose(-1, -2) + n * t.eye(n, device=c.dev, dtype=t.float64)
        del a

        def step() -> None:
            t.linalg.cholesky(spd)
        return Job(step, B * n**3 / 3.0, "FLOP", [spd])
    return build


# --------------------------------------------------------------------------- training loops


def p_mlp(rng: random.Random) -> dict[str, Any]:
    return {"width": rng.choice([256, 512, 1024, 2048, 4096]), "depth": rng.choice([2, 3, 4, 6]),
            "batch": rng.choice([32, 128, 512, 2048, 8192]), "amp": rng.random() < 0.5}


def b_mlp(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        W, D, B = int(p["width"]), int(p["depth"]), int(p["batch"])
        if c.small:
            W, B = 32, 8
        with t.device(c.dev):
            net = c.nn.mlp([W] * (D + 1))
            x = t.randn(B, W)
        opt = t.optim.Adam(net.parameters(), lr=1e-4)

        def step() -> None:
            for _ in range(8):
                with c.autocast(bool(p["amp"])):
                    loss = net(x).float().square().mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return Job(step, 8 * 6.0 * B * W * W * D, "FLOP", [net, x, opt])
    return build


def p_gpt2(rng: random.Random) -> dict[str, Any]:
    return {"d": rng.choice([512, 768, 1024]), "layers": rng.choice([4, 6, 12]),
            "batch": rng.choice([1, 2, 4, 8, 16]), "seq": rng.choice([256, 512, 1024]),
            "amp": rng.random() < 0.5}


def b_gpt2(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    """GPT-2-like LM training in eager mode (no fused optimizer, fp32 or autocast)."""
    def build(c: Ctx) -> Job:
        t = c.torch
        d, L, B, S = int(p["d"]), int(p["layers"]), int(p["batch"]), int(p["seq"])
        if c.small:
            d, L, B, S = 64, 2, 2, 32
        while 6.0 * 12 * d * d * L * B * S / (150e12 if p["amp"] else 30e12) > 1.0 and B > 1:
            B //= 2  # one step stays under about a second
        while 6.0 * 12 * d * d * L * B * S / (150e12 if p["amp"] else 30e12) > 1.0 and S > 128:
            S //= 2
        heads = d // 64
        with t.device(c.dev):
            model = c.nn.GPT(50257 if not c.small else 512, d, L, heads, heads, 4 * d, None)
        opt = t.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)  # eager: one kernel per tensor
        ids = t.randint(0, model.vocab, (B, S + 1), device=c.dev)
        F = t.nn.functional

        def step() -> None:
            with c.autocast(bool(p["amp"])):
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, model.vocab).float(), ids[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        n_params = sum(q.numel() for q in model.parameters())
        return Job(step, 6.0 * n_params * B * S, "FLOP", [model, opt, ids])
    return build


# --------------------------------------------------------------------------- elementwise


def p_elementwise(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(["layernorm", "softmax", "gelu", "add", "adam_like"]),
            "mib": rng.choice([16, 64, 512, 2048, 8192]), "dtype": rng.choice(["bf16", "fp32"])}


def b_elementwise(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = 2 if p["dtype"] == "bf16" else 4
        n = (int(p["mib"]) << 20) // esize if not c.small else 1 << 12
        cols = 4096
        x = t.randn(max(1, n // cols), cols, device=c.dev, dtype=dtype)
        y = t.randn_like(x)
        F = t.nn.functional
        ops: dict[str, Callable[[], object]] = {
            "layernorm": lambda: F.layer_norm(x, (cols,)),
            "softmax": lambda: t.softmax(x, -1),
            "gelu": lambda: F.gelu(x),
            "add": lambda: x.add_(y, alpha=1e-6),
            "adam_like": lambda: (y.mul_(0.9).add_(x, alpha=0.1), x.addcdiv_(y, y.abs().add_(1e-8),
                                                                            value=-1e-6)),
        }
        op = ops[p["op"]]
        reps = _reps_for(3.0 * x.numel() * esize / HBM_BPS) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                op()
        return Job(step, reps * 3.0 * x.numel() * esize, "B", [x, y])
    return build


# --------------------------------------------------------------------------- duty cycles


def p_duty(rng: random.Random) -> dict[str, Any]:
    shares = [rng.random() for _ in range(3)]
    s = sum(shares)
    return {"period_s": round(rng.uniform(1.0, 5.0), 2), "compute": round(shares[0] / s, 3),
            "memory": round(shares[1] / s, 3), "idle": round(shares[2] / s, 3),
            "dtype": rng.choice(["bf16", "fp16", "fp64"])}


def b_duty(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    """Phases inside a repeating period: compute (square GEMM), memory (copy), idle (sleep)."""
    def build(c: Ctx) -> Job:
        t = c.torch
        m = 8192 if not c.small else 64
        a = t.randn(m, m, device=c.dev, dtype=c.dtype(p["dtype"]) if c.cuda else t.float32)
        x = t.randn((512 << 20) // 4 if not c.small else 4096, device=c.dev)
        y = t.empty_like(x)
        period = float(p["period_s"])
        c_end, m_end = float(p["compute"]), float(p["compute"]) + float(p["memory"])

        def step() -> None:
            phase = (c.elapsed() % period) / period
            if phase < c_end:
                a @ a
            elif phase < m_end:
                y.copy_(x)
            else:
                c.sleep(0.02)
        return Job(step, 0.0, "-", [a, x, y])
    return build


# --------------------------------------------------------------------------- ridge families (issue 13)


def p_gemm_ridge(rng: random.Random) -> dict[str, Any]:
    return {"dtype": rng.choice(["fp32", "fp32", "tf32", "bf16", "fp16"]),
            "m": round(loguniform(rng, 16, 1024)),
            "k": rng.choice([4096, 8192, 16384]), "n": rng.choice([4096, 8192, 16384])}


def p_dlrm_mix(rng: random.Random) -> dict[str, Any]:
    return {"tables": rng.choice([2, 4, 8, 16]), "rows_m": rng.choice([0.5, 1, 2, 4]),
            "dim": rng.choice([32, 64, 128, 256]), "batch": rng.choice([1024, 4096, 16384, 65536]),
            "bag": rng.choice([1, 4, 16, 64]), "train": rng.random() < 0.6}


def b_dlrm_mix(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        T, dim, B, bag = int(p["tables"]), int(p["dim"]), int(p["batch"]), int(p["bag"])
        rows = int(float(p["rows_m"]) * 1_000_000)
        while T * rows * dim * 4 > 24e9:  # the tables stay under 24 GB
            rows //= 2
        while B * bag * T * dim * 4 > 4e9 and B > 256:  # one batch's gathered rows under 4 GB
            B //= 2
        if c.small:
            T, rows, dim, B, bag = 2, 100, 8, 8, 2
        with t.device(c.dev):
            m = c.nn.DLRM(T, rows, dim)
        opt = t.optim.SGD(m.parameters(), lr=0.01)
        dense = t.randn(B, 13, device=c.dev)
        idx = t.randint(0, rows, (T, B * bag), device=c.dev)
        offsets = t.arange(0, B * bag, bag, device=c.dev)
        y = t.randint(0, 2, (B,), device=c.dev).float()
        F = t.nn.functional

        def step() -> None:
            for _ in range(4):
                if p["train"]:
                    loss = F.binary_cross_entropy_with_logits(m(dense, idx, offsets), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                else:
                    with t.no_grad():
                        m(dense, idx, offsets)
        return Job(step, 4.0 * B * bag * T * dim * 4, "B", [m, opt, dense, idx, offsets, y])
    return build


def p_decode_batch(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([32, 64, 96, 128, 192, 256, 384, 512]),
            "ctx": rng.choice([256, 512, 1024, 2048])}


def b_decode_batch(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    B, L = int(p["batch"]), int(p["ctx"])
    while B * (L + 128) > 512 * 1024 and L > 256:  # KV cache under ~34 GB
        L //= 2
    return b_gpt_decode(B, L, tokens=8)


# --------------------------------------------------------------------------- the plan


#: family -> (parameter sampler, builder factory, weight in the plan)
FAMILIES: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                          Callable[[dict[str, Any]], Callable[[Ctx], Job]], float]] = {
    "fma_sweep": (p_fma, b_fma, 3.0),
    "gemm_sweep": (p_gemm, b_gemm_sweep, 2.5),
    "attn_prefill": (p_attn_prefill, b_attn_prefill, 1.0),
    "attn_decode": (p_attn_decode, b_attn_decode, 1.2),
    "embedding": (p_embedding, b_embedding, 1.0),
    "conv": (p_conv, lambda p: b_conv(p, False), 1.0),
    "dwconv": (p_dwconv, lambda p: b_conv(p, True), 1.0),
    "cholesky": (p_cholesky, b_cholesky, 1.0),
    "mlp_train": (p_mlp, b_mlp, 1.0),
    "gpt2_eager": (p_gpt2, b_gpt2, 1.0),
    "elementwise": (p_elementwise, b_elementwise, 1.0),
    "duty_mix": (p_duty, b_duty, 1.2),
    # weight 0: only when FAMILIES names them (earlier seeds keep their plans)
    "gemm_ridge": (p_gemm_ridge, b_gemm_sweep, 0.0),
    "dlrm_mix": (p_dlrm_mix, b_dlrm_mix, 0.0),
    "decode_batch": (p_decode_batch, b_decode_batch, 0.0),
    # the second round's ridge training data and fresh test families (workloads/fresh.py), weight 0
    "gemm_ridge2": (p_gemm_ridge2, b_gemm_sweep, 0.0),
    "decode_wide": (p_decode_wide, b_decode_batch, 0.0),
    **{name: (sample, factory, 0.0) for name, (sample, factory) in (FRESH_TEST | FRESH3_TEST).items()},
    # round 4: the latency-bound training sweep (latency.py) and the test families (fresh4.py), weight 0
    **{name: (sample, factory, 0.0) for name, (sample, factory) in (LATENCY_TRAIN | FRESH4_TEST).items()},
    # round 6: the test families (fresh5.py), weight 0
    **{name: (sample, factory, 0.0) for name, (sample, factory) in FRESH5_TEST.items()},
    # round 8: the test families (fresh6.py), weight 0
    **{name: (sample, factory, 0.0) for name, (sample, factory) in FRESH6_TEST.items()},
    # round 11: the test families (fresh7.py), weight 0
    **{name: (sample, factory, 0.0) for name, (sample, factory) in FRESH7_TEST.items()},
    # round 12: the test families (fresh8.py), weight 0
    **{name: (sample, factory, 0.0) for name, (sample, factory) in FRESH8_TEST.items()},
}


def intended_label(family: str, p: dict[str, Any]) -> str:
    """What the run was built to be (informational: the GPM rule gives the truth)."""
    if family == "fma_sweep":
        ridge = {"fp32": 15.0, "fp64": 15.0, "fp16": 30.0}[p["dtype"]]
        esize = FMA_TYPES[p["dtype"]][4]
        ai = FMA_TYPES[p["dtype"]][5] * p["iters"] / (2 * esize)
        return "compute" if ai > ridge else "memory"
    if family in ("gemm_sweep", "gemm_ridge"):
        return "compute" if p["m"] >= 256 else "memory"
    if family == "decode_batch":
        return "compute" if p["batch"] >= 192 else "memory"
    if family == "duty_mix":
        return "mixed"
    if family in LATENCY_TRAIN:
        return chase_intended(p)
    if family in FRESH4_TEST:
        return fresh4_intended(family, p)
    if family in FRESH5_TEST:
        return fresh5_intended(family, p)
    if family in FRESH6_TEST:
        return fresh6_intended(family, p)
    if family in FRESH7_TEST:
        return fresh7_intended(family, p)
    if family in FRESH8_TEST:
        return fresh8_intended(family, p)
    if family in FRESH_TEST or family in FRESH3_TEST or family in ("gemm_ridge2", "decode_wide"):
        return fresh_intended(family, p)
    if family in ("attn_prefill", "conv", "mlp_train", "gpt2_eager"):
        return "compute"
    if family == "cholesky":
        return "compute" if p["n"] >= 4096 else "memory"
    return "memory"


def plan(seed: int, count: int, families: tuple[str, ...] = ()) -> list[Workload]:
    """``count`` randomised runs (weighted family choice, random parameters and duration)."""
    rng = random.Random(seed)
    names = [f for f in FAMILIES if not families or f in families]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"FAMILIES names unknown sweep families: {', '.join(unknown)} "
                         f"(known: {', '.join(FAMILIES)})")
    # a family named in FAMILIES is drawn even if its plan weight is 0 (the ridge families)
    weights = [FAMILIES[f][2] or (1.0 if families else 0.0) for f in names]
    out: list[Workload] = []
    for i in range(count):
        fam = rng.choices(names, weights)[0]
        sample, factory, _ = FAMILIES[fam]
        p = sample(rng)
        dur = round(rng.uniform(8.0, 12.0), 1)
        desc = " ".join(f"{k}={v}" for k, v in p.items())
        out.append(Workload(f"{fam}_s{seed}_{i:03d}", intended_label(fam, p), fam, desc, factory(p),
                            params=p, dur=dur))
    return out
