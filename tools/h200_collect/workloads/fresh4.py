"""Round 4's test families (issue 13): kinds of work that no earlier set, training or test, holds.

Why: round 4's model is chosen on every earlier recording (the two former test sets included), so
its test needs kinds of work nobody trained on or looked at. They are written by the lead, recorded
after the model's recipe is fixed and registered, and scored once. The GPM rule on the device
decides each run's truth, whatever the family intended.

* ``transpose_permute`` ``permute(...).contiguous()`` of 4-D bf16/fp32 tensors (layout changes in
                        data pipelines and attention reshapes): strided reads, 4 MiB-4 GiB.
* ``bmm_small``         batched tiny matrix products (4x4 to 256x256, bf16/fp32/fp64) as in
                        physics codes and small-matrix transforms: launch- and latency-limited when
                        tiny, tensor-core bound when not.
* ``transcendental``    a CuPy elementwise chain of sin/exp per element (fast intrinsics or precise
                        libm), 1-512 steps: from streaming to special-function-unit bound.
* ``rng_fill``          random-number generation into large tensors (normal, uniform, bernoulli,
                        dropout, randint, randperm): Philox in registers, write-heavy.
* ``conv_transpose``    transposed 2-D convolutions (stride-2 upsampling, channels-last bf16) as in
                        decoders and GAN generators, inference or training, 8-256 channels.
* ``linalg_solver``     cuSOLVER factorizations and solves (qr, eigh, svd, solve, inv, cholesky_inverse)
                        on batched fp32/fp64 matrices of 16-2048 rows.
* ``unet_train``        a small U-Net (GroupNorm, SiLU, skip connections, nearest upsampling) trained
                        with AdamW under bf16 autocast, as in diffusion and segmentation.
* ``sampling_step``     an LLM sampling step: temperature, softmax, top-p by sort, multinomial draw,
                        batch 1-512 over 32k-256k vocabularies.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.workloads.sizing import calibrated_reps, loguniform


def _job(c: Ctx, op: Callable[[], object], state: list[Any], work: float = 0.0, unit: str = "-") -> Job:
    """A job of ``reps`` calls of ``op`` per step, reps timed on the device (sizing.calibrated_reps)."""
    reps = calibrated_reps(c, op)

    def step() -> None:
        for _ in range(reps):
            op()
    return Job(step, reps * work, unit, state)


# --------------------------------------------------------------------------- layouts


PERMS = ((0, 2, 1, 3), (0, 3, 1, 2), (3, 2, 1, 0), (1, 0, 3, 2), (0, 1, 3, 2))


def p_permute(rng: random.Random) -> dict[str, Any]:
    return {"mib": round(loguniform(rng, 4, 4096)), "dtype": rng.choice(["bf16", "fp32"]),
            "perm": rng.randrange(len(PERMS)), "inner": rng.choice([8, 64, 128, 1024])}


def b_permute(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = 2 if p["dtype"] == "bf16" else 4
        n = (int(p["mib"]) << 20) // esize if not c.small else 1 << 12
        inner = int(p["inner"]) if not c.small else 8
        rest = max(1, n // inner)
        a = max(1, round(math.sqrt(rest / 16)))
        shape = (16, a, max(1, rest // (16 * a)), inner)
        x = t.randn(*shape, device=c.dev, dtype=dtype)
        perm = PERMS[int(p["perm"])]
        return _job(c, lambda: x.permute(*perm).contiguous(), [x], 2.0 * x.numel() * esize, "B")
    return build


# --------------------------------------------------------------------------- small batched GEMM


def p_bmm_small(rng: random.Random) -> dict[str, Any]:
    return {"n": rng.choice([4, 8, 16, 32, 64, 128, 256]),
            "dtype": rng.choice(["bf16", "bf16", "fp32", "fp64"]), "mib": round(loguniform(rng, 16, 2048))}


def b_bmm_small(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = {"bf16": 2, "fp32": 4, "fp64": 8}[p["dtype"]]
        m = int(p["n"]) if not c.small else 4
        batch = max(1, (int(p["mib"]) << 20) // (3 * m * m * esize)) if not c.small else 8
        a = t.randn(batch, m, m, device=c.dev, dtype=dtype)
        b = t.randn(batch, m, m, device=c.dev, dtype=dtype)
        return _job(c, lambda: t.bmm(a, b), [a, b], 2.0 * batch * m ** 3, "FLOP")
    return build


# --------------------------------------------------------------------------- special functions


def p_transc(rng: random.Random) -> dict[str, Any]:
    return {"steps": round(loguniform(rng, 1, 512)), "fast": rng.random() < 0.5,
            "mib": round(loguniform(rng, 64, 2048))}


def b_transc(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        steps = int(p["steps"])
        n = (int(p["mib"]) << 20) // 8 if not c.small else 1 << 10
        if not c.cuda:
            x = t.rand(n)

            def ref() -> None:
                v = x
                for _ in range(min(steps, 4)):
                    v = t.sin(v) * 1.0001 + t.exp(-v * v)
            return Job(ref, 0.0, "-", [x])
        import cupy as cp

        sin, exp = ("__sinf", "__expf") if p["fast"] else ("sinf", "expf")
        kern = cp.ElementwiseKernel(
            "float32 x, int32 steps", "float32 y",
            f"float v = x; for (int r = 0; r < steps; ++r) {{ v = {sin}(v) * 1.0001f + {exp}(-v * v); }}"
            " y = v;",
            f"transc_{'fast' if p['fast'] else 'libm'}")
        x = cp.random.random(n, dtype=cp.float32)
        y = cp.empty_like(x)
        return _job(c, lambda: kern(x, cp.int32(steps), y), [x, y, kern], 4.0 * n * steps, "FLOP")
    return build


# --------------------------------------------------------------------------- random numbers


def p_rng(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(["normal", "uniform", "bernoulli", "dropout", "randint", "randperm"]),
            "mib": round(loguniform(rng, 16, 4096)), "dtype": rng.choice(["bf16", "fp32"])}


def b_rng(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        esize = 2 if p["dtype"] == "bf16" else 4
        n = (int(p["mib"]) << 20) // esize if not c.small else 1 << 12
        if p["op"] == "randperm":
            n = min(n, 1 << 28)
        x = t.empty(n, device=c.dev, dtype=dtype)
        F = t.nn.functional
        ops: dict[str, Callable[[], object]] = {
            "normal": lambda: x.normal_(),
            "uniform": lambda: x.uniform_(),
            "bernoulli": lambda: x.bernoulli_(0.3),
            "dropout": lambda: F.dropout(x, 0.1, training=True),
            "randint": lambda: t.randint(0, 1 << 20, (n,), device=c.dev),
            "randperm": lambda: t.randperm(n, device=c.dev),
        }
        x.uniform_()
        return _job(c, ops[p["op"]], [x], float(n * esize), "B")
    return build


# --------------------------------------------------------------------------- decoders


def p_convt(rng: random.Random) -> dict[str, Any]:
    return {"ch": rng.choice([8, 16, 32, 64, 128, 256]), "hw": rng.choice([16, 32, 64, 128]),
            "batch": rng.choice([1, 4, 16, 64]), "train": rng.random() < 0.4}


def b_convt(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        ch, hw, batch = int(p["ch"]), int(p["hw"]), int(p["batch"])
        while batch * ch * hw * hw * 4 * 2 > 4e9 and batch > 1:  # the upsampled output under ~4 GB
            batch //= 2
        if c.small:
            ch, hw, batch = 4, 8, 1
        dtype = t.bfloat16 if c.cuda else t.float32
        fmt = t.channels_last if c.cuda else t.contiguous_format
        layer = t.nn.Sequential(t.nn.ConvTranspose2d(ch, ch, 4, stride=2, padding=1), t.nn.SiLU(),
                                t.nn.ConvTranspose2d(ch, max(1, ch // 2), 4, stride=2, padding=1))
        layer = layer.to(device=c.dev, dtype=dtype, memory_format=fmt)
        x = t.randn(batch, ch, hw, hw, device=c.dev, dtype=dtype).to(memory_format=fmt)
        if p["train"]:
            x.requires_grad_(True)

            def op() -> None:
                layer(x).float().square().mean().backward()
        else:
            def op() -> None:
                with t.no_grad():
                    layer(x)
        flop = 2.0 * batch * 16 * ch * ch * (2 * hw) ** 2 * 1.5 * (3 if p["train"] else 1)
        return _job(c, op, [layer, x], flop, "FLOP")
    return build


# --------------------------------------------------------------------------- dense solvers


def p_solver(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(["qr", "eigh", "svd", "solve", "inv", "cholesky_inverse"]),
            "n": rng.choice([16, 32, 64, 128, 256, 512, 1024, 2048]), "dtype": rng.choice(["fp32", "fp64"])}


def b_solver(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        L = t.linalg
        n = int(p["n"]) if not c.small else 8
        if p["op"] in ("eigh", "svd"):
            n = min(n, 1024)
        batch = max(1, min(4096, (64 << 20) // (n * n * 8))) if not c.small else 2
        dtype = t.float64 if p["dtype"] == "fp64" else t.float32
        a = t.randn(batch, n, n, device=c.dev, dtype=dtype)
        spd = a @ a.transpose(-1, -2) + n * t.eye(n, device=c.dev, dtype=dtype)
        rhs = t.randn(batch, n, 4, device=c.dev, dtype=dtype)
        chol = L.cholesky(spd)
        ops: dict[str, Callable[[], object]] = {
            "qr": lambda: L.qr(a),
            "eigh": lambda: L.eigh(spd),
            "svd": lambda: L.svd(a, full_matrices=False),
            "solve": lambda: L.solve(spd, rhs),
            "inv": lambda: L.inv(spd),
            "cholesky_inverse": lambda: t.cholesky_inverse(chol),
        }
        return _job(c, ops[p["op"]], [a, spd, rhs, chol], 4.0 / 3.0 * batch * n ** 3, "FLOP")
    return build


# --------------------------------------------------------------------------- U-Net training


def p_unet(rng: random.Random) -> dict[str, Any]:
    return {"base": rng.choice([16, 32, 64, 128]), "hw": rng.choice([32, 64, 128, 256]),
            "batch": rng.choice([1, 4, 16, 64])}


def b_unet(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        nn = t.nn
        base, hw, batch = int(p["base"]), int(p["hw"]), int(p["batch"])
        while batch * base * hw * hw * 2 * 24 > 30e9 and batch > 1:  # activations kept for backward
            batch //= 2
        if c.small:
            base, hw, batch = 4, 16, 1

        def block(i: int, o: int) -> Any:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(min(8, o), o), nn.SiLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.GroupNorm(min(8, o), o), nn.SiLU())

        class UNet(nn.Module):  # type: ignore[misc,name-defined]
            def __init__(self) -> None:
                super().__init__()
                self.d1, self.d2, self.mid = block(3, base), block(base, 2 * base), block(2 * base, 4 * base)
                self.u2, self.u1 = block(6 * base, 2 * base), block(3 * base, base)
                self.out = nn.Conv2d(base, 3, 1)

            def forward(self, x: Any) -> Any:
                F = t.nn.functional
                a = self.d1(x)
                b = self.d2(F.avg_pool2d(a, 2))
                m = self.mid(F.avg_pool2d(b, 2))
                u = self.u2(t.cat([F.interpolate(m, scale_factor=2.0), b], 1))
                return self.out(self.u1(t.cat([F.interpolate(u, scale_factor=2.0), a], 1)))

        fmt = t.channels_last if c.cuda else t.contiguous_format
        model = UNet().to(c.dev, memory_format=fmt)
        opt = t.optim.AdamW(model.parameters(), lr=1e-4)
        x = t.randn(batch, 3, hw, hw, device=c.dev).to(memory_format=fmt)

        def op() -> None:
            with c.autocast():
                loss = model(x).float().square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        flop = 6.0 * batch * hw * hw * 9 * base * base * 40
        return _job(c, op, [model, opt, x], flop, "FLOP")
    return build


# --------------------------------------------------------------------------- LLM sampling


def p_sampling(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([1, 4, 16, 64, 256, 512]), "vocab": rng.choice([32000, 128256, 256000]),
            "dtype": rng.choice(["bf16", "fp32"]), "top_p": rng.choice([0.8, 0.9, 0.95])}


def b_sampling(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, V = int(p["batch"]), int(p["vocab"])
        if c.small:
            B, V = 2, 64
        dtype = c.dtype(p["dtype"]) if c.cuda else t.float32
        logits = t.randn(B, V, device=c.dev, dtype=dtype)
        top_p = float(p["top_p"])

        def op() -> object:
            probs = t.softmax(logits.float() / 0.7, -1)
            sp, si = t.sort(probs, -1, descending=True)
            keep = sp.cumsum(-1) - sp < top_p
            sp = sp * keep
            pick = t.multinomial(sp / sp.sum(-1, keepdim=True), 1)
            return si.gather(-1, pick)
        return _job(c, op, [logits], float(B * V * 4 * 6), "B")
    return build


#: family -> (parameter sampler, builder factory): round 4's test families
FRESH4_TEST: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                             Callable[[dict[str, Any]], Callable[[Ctx], Job]]]] = {
    "transpose_permute": (p_permute, b_permute),
    "bmm_small": (p_bmm_small, b_bmm_small),
    "transcendental": (p_transc, b_transc),
    "rng_fill": (p_rng, b_rng),
    "conv_transpose": (p_convt, b_convt),
    "linalg_solver": (p_solver, b_solver),
    "unet_train": (p_unet, b_unet),
    "sampling_step": (p_sampling, b_sampling),
}


def fresh4_intended(family: str, p: dict[str, Any]) -> str:
    """What a round-4 test run was built to be (informational: the GPM rule gives the truth)."""
    if family == "bmm_small":
        return "compute" if int(p["n"]) >= 64 else "memory"
    if family == "transcendental":
        return "compute" if int(p["steps"]) >= 8 else "memory"
    if family == "conv_transpose":
        return "compute" if int(p["ch"]) >= 64 else "memory"
    if family == "linalg_solver":
        return "compute" if int(p["n"]) >= 512 else "memory"
    if family == "unet_train":
        return "compute" if int(p["base"]) >= 64 else "memory"
    return "memory"
