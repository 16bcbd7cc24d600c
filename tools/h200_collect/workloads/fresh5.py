"""Round 6's test families (issue 13): kinds of work that no earlier set, training or test, holds.

Why: round 6's candidate (the shipped model plus an "unsure" for jobs whose NVML readings sit among
training jobs of both labels) is chosen on the ten development folders by leave-one-set-out, so its
test needs kinds of work nobody trained on or looked at. Written by the lead, recorded after the
candidate's rule was registered (docs/measurements/issue13-preregistration-round6-2026-11-30.md),
scored once. The GPM rule on the device decides each run's truth, whatever the family intended.

* ``norm_softmax``    normalisation kernels over activations (layer norm, RMS norm, softmax,
                      log-softmax, group norm), forward or forward and backward, 256-64k columns.
* ``topk_select``     ``torch.topk`` (k 1-1024) along rows of 1k-16M elements: selection, radix
                      passes over the data.
* ``complex_gemm``    complex64 batched matrix products (n 64-4096): fp32 pipes, four real
                      products per complex one.
* ``conv1d_audio``    stacks of 1-D convolutions (kernel 3-31, 32-1024 channels, 1k-64k samples)
                      as in speech and audio models, inference or training.
* ``einsum_contract`` tensor contractions by ``torch.einsum`` (attention scores, batched chains,
                      multi-index contractions) at random sizes.
* ``pooling``         max, average and adaptive pooling (2-D and 3-D, kernel 2-7) over large
                      activations.
* ``grid_sample``     ``grid_sample`` (bilinear or nearest, random or affine grids) as in spatial
                      transformers and optical flow: data-dependent gathers.
* ``grouped_conv``    grouped 2-D convolutions (2-32 groups, ResNeXt-style), inference or training.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.workloads.fresh4 import _job
from h200_collect.workloads.sizing import loguniform

# --------------------------------------------------------------------------- normalisation


def p_norm(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(["layer_norm", "rms_norm", "softmax", "log_softmax", "group_norm"]),
            "cols": rng.choice([256, 1024, 4096, 16384, 65536]), "mib": round(loguniform(rng, 64, 4096)),
            "dtype": rng.choice(["bf16", "fp32"]), "backward": rng.random() < 0.4}


def b_norm(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        F = t.nn.functional
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = 2 if p["dtype"] == "bf16" else 4
        cols = int(p["cols"]) if not c.small else 16
        rows = max(1, (int(p["mib"]) << 20) // (cols * esize)) if not c.small else 8
        if p["backward"]:
            rows = max(1, rows // 3)  # the gradient and the saved statistics beside the input
        x = t.randn(rows, cols, device=c.dev, dtype=dtype, requires_grad=bool(p["backward"]))
        w = t.ones(cols, device=c.dev, dtype=dtype)
        groups = 8 if cols % 8 == 0 else 1
        fwd: dict[str, Callable[[], Any]] = {
            "layer_norm": lambda: F.layer_norm(x, (cols,), w, None),
            "rms_norm": lambda: x * t.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6).to(dtype) * w,
            "softmax": lambda: t.softmax(x, -1),
            "log_softmax": lambda: t.log_softmax(x, -1),
            "group_norm": lambda: F.group_norm(x.view(rows, groups, cols // groups), groups),
        }
        f = fwd[p["op"]]
        if p["backward"]:
            def op() -> None:
                f().float().sum().backward()
        else:
            def op() -> None:
                with t.no_grad():
                    f()
        return _job(c, op, [x, w], float(rows * cols * esize * (4 if p["backward"] else 2)), "B")
    return build


# --------------------------------------------------------------------------- selection


def p_topk(rng: random.Random) -> dict[str, Any]:
    return {"row": round(loguniform(rng, 1 << 10, 1 << 24)), "k": rng.choice([1, 8, 64, 256, 1024]),
            "mib": round(loguniform(rng, 16, 2048)), "dtype": rng.choice(["bf16", "fp32"])}


def b_topk(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = 2 if p["dtype"] == "bf16" else 4
        row = int(p["row"]) if not c.small else 256
        rows = max(1, (int(p["mib"]) << 20) // (row * esize)) if not c.small else 2
        k = min(int(p["k"]), row)
        x = t.randn(rows, row, device=c.dev, dtype=dtype)
        return _job(c, lambda: t.topk(x, k, dim=-1), [x], float(rows * row * esize), "B")
    return build


# --------------------------------------------------------------------------- complex GEMM


def p_cgemm(rng: random.Random) -> dict[str, Any]:
    return {"n": rng.choice([64, 128, 256, 512, 1024, 2048, 4096]), "mib": round(loguniform(rng, 16, 1024))}


def b_cgemm(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        n = int(p["n"]) if not c.small else 8
        batch = max(1, (int(p["mib"]) << 20) // (3 * n * n * 8)) if not c.small else 2
        a = t.randn(batch, n, n, device=c.dev, dtype=t.complex64)
        b = t.randn(batch, n, n, device=c.dev, dtype=t.complex64)
        return _job(c, lambda: t.bmm(a, b), [a, b], 8.0 * batch * n ** 3, "FLOP")
    return build


# --------------------------------------------------------------------------- 1-D convolutions


def p_conv1d(rng: random.Random) -> dict[str, Any]:
    return {"ch": rng.choice([32, 64, 128, 256, 512, 1024]), "k": rng.choice([3, 5, 11, 31]),
            "length": rng.choice([1024, 4096, 16384, 65536]), "batch": rng.choice([1, 4, 16, 64]),
            "train": rng.random() < 0.4}


def b_conv1d(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        nn = t.nn
        ch, k, length, batch = int(p["ch"]), int(p["k"]), int(p["length"]), int(p["batch"])
        while batch * ch * length * 2 * 12 > 20e9 and batch > 1:  # activations kept for backward
            batch //= 2
        if c.small:
            ch, length, batch = 4, 64, 1
        dtype = t.bfloat16 if c.cuda else t.float32
        net = nn.Sequential(*[m for _ in range(4) for m in (nn.Conv1d(ch, ch, k, padding=k // 2), nn.GELU())])
        net = net.to(device=c.dev, dtype=dtype)
        x = t.randn(batch, ch, length, device=c.dev, dtype=dtype, requires_grad=bool(p["train"]))
        if p["train"]:
            def op() -> None:
                net(x).float().square().mean().backward()
        else:
            def op() -> None:
                with t.no_grad():
                    net(x)
        flop = 2.0 * batch * length * ch * ch * k * 4 * (3 if p["train"] else 1)
        return _job(c, op, [net, x], flop, "FLOP")
    return build


# --------------------------------------------------------------------------- contractions


EINSUMS = ("bhqd,bhkd->bhqk", "abc,cd->abd", "ijk,jkl->il", "bij,bjk->bik", "abcd,cd->ab")


def p_einsum(rng: random.Random) -> dict[str, Any]:
    return {"eq": rng.randrange(len(EINSUMS)), "n": rng.choice([16, 32, 64, 128, 256, 512]),
            "dtype": rng.choice(["bf16", "fp32"]), "mib": round(loguniform(rng, 16, 1024))}


def b_einsum(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = 2 if p["dtype"] == "bf16" else 4
        n = int(p["n"]) if not c.small else 4
        elems = max(n, (int(p["mib"]) << 20) // esize) if not c.small else 256
        eq = EINSUMS[int(p["eq"])]
        lead = max(1, elems // (n ** 3))  # the free (batch-like) extent that fills the budget

        def r(*shape: int) -> Any:
            return t.randn(*shape, device=c.dev, dtype=dtype)
        if eq == "bhqd,bhkd->bhqk":
            ops = (r(lead, 1, n, n), r(lead, 1, n, n))
            flop = 2.0 * lead * n ** 3
        elif eq == "abc,cd->abd":
            ops = (r(lead, n, n), r(n, n))
            flop = 2.0 * lead * n ** 3
        elif eq == "ijk,jkl->il":
            m = max(1, min(n, round((elems / 2) ** (1 / 3))))
            ops = (r(m, m, m), r(m, m, m))
            flop, n = 2.0 * m ** 4, m
        elif eq == "bij,bjk->bik":
            ops = (r(lead, n, n), r(lead, n, n))
            flop = 2.0 * lead * n ** 3
        else:
            ops = (r(max(1, lead), n, n, n) if not c.small else r(2, n, n, n), r(n, n))
            flop = 2.0 * ops[0].numel()
        return _job(c, lambda: t.einsum(eq, *ops), list(ops), flop, "FLOP")
    return build


# --------------------------------------------------------------------------- pooling


def p_pool(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(["max2d", "avg2d", "adaptive_avg2d", "max3d"]), "k": rng.choice([2, 3, 5, 7]),
            "mib": round(loguniform(rng, 64, 4096)), "dtype": rng.choice(["bf16", "fp32"]),
            "channels_last": rng.random() < 0.5}


def b_pool(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        F = t.nn.functional
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = 2 if p["dtype"] == "bf16" else 4
        k = int(p["k"])
        n = (int(p["mib"]) << 20) // esize if not c.small else 1 << 12
        if p["op"] == "max3d":
            d = 32 if not c.small else 8
            ch3 = 64 if not c.small else 8
            x = t.randn(max(1, n // (64 * d ** 3)), ch3, d, d, d, device=c.dev, dtype=dtype)
            return _job(c, lambda: F.max_pool3d(x, k, stride=k // 2 + 1, padding=k // 2), [x],
                        float(x.numel() * esize), "B")
        hw = 256 if not c.small else 16
        x = t.randn(max(1, n // (64 * hw * hw)), 64 if not c.small else 4, hw, hw, device=c.dev, dtype=dtype)
        if p["channels_last"] and c.cuda:
            x = x.to(memory_format=t.channels_last)
        ops: dict[str, Callable[[], object]] = {
            "max2d": lambda: F.max_pool2d(x, k, stride=1, padding=k // 2),
            "avg2d": lambda: F.avg_pool2d(x, k, stride=1, padding=k // 2),
            "adaptive_avg2d": lambda: F.adaptive_avg_pool2d(x, (hw // k, hw // k)),
        }
        return _job(c, ops[p["op"]], [x], float(x.numel() * esize * 2), "B")
    return build


# --------------------------------------------------------------------------- sampling grids


def p_grid(rng: random.Random) -> dict[str, Any]:
    return {"mode": rng.choice(["bilinear", "nearest"]), "grid": rng.choice(["random", "affine"]),
            "ch": rng.choice([1, 3, 16, 64, 256]), "hw": rng.choice([64, 128, 256, 512]),
            "batch": rng.choice([1, 8, 32, 128])}


def b_grid(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        F = t.nn.functional
        ch, hw, batch = int(p["ch"]), int(p["hw"]), int(p["batch"])
        while batch * max(ch, 2) * hw * hw * 4 * 3 > 8e9 and batch > 1:
            batch //= 2
        if c.small:
            ch, hw, batch = 2, 8, 1
        x = t.randn(batch, ch, hw, hw, device=c.dev)
        if p["grid"] == "random":
            grid = t.rand(batch, hw, hw, 2, device=c.dev) * 2 - 1
        else:
            theta = t.eye(2, 3, device=c.dev).repeat(batch, 1, 1) + 0.1 * t.randn(batch, 2, 3, device=c.dev)
            grid = F.affine_grid(theta, [batch, ch, hw, hw], align_corners=False)
        mode = str(p["mode"])
        return _job(c, lambda: F.grid_sample(x, grid, mode=mode, align_corners=False), [x, grid],
                    float(batch * ch * hw * hw * 4 * 2), "B")
    return build


# --------------------------------------------------------------------------- grouped convolutions


def p_gconv(rng: random.Random) -> dict[str, Any]:
    return {"ch": rng.choice([64, 128, 256, 512]), "groups": rng.choice([2, 4, 8, 16, 32]),
            "hw": rng.choice([14, 28, 56, 112]), "batch": rng.choice([1, 8, 32, 128]),
            "train": rng.random() < 0.4}


def b_gconv(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        nn = t.nn
        ch, g, hw, batch = int(p["ch"]), int(p["groups"]), int(p["hw"]), int(p["batch"])
        while batch * ch * hw * hw * 2 * 10 > 20e9 and batch > 1:
            batch //= 2
        if c.small:
            ch, g, hw, batch = 8, 2, 8, 1
        dtype = t.bfloat16 if c.cuda else t.float32
        fmt = t.channels_last if c.cuda else t.contiguous_format
        net = nn.Sequential(nn.Conv2d(ch, ch, 3, padding=1, groups=g), nn.BatchNorm2d(ch), nn.ReLU(),
                            nn.Conv2d(ch, ch, 3, padding=1, groups=g), nn.BatchNorm2d(ch), nn.ReLU())
        net = net.to(device=c.dev, dtype=dtype, memory_format=fmt)
        x = t.randn(batch, ch, hw, hw, device=c.dev, dtype=dtype).to(memory_format=fmt)
        if p["train"]:
            x.requires_grad_(True)

            def op() -> None:
                net(x).float().square().mean().backward()
        else:
            net.eval()

            def op() -> None:
                with t.no_grad():
                    net(x)
        flop = 2.0 * batch * hw * hw * 9 * ch * (ch // g) * 2 * (3 if p["train"] else 1)
        return _job(c, op, [net, x], flop, "FLOP")
    return build


#: family -> (parameter sampler, builder factory): round 6's test families
FRESH5_TEST: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                             Callable[[dict[str, Any]], Callable[[Ctx], Job]]]] = {
    "norm_softmax": (p_norm, b_norm),
    "topk_select": (p_topk, b_topk),
    "complex_gemm": (p_cgemm, b_cgemm),
    "conv1d_audio": (p_conv1d, b_conv1d),
    "einsum_contract": (p_einsum, b_einsum),
    "pooling": (p_pool, b_pool),
    "grid_sample": (p_grid, b_grid),
    "grouped_conv": (p_gconv, b_gconv),
}


def fresh5_intended(family: str, p: dict[str, Any]) -> str:
    """What a round-6 test run was built to be (informational: the GPM rule gives the truth)."""
    if family == "complex_gemm":
        return "compute" if int(p["n"]) >= 256 else "memory"
    if family == "conv1d_audio":
        return "compute" if int(p["ch"]) >= 256 else "memory"
    if family == "einsum_contract":
        return "compute" if int(p["n"]) >= 128 else "memory"
    if family == "grouped_conv":
        return "compute" if int(p["ch"]) // int(p["groups"]) >= 64 else "memory"
    return "memory"
