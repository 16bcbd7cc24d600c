"""Families recorded as a fresh test set (issue 13, second round): kinds of work no model here saw.

Why: every earlier test set shared its authors' view of the space (GEMMs, attention, embeddings,
convolutions, the ridge families). A classifier that holds only there would fail at a site whose
jobs are something else. These families are new *kinds* of work -- mixture-of-experts layers,
whole transformer layers served at every batch x sequence shape, sparse and graph kernels, sorts
and scans, 3-D convolutions, cache-resident elementwise chains -- drawn at random around their
own ridges, recorded after the model of that round was chosen, and scored once. The GPM rule on
the device decides each run's truth, whatever the family intended.

* ``moe_experts``       batched expert MLPs (bmm, bf16): 8-64 experts, 4-2048 tokens per expert,
                        so the weight-read / matmul balance crosses the ridge inside the family.
* ``transformer_infer`` torch's TransformerEncoderLayer (norm first, bf16, inference) at batch
                        1-64 x sequence 1-2048: decode-like to prefill-like.
* ``sparse_spmm``       CSR sparse (fp32) x dense: graph/science kernels, 4-64 nonzeros per row.
* ``gnn_message``       message passing: gather node features by edge, scale, scatter-add.
* ``sort_scan``         sort, argsort, cumsum, top-k and bincount over 16-256 M elements.
* ``conv3d``            3-D convolutions (volumes 32-96^3, bf16 or tf32), inference or training.
* ``l2_chain``          an eager chain of elementwise ops on a tensor that fits in L2 or not.

Round 3's test families (``FRESH3_TEST``; recorded once the round-2 test set had been scored and
joined the training data): ``lm_head`` (vocabulary projection + cross-entropy, 1-8192 tokens),
``woq_gemm`` (int8 weight-only-quantised layers, dequantised per step), ``knn_search`` (cdist +
top-k), ``attn_math`` (attention with the score matrix materialised), ``ssm_scan`` (a
state-space / linear-recurrence scan in eager PyTorch), ``image_resize`` (interpolation +
normalisation).

Ridge training data (the second round's data plan; not a test family):

* ``gemm_ridge2``       fp32 / tf32 GEMMs with 96-1536 rows: just on either side of the ridge.
* ``decode_wide``       KV-cache decode of the 3.1B GPT at batch 512-2048 and short contexts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.workloads.sizing import HBM_BPS, STEP_S, loguniform


def _reps(seconds_per_rep: float) -> int:
    return max(1, min(2000, int(STEP_S / max(seconds_per_rep, 1e-7))))


# --------------------------------------------------------------------------- mixture of experts


def p_moe(rng: random.Random) -> dict[str, Any]:
    return {"experts": rng.choice([8, 16, 32, 64]), "tokens": round(loguniform(rng, 4, 2048)),
            "d": rng.choice([1024, 2048, 4096]), "ffn_mult": rng.choice([2, 4])}


def b_moe(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        E, T, d = int(p["experts"]), int(p["tokens"]), int(p["d"])
        f = d * int(p["ffn_mult"])
        while 2 * E * d * f * 2 > 24e9 and E > 2:  # both weight stacks under 24 GB
            E //= 2
        if c.small:
            E, T, d, f = 2, 4, 16, 32
        dtype = t.bfloat16 if c.cuda else t.float32
        x = t.randn(E, T, d, device=c.dev, dtype=dtype)
        w1 = t.randn(E, d, f, device=c.dev, dtype=dtype) * 0.02
        w2 = t.randn(E, f, d, device=c.dev, dtype=dtype) * 0.02
        F = t.nn.functional
        flop = 4.0 * E * T * d * f
        rep_s = max(2.0 * E * d * f * 2 / HBM_BPS, flop / 700e12)
        reps = _reps(rep_s) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                t.bmm(F.gelu(t.bmm(x, w1)), w2)
        return Job(step, reps * flop, "FLOP", [x, w1, w2])
    return build


# --------------------------------------------------------------------------- transformer serving


def p_transformer(rng: random.Random) -> dict[str, Any]:
    return {"d": rng.choice([1024, 2048, 4096]), "batch": rng.choice([1, 2, 4, 8, 16, 32, 64]),
            "seq": rng.choice([1, 4, 16, 64, 256, 1024, 2048]), "layers": rng.choice([2, 4])}


def b_transformer(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        d, B, S, n_layers = int(p["d"]), int(p["batch"]), int(p["seq"]), int(p["layers"])
        while B * S > 32768 and S > 1:
            S //= 2
        if c.small:
            d, B, S, n_layers = 64, 1, 4, 1
        dtype = t.bfloat16 if c.cuda else t.float32
        layers = t.nn.ModuleList(
            t.nn.TransformerEncoderLayer(d, max(1, d // 128), 4 * d, batch_first=True, norm_first=True,
                                         activation="gelu", dropout=0.0)
            for _ in range(n_layers)).to(device=c.dev, dtype=dtype).eval()
        x = t.randn(B, S, d, device=c.dev, dtype=dtype)
        flop = n_layers * (24.0 * B * S * d * d + 4.0 * B * S * S * d)
        rep_s = max(n_layers * 12.0 * d * d * 2 / HBM_BPS, flop / 500e12, 20e-6 * 10 * n_layers)
        reps = _reps(rep_s) if c.cuda else 1

        def step() -> None:
            with t.no_grad():
                for _ in range(reps):
                    y = x
                    for layer in layers:
                        y = layer(y)
        return Job(step, reps * flop, "FLOP", [layers, x])
    return build


# --------------------------------------------------------------------------- sparse and graphs


def p_spmm(rng: random.Random) -> dict[str, Any]:
    return {"rows_k": rng.choice([64, 256, 1024, 4096]), "nnz_per_row": rng.choice([4, 8, 16, 32, 64]),
            "cols": rng.choice([1, 8, 32, 128]), "pattern": rng.choice(["random", "banded"])}


def b_spmm(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        n, k, cols = int(p["rows_k"]) * 1024, int(p["nnz_per_row"]), int(p["cols"])
        while n * k > 128 * 1024 * 1024:
            n //= 2
        if c.small:
            n, k, cols = 256, 4, 2
        crow = t.arange(0, n * k + 1, k, device=c.dev, dtype=t.int64)
        if p["pattern"] == "banded":
            base = t.arange(n, device=c.dev).repeat_interleave(k)
            col = (base + t.randint(-64, 64, (n * k,), device=c.dev)).clamp_(0, n - 1)
        else:
            col = t.randint(0, n, (n * k,), device=c.dev)
        val = t.rand(n * k, device=c.dev)
        a = t.sparse_csr_tensor(crow, col, val, (n, n))
        x = t.randn(n, cols, device=c.dev)
        nbytes = n * k * (4 + 8 + 4 * cols) + 4.0 * n * cols
        reps = _reps(nbytes / (HBM_BPS / 4)) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                a @ x
        return Job(step, reps * nbytes, "B", [a, x, crow, col, val])
    return build


def p_gnn(rng: random.Random) -> dict[str, Any]:
    return {"nodes_m": rng.choice([0.25, 1, 4]), "degree": rng.choice([4, 16, 32]),
            "feat": rng.choice([16, 64, 128, 256]), "dtype": rng.choice(["fp32", "bf16"])}


def b_gnn(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        n, deg, f = int(float(p["nodes_m"]) * 1_000_000), int(p["degree"]), int(p["feat"])
        while n * deg * f * 4 > 8e9 and deg > 1:  # the gathered messages stay under 8 GB
            deg //= 2
        if c.small:
            n, deg, f = 100, 2, 4
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        x = t.randn(n, f, device=c.dev, dtype=dtype)
        src = t.randint(0, n, (n * deg,), device=c.dev)
        dst = t.randint(0, n, (n * deg,), device=c.dev)
        w = t.rand(n * deg, 1, device=c.dev, dtype=dtype)
        out = t.zeros(n, f, device=c.dev, dtype=dtype)
        nbytes = n * deg * (16.0 + 3 * f * x.element_size())
        reps = _reps(nbytes / (HBM_BPS / 3)) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                out.zero_()
                out.index_add_(0, dst, x.index_select(0, src) * w)
        return Job(step, reps * nbytes, "B", [x, src, dst, w, out])
    return build


# --------------------------------------------------------------------------- sorts and scans


def p_sort(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(["sort", "argsort", "cumsum", "topk", "bincount"]),
            "n_m": rng.choice([16, 64, 256]), "dtype": rng.choice(["fp32", "int64"])}


def b_sort(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        n = int(p["n_m"]) * 1_000_000 if not c.small else 1000
        if p["dtype"] == "int64" or p["op"] == "bincount":
            x = t.randint(0, 1 << 20, (n,), device=c.dev, dtype=t.int64)
        else:
            x = t.rand(n, device=c.dev)
        op = p["op"]

        def once() -> None:
            if op == "sort":
                t.sort(x)
            elif op == "argsort":
                t.argsort(x)
            elif op == "cumsum":
                t.cumsum(x, 0)
            elif op == "topk":
                t.topk(x.float(), 1000)
            else:
                t.bincount(x, minlength=1 << 20)
        nbytes = 2.0 * n * x.element_size()
        reps = _reps(nbytes * (8 if op in ("sort", "argsort") else 1) / HBM_BPS) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                once()
        return Job(step, reps * nbytes, "B", [x])
    return build


# --------------------------------------------------------------------------- 3-D convolutions


def p_conv3d(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([1, 2, 4, 8]), "ch": rng.choice([16, 32, 64, 128]),
            "vol": rng.choice([32, 48, 64, 96]), "dtype": rng.choice(["bf16", "tf32"]),
            "train": rng.random() < 0.5}


def b_conv3d(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, C, V = int(p["batch"]), int(p["ch"]), int(p["vol"])
        if c.small:
            B, C, V = 1, 4, 8
        if p["dtype"] == "tf32":
            t.backends.cuda.matmul.allow_tf32 = True
            t.backends.cudnn.allow_tf32 = True
        dtype = t.bfloat16 if (c.cuda and p["dtype"] == "bf16") else t.float32
        net = t.nn.Sequential(t.nn.Conv3d(C, C, 3, padding=1), t.nn.ReLU(),
                              t.nn.Conv3d(C, C, 3, padding=1)).to(device=c.dev, dtype=dtype)
        x = t.randn(B, C, V, V, V, device=c.dev, dtype=dtype, requires_grad=bool(p["train"]))
        opt = t.optim.SGD(net.parameters(), lr=1e-3)
        flop = (3.0 if p["train"] else 1.0) * 2 * 2 * B * C * C * 27 * V ** 3

        def step() -> None:
            if p["train"]:
                opt.zero_grad(set_to_none=True)
                net(x).float().square().mean().backward()
                opt.step()
            else:
                with t.no_grad():
                    net(x)
        return Job(step, flop, "FLOP", [net, x, opt])
    return build


# --------------------------------------------------------------------------- cache-resident chains


def p_l2chain(rng: random.Random) -> dict[str, Any]:
    return {"mib": rng.choice([2, 8, 24, 96, 512, 2048]), "ops": rng.choice([8, 32]),
            "dtype": rng.choice(["fp32", "bf16"])}


def b_l2chain(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = 4 if p["dtype"] == "fp32" else 2
        n = int(p["mib"]) * (1 << 20) // esize if not c.small else 1000
        x = t.rand(n, device=c.dev, dtype=dtype)
        y = t.empty_like(x)
        n_ops = int(p["ops"])

        def step() -> None:
            for _ in range(max(1, 64 // n_ops) if c.cuda else 1):
                y.copy_(x)
                for i in range(n_ops):
                    if i % 4 == 0:
                        y.mul_(0.999)
                    elif i % 4 == 1:
                        y.add_(0.001)
                    elif i % 4 == 2:
                        t.sin(y, out=y)
                    else:
                        y.clamp_(-1.0, 1.0)
        return Job(step, 0.0, "-", [x, y])
    return build


# --------------------------------------------------------------------------- ridge training data


def p_gemm_ridge2(rng: random.Random) -> dict[str, Any]:
    return {"dtype": rng.choice(["fp32", "tf32"]), "m": round(loguniform(rng, 96, 1536)),
            "k": rng.choice([4096, 8192, 16384]), "n": rng.choice([4096, 8192, 16384])}


def p_decode_wide(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([512, 768, 1024, 1536, 2048]), "ctx": rng.choice([32, 64, 128, 256])}


#: family -> (parameter sampler, builder factory, what it was built to be): test families first
FRESH_TEST: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                            Callable[[dict[str, Any]], Callable[[Ctx], Job]]]] = {
    "moe_experts": (p_moe, b_moe),
    "transformer_infer": (p_transformer, b_transformer),
    "sparse_spmm": (p_spmm, b_spmm),
    "gnn_message": (p_gnn, b_gnn),
    "sort_scan": (p_sort, b_sort),
    "conv3d": (p_conv3d, b_conv3d),
    "l2_chain": (p_l2chain, b_l2chain),
}


def fresh_intended(family: str, p: dict[str, Any]) -> str:
    """What a fresh run was built to be (informational: the GPM rule gives the truth)."""
    if family == "moe_experts":
        return "compute" if int(p["tokens"]) >= 300 else "memory"
    if family == "transformer_infer":
        return "compute" if int(p["batch"]) * int(p["seq"]) >= 512 else "memory"
    if family == "conv3d":
        return "compute" if int(p["ch"]) >= 64 else "memory"
    if family == "gemm_ridge2":
        return "compute" if int(p["m"]) >= 256 else "memory"
    if family == "decode_wide":
        return "compute"
    if family == "lm_head":
        return "compute" if int(p["tokens"]) >= 256 else "memory"
    if family == "woq_gemm":
        return "compute" if int(p["tokens"]) >= 256 else "memory"
    if family == "knn_search":
        return "compute" if int(p["dim"]) >= 128 else "memory"
    if family == "attn_math":
        return "compute" if int(p["seq"]) >= 1024 else "memory"
    return "memory"


# --------------------------------------------------------------------------- round 3 test families


def p_lm_head(rng: random.Random) -> dict[str, Any]:
    return {"hidden": rng.choice([1024, 2048, 4096]), "vocab": rng.choice([32000, 50257, 128256]),
            "tokens": round(loguniform(rng, 1, 8192)), "train": rng.random() < 0.5}


def b_lm_head(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        h, V, T = int(p["hidden"]), int(p["vocab"]), int(p["tokens"])
        if c.small:
            h, V, T = 16, 50, 4
        dtype = t.bfloat16 if c.cuda else t.float32
        w = (t.randn(V, h, device=c.dev, dtype=dtype) * 0.02).requires_grad_(bool(p["train"]))
        x = t.randn(T, h, device=c.dev, dtype=dtype, requires_grad=bool(p["train"]))
        y = t.randint(0, V, (T,), device=c.dev)
        F = t.nn.functional
        flop = (3.0 if p["train"] else 1.0) * 2 * T * h * V
        reps = _reps(max(V * h * 2 / HBM_BPS, flop / 500e12)) if c.cuda else 1

        def step() -> None:
            for _ in range(reps):
                loss = F.cross_entropy((x @ w.t()).float(), y)
                if p["train"]:
                    loss.backward()
                    w.grad = None
                    x.grad = None
        return Job(step, reps * flop, "FLOP", [w, x, y])
    return build


def p_woq(rng: random.Random) -> dict[str, Any]:
    return {"tokens": round(loguniform(rng, 1, 1024)), "k": rng.choice([4096, 8192]),
            "n": rng.choice([4096, 11008, 14336]), "layers": rng.choice([2, 4])}


def b_woq(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        M, k, n, L = int(p["tokens"]), int(p["k"]), int(p["n"]), int(p["layers"])
        if c.small:
            M, k, n, L = 2, 16, 32, 1
        dtype = t.bfloat16 if c.cuda else t.float32
        ws = [t.randint(-127, 127, (n, k), dtype=t.int8, device=c.dev) for _ in range(L)]
        scales = [t.rand(n, 1, device=c.dev, dtype=dtype) * 0.01 for _ in range(L)]
        x = t.randn(M, k, device=c.dev, dtype=dtype)
        flop = 2.0 * M * k * n * L

        def step() -> None:
            for w, sc in zip(ws, scales, strict=True):
                x @ (w.to(dtype) * sc).t()
        return Job(step, flop, "FLOP", [ws, scales, x])
    return build


def p_knn(rng: random.Random) -> dict[str, Any]:
    return {"queries": rng.choice([1024, 8192, 65536]), "base_k": rng.choice([64, 256, 1024]),
            "dim": rng.choice([8, 32, 128, 512]), "dtype": rng.choice(["fp32", "bf16"])}


def b_knn(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        Q, N, D = int(p["queries"]), int(p["base_k"]) * 1024, int(p["dim"])
        if c.small:
            Q, N, D = 8, 64, 4
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        base = t.randn(N, D, device=c.dev, dtype=dtype)
        q = t.randn(Q, D, device=c.dev, dtype=dtype)
        chunk = max(1, min(Q, int(1e9 // (N * 4))))  # one chunk's distances under ~1 GB

        base_sq = (base.float() ** 2).sum(1).to(dtype)

        def step() -> None:
            for i in range(0, Q, chunk):  # squared distances as matmul (cdist's large-size path)
                qc = q[i:i + chunk]
                d2 = base_sq - 2.0 * (qc @ base.t())
                t.topk(d2, 10, largest=False)
        return Job(step, 2.0 * Q * N * D, "FLOP", [base, q, base_sq])
    return build


def p_attn_math(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([1, 4, 16]), "heads": rng.choice([8, 16, 32]),
            "seq": rng.choice([128, 512, 1024, 2048, 4096]), "head_dim": rng.choice([64, 128]),
            "causal": rng.random() < 0.5}


def b_attn_math(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, H, T, D = int(p["batch"]), int(p["heads"]), int(p["seq"]), int(p["head_dim"])
        while B * H * T * T * 2 > 8e9 and B > 1:  # the score matrix under 8 GB
            B //= 2
        while B * H * T * T * 2 > 8e9 and H > 1:
            H //= 2
        if c.small:
            B, H, T, D = 1, 2, 16, 8
        dtype = t.bfloat16 if c.cuda else t.float32
        q, k, v = (t.randn(B, H, T, D, device=c.dev, dtype=dtype) for _ in range(3))
        mask = t.ones(T, T, device=c.dev, dtype=t.bool).triu(1) if p["causal"] else None
        scale = 1.0 / math.sqrt(D)

        def step() -> None:
            s = (q @ k.transpose(-1, -2)) * scale
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            s.softmax(-1) @ v
        return Job(step, 4.0 * B * H * T * T * D, "FLOP", [q, k, v, mask])
    return build


def p_ssm(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([1, 4, 16]), "length": rng.choice([1024, 4096, 16384]),
            "dim": rng.choice([256, 1024, 2048]), "proj": rng.random() < 0.5}


def b_ssm(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, L, D = int(p["batch"]), int(p["length"]), int(p["dim"])
        while B * L * D * 4 > 2e9 and L > 256:
            L //= 2
        if c.small:
            B, L, D = 1, 16, 8
        x = t.randn(B, L, D, device=c.dev)
        gate = t.randn(B, L, D, device=c.dev)
        w_in = t.randn(D, 2 * D, device=c.dev, dtype=t.bfloat16 if c.cuda else t.float32) * 0.02
        F = t.nn.functional

        def step() -> None:
            u = x
            if p["proj"]:
                u = (x.to(w_in.dtype) @ w_in).float()[..., :D]
            log_a = F.logsigmoid(gate)
            cum = t.cumsum(log_a, 1)
            h = t.exp(cum) * t.cumsum(u * t.exp(-cum.clamp(min=-30)), 1)
            (h * F.silu(gate)).sum()
        return Job(step, 0.0, "-", [x, gate, w_in])
    return build


def p_resize(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([8, 32, 64]), "ch": rng.choice([3, 16, 64]),
            "size": rng.choice([256, 512, 1024]), "scale": rng.choice([0.5, 2.0]),
            "mode": rng.choice(["nearest", "bilinear", "bicubic"])}


def b_resize(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, C, S = int(p["batch"]), int(p["ch"]), int(p["size"])
        while B * C * S * S * 4 * max(1.0, float(p["scale"]) ** 2) > 4e9 and B > 1:
            B //= 2
        if c.small:
            B, C, S = 1, 3, 16
        x = t.rand(B, C, S, S, device=c.dev)
        mean = t.rand(1, C, 1, 1, device=c.dev)
        F = t.nn.functional
        mode = str(p["mode"])
        kw = {} if mode == "nearest" else {"align_corners": False}

        def step() -> None:
            y = F.interpolate(x, scale_factor=float(p["scale"]), mode=mode, **kw)
            ((y - mean) / 0.25).clamp_(-3, 3)
        return Job(step, 0.0, "-", [x, mean])
    return build


#: the third round's test families (recorded after round 2's test set was used for training)
FRESH3_TEST: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                             Callable[[dict[str, Any]], Callable[[Ctx], Job]]]] = {
    "lm_head": (p_lm_head, b_lm_head),
    "woq_gemm": (p_woq, b_woq),
    "knn_search": (p_knn, b_knn),
    "attn_math": (p_attn_math, b_attn_math),
    "ssm_scan": (p_ssm, b_ssm),
    "image_resize": (p_resize, b_resize),
}
