"""Round 12's test families (issue 13): framework workloads that no earlier set, training or test, holds.

Why: round 12's never-seen test set for the shipped model, on the issue's ask for "real framework
workloads at several sizes". Written before any of it was recorded, recorded once and scored once;
nothing is chosen on it. Each family is a kind of PyTorch job that none of the earlier modules
(catalog's dense, hpc, nets, phases, starved; sweep, fresh, latency, fresh4, fresh5, fresh6,
fresh7) builds -- their GPT/ResNet/ViT/MLP/RNN/DLRM models, transformer layers, MoE expert
matmuls, U-Nets, 3-D and transposed and grouped convolutions, state-space scans, hash-grid
encodings, per-sample gradients, CTC, sampling, sorts, stencils and Monte Carlo kernels are all
taken. All eight are torch only (no CuPy). Sizes, dtypes and modes are drawn per run so that a
family spans both sides of its ridge where it has one; a shape whose step would pass ~80 ms (or
whose memory would pass ~24 GB) is shrunk at build time, and runs.csv keeps the drawn values. The
GPM rule on the device decides each run's truth, whatever the family intended.

* ``lora_finetune``     LoRA: a stack of 1-4 frozen d x d layers (d 1024-8192, bf16/fp16/fp32) with
                        rank 4-256 adapters, over 16-16384 tokens; trained (backward into the
                        adapters and the activations only, AdamW on the adapters, a grad scaler in
                        fp16) or served unmerged. Weight streaming at few tokens, GEMM-bound at many.
* ``lattice_boltzmann`` lattice-Boltzmann fluid (D2Q9 or D3Q19, fp32/fp64, 2^16-2^26 sites,
                        periodic): moments, equilibrium, BGK or an MRT-like collision in an
                        orthonormal moment basis (a Q x Q matrix product per site), then streaming
                        by one ``torch.roll`` per direction.
* ``pointnet_fps``      point-cloud set abstraction (PointNet++'s reference PyTorch code): farthest
                        point sampling (a sequential loop of distance update + argmax, 16-2048
                        iterations over 1-64 clouds of 2^10-2^17 points), alone or followed by the
                        ball query (masked index sort), grouping and a shared MLP with max-pooling,
                        inference or training.
* ``pinn_train``        a physics-informed network: a tanh or sine MLP (width 32-512, depth 3-8,
                        fp32/fp64) over 2^10-2^20 collocation points in 1-3 space dimensions plus
                        time; the PDE residual needs its input gradient (order 1: advection) or its
                        Laplacian (order 2: heat) by ``autograd.grad(create_graph=True)``, then the
                        loss is back-propagated through that graph (double backward) and Adam steps.
* ``sparse_conv3d``     submanifold sparse 3-D convolution (as in spconv / MinkowskiEngine, LiDAR and
                        occupancy networks) in plain torch: 2^14-2^21 active voxels (uniform or on
                        surfaces), a neighbour map per kernel offset (27), and per offset a gather,
                        a C x C product (C 16-256) and a scatter-add; BatchNorm and ReLU between 1-4
                        layers, bf16/fp16/fp32, inference or training.
* ``rl_rollout``        GPU-vectorised reinforcement learning (as in Isaac Gym): 2^8-2^20 pendulum
                        chains of 1-16 links stepped in torch for a 16-64-step horizon with a
                        Gaussian policy and value MLP (hidden 64-1024), generalised advantage
                        estimation backwards over the horizon, and optionally one PPO epoch.
* ``particle_filter``   sequential Monte Carlo: 1-256 bootstrap filters of 2^10-2^20 particles of
                        dimension 1-6 (linear-Gaussian, the nonlinear growth model, or stochastic
                        volatility; fp32/fp64): propagate, log-weights, log-sum-exp, effective sample
                        size, and systematic or stratified resampling by cumsum + ``searchsorted``.
* ``qat_finetune``      quantisation-aware training (torch.ao's recipe): a stack of 2-4 feed-forward
                        blocks (d 512-4096) whose weights (per channel, from their absolute max) and
                        optionally activations (per tensor, from a running max) pass through
                        ``fake_quantize`` to 8 or 4 bits, over 64-16384 tokens, trained with AdamW
                        under bf16/fp16 autocast or in fp32.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.workloads.fresh4 import _job
from h200_collect.workloads.sizing import HBM_BPS, loguniform

#: Rough H200 ceilings (FLOP/s) for sizing one step (not for labels): tensor cores for the half
#: types, SIMT for fp32 (TF32 is off in the collector), DMMA for fp64.
PEAK = {"bf16": 600e12, "fp16": 600e12, "fp32": 40e12, "fp64": 40e12}
#: Longest step (s) a shape is allowed before it is shrunk; and the memory a run may hold (bytes).
STEP_MAX_S, MEM_MAX_B = 0.08, 24e9
#: Host time per eager kernel launch (s), for sizing launch-bound loops.
LAUNCH_S = 8e-6
HALF = ("bf16", "fp16")


def _esize(name: str) -> int:
    return 2 if name in HALF else (8 if name == "fp64" else 4)


def _amp(c: Ctx, name: str) -> Any:
    """Autocast to ``name`` for the half types (fp32 masters stay fp32); a no-op context otherwise."""
    t = c.torch
    return t.autocast("cuda" if c.cuda else "cpu", dtype=c.dtype(name) if name in HALF else t.bfloat16,
                      enabled=name in HALF)


def _trainer(c: Ctx, params: list[Any], name: str, lr: float = 1e-4) -> tuple[Callable[[Any], None], Any]:
    """One optimiser step on a loss: AdamW, with a grad scaler (its inf check reads back) in fp16."""
    t = c.torch
    opt = t.optim.AdamW(params, lr=lr)
    scaler = t.amp.GradScaler("cuda" if c.cuda else "cpu", enabled=name == "fp16")

    def train(loss: Any) -> None:
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss.float()).backward()
        scaler.step(opt)
        scaler.update()
    return train, opt


# --------------------------------------------------------------------------- LoRA fine-tuning


def p_lora(rng: random.Random) -> dict[str, Any]:
    return {"d": rng.choice([1024, 2048, 4096, 8192]), "layers": rng.choice([1, 2, 4]),
            "rank": rng.choice([4, 16, 64, 256]), "tokens": round(loguniform(rng, 16, 16384)),
            "dtype": rng.choice(["bf16", "fp16", "fp32"]), "mode": rng.choice(["train", "train", "serve"])}


def b_lora(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        F = t.nn.functional
        d, L, r, T, name = int(p["d"]), int(p["layers"]), int(p["rank"]), int(p["tokens"]), str(p["dtype"])
        train = p["mode"] == "train"
        # frozen base: a forward product per layer, and in training the activations' gradient
        flop_tok = L * 2.0 * d * d * (2 if train else 1)
        while T > 16 and T * flop_tok / PEAK[name] > STEP_MAX_S:
            T //= 2
        if c.small:
            d, L, r, T = 32, 2, min(r, 4), 8
        base = c.dtype(name)
        W = [t.randn(d, d, device=c.dev, dtype=base) * d ** -0.5 for _ in range(L)]
        A = [(t.randn(r, d, device=c.dev) * r ** -0.5).requires_grad_(train) for _ in range(L)]
        # LoRA starts B at zero; a served adapter has been trained, so it is not zero there
        B = [(t.zeros(d, r, device=c.dev) if train else t.randn(d, r, device=c.dev) * 0.01)
             .requires_grad_(train) for _ in range(L)]
        x = t.randn(T, d, device=c.dev, dtype=base)
        scale = 2.0 / r

        def forward() -> Any:
            h = x
            with _amp(c, name):
                for w, a, b in zip(W, A, B, strict=True):
                    h = F.silu(F.linear(h, w) + F.linear(F.linear(h, a), b) * scale)
            return h
        if train:
            step_opt, opt = _trainer(c, A + B, name)

            def op() -> None:
                step_opt(forward().float().square().mean())
            state: list[Any] = [W, A, B, x, opt]
        else:
            def op() -> None:
                with t.no_grad():
                    forward()
            state = [W, A, B, x]
        return _job(c, op, state, T * flop_tok, "FLOP")
    return build


# --------------------------------------------------------------------------- lattice Boltzmann


def lbm_lattice(dims: int) -> tuple[list[tuple[int, ...]], list[float]]:
    """The D2Q9 or D3Q19 velocity set and its weights (rest velocity first)."""
    if dims == 2:
        c2: list[tuple[int, ...]] = [(0, 0), (1, 0), (0, 1), (-1, 0), (0, -1),
                                     (1, 1), (-1, 1), (-1, -1), (1, -1)]
        return c2, [4 / 9] + [1 / 9] * 4 + [1 / 36] * 4
    axes = [tuple(s if k == a else 0 for k in range(3)) for a in range(3) for s in (1, -1)]
    edges = [tuple(s1 if k == a else (s2 if k == b else 0) for k in range(3))
             for a in range(3) for b in range(a + 1, 3) for s1 in (1, -1) for s2 in (1, -1)]
    return [(0, 0, 0), *axes, *edges], [1 / 3] + [1 / 18] * 6 + [1 / 36] * 12


def p_lbm(rng: random.Random) -> dict[str, Any]:
    return {"lattice": rng.choice(["D2Q9", "D3Q19"]), "log_sites": rng.randint(16, 26),
            "dtype": rng.choice(["fp32", "fp32", "fp64"]), "collision": rng.choice(["bgk", "mrt"]),
            "tau": round(rng.uniform(0.55, 1.5), 3)}


def b_lbm(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        dims = 2 if p["lattice"] == "D2Q9" else 3
        vel, wts = lbm_lattice(dims)
        Q, esize = len(vel), _esize(str(p["dtype"]))
        log_sites = int(p["log_sites"]) if not c.small else 4 * dims
        while Q * esize << log_sites > 2 << 30:  # one population array of 2 GiB at most
            log_sites -= 1
        shape = tuple(1 << (log_sites // dims + (1 if k < log_sites % dims else 0)) for k in range(dims))
        n = math.prod(shape)
        dtype = c.dtype(str(p["dtype"]))
        cv = t.tensor(vel, device=c.dev, dtype=dtype)  # (Q, dims)
        w = t.tensor(wts, device=c.dev, dtype=dtype).view(Q, *([1] * dims))
        omega = 1.0 / float(p["tau"])
        # MRT-like: relax in an orthonormal basis whose first vector is the mass (kept), the rest
        # at rates in (0, 2): a contraction towards equilibrium, so the flow stays bounded
        basis = t.linalg.qr(t.cat([t.ones(Q, 1, dtype=t.float64), t.randn(Q, Q - 1, dtype=t.float64,
                                   generator=t.Generator().manual_seed(Q))], 1)).Q
        M = basis.t().contiguous().to(device=c.dev, dtype=dtype)
        rates = t.tensor([0.0] + [omega] * dims + [1.2] * (Q - 1 - dims), device=c.dev, dtype=dtype)

        def equilibrium(f: Any) -> Any:
            rho = f.sum(0)
            u = t.einsum("qd,q...->d...", cv, f) / rho
            cu = t.einsum("qd,d...->q...", cv, u)
            return w * rho * (1 + 3 * cu + 4.5 * cu * cu - 1.5 * (u * u).sum(0))
        u0 = 0.05 * t.randn(dims, *shape, device=c.dev, dtype=dtype)
        cu0 = t.einsum("qd,d...->q...", cv, u0)
        f = (w * (1 + 3 * cu0 + 4.5 * cu0 * cu0 - 1.5 * (u0 * u0).sum(0))).contiguous()
        axes = tuple(range(dims))

        def op() -> None:
            feq = equilibrium(f)
            if p["collision"] == "bgk":
                f.lerp_(feq, omega)
            else:
                m, meq = M @ f.view(Q, n), M @ feq.view(Q, n)
                f.view(Q, n).copy_(M.t() @ (m - rates.unsqueeze(1) * (m - meq)))
            for i in range(1, Q):  # streaming, periodic
                f[i] = t.roll(f[i], shifts=vel[i], dims=axes)
        return _job(c, op, [f, cv, w, M, rates], float(Q * n * esize * 2), "B")
    return build


# --------------------------------------------------------------------------- point-cloud set abstraction


def p_fps(rng: random.Random) -> dict[str, Any]:
    return {"batch": rng.choice([1, 4, 16, 64]), "log_points": rng.randint(10, 17),
            "samples": rng.choice([128, 512, 2048]), "mode": rng.choice(["fps", "sa_infer", "sa_train"]),
            "nsample": rng.choice([16, 32, 64]), "width": rng.choice([64, 128, 256]),
            "dtype": rng.choice(["bf16", "fp32"])}


def farthest_points(t: Any, xyz: Any, S: int, start: Any) -> Any:
    """Indices (B, S) of farthest point sampling from ``start`` (B,): PointNet++'s loop, on the device."""
    B, N, _ = xyz.shape
    dist = t.full((B, N), 1e10, device=xyz.device, dtype=xyz.dtype)
    idx = t.empty(B, S, dtype=t.long, device=xyz.device)
    ar = t.arange(B, device=xyz.device)
    far = start
    for i in range(S):
        idx[:, i] = far
        cen = xyz[ar, far].unsqueeze(1)
        dist = t.minimum(dist, (xyz - cen).square().sum(-1))
        far = dist.argmax(-1)
    return idx


def ball_query(t: Any, xyz: Any, new_xyz: Any, radius: float, K: int) -> Any:
    """Indices (B, S, K): the first K points within ``radius`` of each centre, padded with the first."""
    B, N, _ = xyz.shape
    S = new_xyz.shape[1]
    d2 = (new_xyz.square().sum(-1, keepdim=True) + xyz.square().sum(-1).unsqueeze(1)
          - 2 * new_xyz @ xyz.transpose(1, 2))
    gi = t.arange(N, device=xyz.device).expand(B, S, N).clone()
    gi[d2 > radius * radius] = N
    gi = gi.sort(-1).values[:, :, :K]
    return t.where(gi == N, gi[:, :, :1].expand_as(gi), gi)


def b_fps(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, N, K, wd = int(p["batch"]), 1 << int(p["log_points"]), int(p["nsample"]), int(p["width"])
        S = min(int(p["samples"]), N // 4)
        sa = p["mode"] != "fps"
        while sa and B * S * N > 1 << 26 and B > 1:  # the ball query's (B, S, N) int64 sort: 512 MiB
            B //= 2
        while sa and B * S * N > 1 << 26 and S > 16:
            S //= 2
        iter_s = max(6 * LAUNCH_S, B * N * 40 / HBM_BPS)  # one FPS iteration: ~6 launches, ~40 B/point
        while S > 16 and S * iter_s > STEP_MAX_S * 0.75:
            S //= 2
        if c.small:
            B, N, S, K, wd = 2, 64, 8, 4, 8
        name = str(p["dtype"])
        xyz = t.rand(B, N, 3, device=c.dev)
        normals = t.nn.functional.normalize(t.randn(B, N, 3, device=c.dev), dim=-1)
        start = t.randint(0, N, (B,), device=c.dev)
        radius = (2.0 * K / N / (4 / 3 * math.pi)) ** (1 / 3)  # about 2K points per ball
        if not sa:
            def op() -> None:
                farthest_points(t, xyz, S, start)
            return _job(c, op, [xyz, normals, start], float(S * B * N * 16), "B")
        nn = t.nn
        mlp = nn.Sequential(nn.Linear(6, wd), nn.ReLU(), nn.Linear(wd, wd), nn.ReLU(),
                            nn.Linear(wd, 2 * wd)).to(c.dev)
        ar = t.arange(B, device=c.dev).view(B, 1, 1)

        def features() -> Any:
            with t.no_grad():
                idx = farthest_points(t, xyz, S, start)
                new_xyz = xyz[ar.view(B, 1), idx]
                gi = ball_query(t, xyz, new_xyz, radius, K)
                pts = t.cat([xyz[ar, gi] - new_xyz.unsqueeze(2), normals[ar, gi]], -1)  # (B, S, K, 6)
            with _amp(c, name):
                return mlp(pts).max(2).values
        if p["mode"] == "sa_train":
            step_opt, opt = _trainer(c, list(mlp.parameters()), name)

            def op() -> None:
                step_opt(features().float().square().mean())
            state: list[Any] = [xyz, normals, start, mlp, opt]
        else:
            def op() -> None:
                with t.no_grad():
                    features()
            state = [xyz, normals, start, mlp]
        return _job(c, op, state, float(S * B * N * 16 + B * S * N * 8 * 4), "B")
    return build


# --------------------------------------------------------------------------- physics-informed network


def p_pinn(rng: random.Random) -> dict[str, Any]:
    return {"dims": rng.choice([1, 2, 3]), "width": rng.choice([32, 64, 128, 256, 512]),
            "depth": rng.choice([3, 4, 6, 8]), "log_points": rng.randint(10, 20),
            "dtype": rng.choice(["fp32", "fp32", "fp64"]), "order": rng.choice([1, 2]),
            "act": rng.choice(["tanh", "sin"])}


def b_pinn(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        D, W, depth, order = int(p["dims"]), int(p["width"]), int(p["depth"]), int(p["order"])
        P, name = 1 << int(p["log_points"]), str(p["dtype"])
        passes = 2 + (D if order == 2 else 0)  # forward, input gradient, one more per second derivative

        def flop(points: int) -> float:  # every pass's products, then their backward (about twice)
            return 2.0 * points * W * W * depth * passes * 3

        def step_s(points: int) -> float:  # the products, or ~100 B per activation of the derivative chains
            return max(flop(points) / PEAK[name], points * W * depth * passes * _esize(name) * 100 / HBM_BPS)

        while P > 256 and (step_s(P) > STEP_MAX_S or P * W * depth * passes * _esize(name) * 12 > MEM_MAX_B):
            P //= 2
        if c.small:
            P, W, depth = 32, 8, 2
        dtype = c.dtype(name)
        sizes = [D + 1] + [W] * depth + [1]
        Ws = [(t.randn(a, b, device=c.dev, dtype=dtype) * math.sqrt(2.0 / (a + b))).requires_grad_()
              for a, b in itertools.pairwise(sizes)]
        bs = [t.zeros(b, device=c.dev, dtype=dtype, requires_grad=True) for b in sizes[1:]]
        act = t.tanh if p["act"] == "tanh" else t.sin
        x = t.rand(P, D + 1, device=c.dev, dtype=dtype, requires_grad=True)  # (time, space...)
        xb = t.rand(max(1, P // 8), D + 1, device=c.dev, dtype=dtype)
        xb[:, 1] = xb[:, 1].round()  # boundary points: two faces of the unit cube
        src = t.sin(math.pi * x.detach()[:, 1:]).prod(1)
        opt = t.optim.Adam(Ws + bs, lr=1e-3)

        def net(z: Any) -> Any:
            for i, (w, b) in enumerate(zip(Ws, bs, strict=True)):
                z = t.addmm(b, z, w)
                if i < len(Ws) - 1:
                    z = act(z)
            return z.squeeze(-1)

        def op() -> None:
            u = net(x)
            g = t.autograd.grad(u.sum(), x, create_graph=True)[0]
            if order == 2:  # heat: u_t = 0.1 laplace(u) + s
                lap = sum(t.autograd.grad(g[:, i].sum(), x, create_graph=True)[0][:, i]
                          for i in range(1, D + 1))
                res = g[:, 0] - 0.1 * lap - src
            else:  # advection: u_t + a . grad(u) = s
                res = g[:, 0] + 0.5 * g[:, 1:].sum(1) - src
            loss = res.square().mean() + net(xb).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return _job(c, op, [Ws, bs, x, xb, src, opt], flop(P), "FLOP")
    return build


# --------------------------------------------------------------------------- sparse 3-D convolution


def p_spconv(rng: random.Random) -> dict[str, Any]:
    return {"log_voxels": rng.randint(14, 21), "occupancy": rng.choice(["uniform", "surface"]),
            "channels": rng.choice([16, 32, 64, 128, 256]), "layers": rng.choice([1, 2, 4]),
            "dtype": rng.choice(["bf16", "fp16", "fp32"]), "mode": rng.choice(["train", "infer"])}


def voxel_keys(t: Any, n: int, occupancy: str, dev: str, seed: int) -> tuple[Any, int]:
    """Sorted distinct linear keys x*G^2 + y*G + z of about ``n`` active voxels, and the side G.

    ``uniform``: n of G^3 cells at random (10% occupied, few neighbours each). ``surface``: the
    voxels crossed by points on eight sphere shells (as LiDAR scans and meshes occupy space: about
    nine neighbours each).
    """
    g = t.Generator(device=dev).manual_seed(seed)
    if occupancy == "uniform":
        G = max(4, round((10 * n) ** (1 / 3)))
        keys = t.randperm(G ** 3, device=dev, generator=g)[:n]
        return keys.sort().values, G
    G = max(8, round(math.sqrt(n / 2.8)))
    R = G / 6
    m = 3 * n
    centre = R + t.rand(8, 3, device=dev, generator=g) * (G - 2 * R)
    d = t.randn(m, 3, device=dev, generator=g)
    pts = centre[t.randint(0, 8, (m,), device=dev, generator=g)] + R * d / d.norm(dim=1, keepdim=True)
    v = pts.floor().long().clamp_(0, G - 1)
    return t.unique(v[:, 0] * G * G + v[:, 1] * G + v[:, 2]), G


def neighbour_maps(t: Any, keys: Any, G: int) -> list[tuple[Any, Any]]:
    """For each of the 27 offsets: (input rows, output rows) of the active pairs (submanifold rule)."""
    n = keys.numel()
    xyz = t.stack([keys // (G * G), keys // G % G, keys % G], 1)
    rows = t.arange(n, device=keys.device)
    maps = []
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            for dz in (-1, 0, 1):
                q = xyz + t.tensor([dx, dy, dz], device=keys.device)
                inside = ((q >= 0) & (q < G)).all(1)
                nk = q[:, 0] * G * G + q[:, 1] * G + q[:, 2]
                pos = t.searchsorted(keys, nk).clamp_(max=n - 1)
                hit = inside & (keys[pos] == nk)
                maps.append((pos[hit], rows[hit]))
    return maps


def submanifold_conv(t: Any, h: Any, w: Any, maps: list[tuple[Any, Any]], dtype: Any) -> Any:
    """out[v] = sum over offsets k of h[v + k] @ w[k] at the active voxels: per offset a gather, a
    product and a scatter-add (spconv's gather-GEMM-scatter)."""
    out = t.zeros(h.shape[0], w.shape[2], device=h.device, dtype=dtype)
    for k, (src, dst) in enumerate(maps):
        out.index_add_(0, dst, h.index_select(0, src) @ w[k])
    return out


def b_spconv(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        N, C, L, name = 1 << int(p["log_voxels"]), int(p["channels"]), int(p["layers"]), str(p["dtype"])
        train, esize = p["mode"] == "train", _esize(name)
        nbr = 11 if p["occupancy"] == "surface" else 4  # pairs per voxel (measured), for sizing

        def cost(n: int) -> tuple[float, float]:  # (seconds, bytes held) of one step
            pairs = n * nbr
            mem_s = L * pairs * C * esize * 4 * (3 if train else 1) / HBM_BPS
            flop_s = L * 2.0 * pairs * C * C * (3 if train else 1) / PEAK[name]
            held = (L if train else 1) * pairs * C * esize * 3.0
            return max(mem_s, flop_s) + L * 27 * (8 if train else 3) * LAUNCH_S, held

        while N > 1 << 12 and (cost(N)[0] > STEP_MAX_S or cost(N)[1] > MEM_MAX_B):
            N //= 2
        if c.small:
            N, C, L = 200, 8, min(L, 2)
        keys, G = voxel_keys(t, N, str(p["occupancy"]), c.dev, 5)
        maps = neighbour_maps(t, keys, G)
        n = keys.numel()
        nn = t.nn
        wdt = t.float32 if train else c.dtype(name)
        Ws = [(t.randn(27, C, C, device=c.dev, dtype=wdt) * (27 * C) ** -0.5).requires_grad_(train)
              for _ in range(L)]
        norms = nn.ModuleList(nn.BatchNorm1d(C) for _ in range(L)).to(c.dev)
        if not train:
            norms.eval()
        x = t.randn(n, C, device=c.dev, dtype=c.dtype(name))

        def forward() -> Any:
            h = x
            with _amp(c, name):
                for w, bn in zip(Ws, norms, strict=True):
                    y = t.relu(bn(submanifold_conv(t, h, w, maps, c.dtype(name))))
                    h = y + h if L > 1 else y
            return h
        if train:
            step_opt, opt = _trainer(c, Ws + list(norms.parameters()), name)

            def op() -> None:
                step_opt(forward().float().square().mean())
            state: list[Any] = [keys, maps, Ws, norms, x, opt]
        else:
            def op() -> None:
                with t.no_grad():
                    forward()
            state = [keys, maps, Ws, norms, x]
        pairs = sum(int(s.numel()) for s, _ in maps)
        return _job(c, op, state, 2.0 * L * pairs * C * C * (3 if train else 1), "FLOP")
    return build


# --------------------------------------------------------------------------- vectorised RL


def p_rl(rng: random.Random) -> dict[str, Any]:
    return {"log_envs": rng.randint(8, 20), "horizon": rng.choice([16, 32, 64]),
            "hidden": rng.choice([64, 256, 1024]), "links": rng.choice([1, 4, 16]),
            "mode": rng.choice(["rollout", "ppo"]), "dtype": rng.choice(["fp32", "bf16"])}


# long: one RL iteration (policy, environment, rollout buffers, GAE, PPO) shares its tensors in closures
def b_rl(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        E, T, H, K = 1 << int(p["log_envs"]), int(p["horizon"]), int(p["hidden"]), int(p["links"])
        name = str(p["dtype"])
        ppo = p["mode"] == "ppo"
        obs_dim = 3 * K
        flop_env = 2.0 * (obs_dim * H + H * H + H * (K + 1))

        def step_s(e: int) -> float:
            # the horizon's steps (each ~80 launches, the MLP and ~60 passes over the state), then
            # PPO's epoch: the MLP forward and backward over every sample, four minibatches
            rollout_s = T * max(80 * LAUNCH_S, e * flop_env / PEAK[name] + e * K * 4 * 60 / HBM_BPS)
            return rollout_s + (3 * T * e * flop_env / PEAK[name] + 4 * 80 * LAUNCH_S if ppo else 0.0)
        while E > 256 and step_s(E) > STEP_MAX_S:
            E //= 2
        while ppo and E > 256 and T * E * H * 4 * 12 > MEM_MAX_B:
            E //= 2
        if c.small:
            E, T, H, K = 16, 4, 8, min(K, 2)
            obs_dim = 3 * K
        dev = c.dev

        def lin(a: int, b: int) -> tuple[Any, Any]:
            return ((t.randn(a, b, device=dev) * a ** -0.5).requires_grad_(),
                    t.zeros(b, device=dev, requires_grad=True))
        (w1, b1), (w2, b2), (wm, bm), (wv, bv) = lin(obs_dim, H), lin(H, H), lin(H, K), lin(H, 1)
        log_std = t.full((K,), -0.5, device=dev, requires_grad=True)
        params = [w1, b1, w2, b2, wm, bm, wv, bv, log_std]
        theta = (t.rand(E, K, device=dev) - 0.5) * 0.2
        omega = t.zeros(E, K, device=dev)
        buf_obs = t.empty(T, E, obs_dim, device=dev)
        buf_act, buf_logp = t.empty(T, E, K, device=dev), t.empty(T, E, device=dev)
        buf_rew, buf_done = t.empty(T, E, device=dev), t.empty(T, E, device=dev)
        buf_val = t.empty(T + 1, E, device=dev)
        gamma, lam, dt = 0.99, 0.95, 0.02

        def policy(obs: Any) -> tuple[Any, Any]:
            with _amp(c, name):
                h = t.tanh(t.addmm(b1, obs, w1))
                h = t.tanh(t.addmm(b2, h, w2))
                return t.addmm(bm, h, wm).float(), t.addmm(bv, h, wv).float().squeeze(-1)

        def observe() -> Any:
            return t.cat([t.cos(theta), t.sin(theta), omega], 1)

        def logp_of(mu: Any, a: Any) -> Any:
            return (-0.5 * ((a - mu) / log_std.exp()).square() - log_std).sum(-1)

        def env_step(a: Any) -> tuple[Any, Any]:
            torque = a.clamp(-2.0, 2.0)
            for _ in range(4):  # semi-implicit Euler substeps of a damped pendulum chain
                acc = torque - 9.81 * t.sin(theta) - 0.1 * omega
                if K > 1:
                    acc = acc + 5.0 * (t.roll(theta, 1, 1) + t.roll(theta, -1, 1) - 2 * theta)
                omega.add_(acc, alpha=dt)
                theta.add_(omega, alpha=dt)
            reward = -theta.square().mean(1) - 0.01 * torque.square().mean(1)
            done = (theta.abs() > math.pi).any(1)
            theta.copy_(t.where(done.unsqueeze(1), (t.rand_like(theta) - 0.5) * 0.2, theta))
            omega.masked_fill_(done.unsqueeze(1), 0.0)
            return reward, done.float()

        def rollout() -> Any:
            with t.no_grad():
                for k in range(T):
                    obs = observe()
                    mu, v = policy(obs)
                    a = mu + log_std.exp() * t.randn_like(mu)
                    buf_obs[k], buf_act[k], buf_logp[k], buf_val[k] = obs, a, logp_of(mu, a), v
                    buf_rew[k], buf_done[k] = env_step(a)
                buf_val[T] = policy(observe())[1]
                adv = t.zeros(T, E, device=dev)
                last = t.zeros(E, device=dev)
                for k in reversed(range(T)):  # generalised advantage estimation
                    keep = 1.0 - buf_done[k]
                    delta = buf_rew[k] + gamma * buf_val[k + 1] * keep - buf_val[k]
                    last = delta + gamma * lam * keep * last
                    adv[k] = last
            return adv
        opt = t.optim.Adam(params, lr=3e-4)

        def op() -> None:
            adv = rollout()
            if not ppo:
                return
            ret = (adv + buf_val[:T]).view(-1)
            a_flat, o_flat = adv.view(-1), buf_obs.view(T * E, obs_dim)
            act_flat, lp_flat = buf_act.view(T * E, K), buf_logp.view(-1)
            for mb in t.randperm(T * E, device=dev).chunk(4):  # one epoch, four minibatches
                mu, v = policy(o_flat[mb])
                ratio = (logp_of(mu, act_flat[mb]) - lp_flat[mb]).exp()
                A = a_flat[mb]
                loss = (-t.minimum(ratio * A, ratio.clamp(0.8, 1.2) * A).mean()
                        + 0.5 * (v - ret[mb]).square().mean())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        state = [params, theta, omega, buf_obs, buf_act, buf_logp, buf_rew, buf_done, buf_val, opt]
        return _job(c, op, state, T * E * flop_env * (4 if ppo else 1), "FLOP")
    return build


# --------------------------------------------------------------------------- particle filter


def p_pf(rng: random.Random) -> dict[str, Any]:
    return {"log_particles": rng.randint(10, 20), "filters": rng.choice([1, 16, 256]),
            "state_dim": rng.choice([1, 2, 4, 6]), "model": rng.choice(["linear", "growth", "volatility"]),
            "dtype": rng.choice(["fp32", "fp32", "fp64"]),
            "resample": rng.choice(["systematic", "stratified"])}


def resample_indices(t: Any, w: Any, grid: Any, u0: Any) -> Any:
    """Ancestor indices (B, N) for normalised weights w (B, N): the points (grid + u0) / N looked up in
    the weights' cumulative sum; one u0 per filter is systematic resampling, one per particle
    stratified."""
    cdf = w.cumsum(1)
    cdf = cdf / cdf[:, -1:]
    return t.searchsorted(cdf, (grid + u0) / w.shape[1]).clamp_(max=w.shape[1] - 1)


def b_pf(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        B, N, D, name = int(p["filters"]), 1 << int(p["log_particles"]), int(p["state_dim"]), str(p["dtype"])
        esize = _esize(name)
        while B * N * D * esize > 1 << 30 and N > 1024:  # the particles: 1 GiB at most
            N //= 2
        while B * N * D * esize > 1 << 30 and B > 1:
            B //= 2
        if c.small:
            B, N, D = 2, 64, min(D, 2)
        dtype, model = c.dtype(name), str(p["model"])
        x = t.randn(B, N, D, device=c.dev, dtype=dtype)
        logw = t.full((B, N), -math.log(N), device=c.dev, dtype=dtype)
        ys = t.randn(64, B, 1, D, device=c.dev, dtype=dtype)  # an observed sequence, cycled
        grid = t.arange(N, device=c.dev, dtype=dtype)
        st = {"k": 0}

        def op() -> None:
            k = st["k"]
            st["k"] = (k + 1) % 64
            y = ys[k]
            noise = t.randn_like(x)
            if model == "linear":
                xn = 0.9 * x + 0.3 * noise
                ll = -0.5 * (y - xn).square().sum(-1)
            elif model == "growth":  # the univariate nonstationary growth model, per dimension
                xn = 0.5 * x + 25 * x / (1 + x * x) + 8 * math.cos(1.2 * k) + math.sqrt(10) * noise
                ll = -0.5 * (y - xn * xn / 20).square().sum(-1)
            else:  # stochastic volatility: y ~ N(0, exp(x))
                xn = 0.95 * x + 0.25 * noise
                ll = -0.5 * (xn + y * y * t.exp(-xn)).sum(-1)
            lw = logw + ll
            lw = lw - t.logsumexp(lw, 1, keepdim=True)
            w = lw.exp()
            ess = 1.0 / w.square().sum(1)
            (w.unsqueeze(-1) * xn).sum(1)  # the filtered mean
            u0 = t.rand(B, 1 if p["resample"] == "systematic" else N, device=c.dev, dtype=dtype)
            idx = resample_indices(t, w, grid, u0)
            xr = xn.gather(1, idx.unsqueeze(-1).expand(B, N, D))
            low = (ess < N / 2).unsqueeze(1)
            x.copy_(t.where(low.unsqueeze(-1), xr, xn))
            logw.copy_(t.where(low, t.full_like(lw, -math.log(N)), lw))
        return _job(c, op, [x, logw, ys, grid], float(B * N * (D * esize * 8 + esize * 12)), "B")
    return build


# --------------------------------------------------------------------------- quantisation-aware training


def p_qat(rng: random.Random) -> dict[str, Any]:
    return {"d": rng.choice([512, 1024, 2048, 4096]), "layers": rng.choice([2, 4]),
            "tokens": round(loguniform(rng, 64, 16384)), "bits": rng.choice([8, 4]),
            "act_quant": rng.random() < 0.6, "dtype": rng.choice(["bf16", "fp16", "fp32"])}


def b_qat(p: dict[str, Any]) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        F = t.nn.functional
        d, L, T, bits, name = int(p["d"]), int(p["layers"]), int(p["tokens"]), int(p["bits"]), str(p["dtype"])
        ff = 4 * d
        flop_tok = L * 2 * 2.0 * d * ff * 3  # two products per block, forward and backward
        while T > 64 and T * flop_tok / PEAK[name] > STEP_MAX_S:
            T //= 2
        if c.small:
            d, L, T = 16, 2, 8
            ff = 4 * d
        qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        W1 = [(t.randn(ff, d, device=c.dev) * d ** -0.5).requires_grad_() for _ in range(L)]
        W2 = [(t.randn(d, ff, device=c.dev) * ff ** -0.5).requires_grad_() for _ in range(L)]
        b1 = [t.zeros(ff, device=c.dev, requires_grad=True) for _ in range(L)]
        b2 = [t.zeros(d, device=c.dev, requires_grad=True) for _ in range(L)]
        zp = {n: t.zeros(n, device=c.dev, dtype=t.int32) for n in (d, ff)}
        zp0 = t.zeros((), device=c.dev, dtype=t.int32)
        running = t.ones(2 * L, device=c.dev)  # the activation observers' running absolute max
        x = t.randn(T, d, device=c.dev, dtype=c.dtype(name))

        def fq_weight(w: Any) -> Any:  # per output channel, scale from the weight's absolute max
            scale = (w.detach().abs().amax(1) / qmax).clamp_(min=1e-8)
            return t.fake_quantize_per_channel_affine(w, scale, zp[w.shape[0]], 0, qmin, qmax)

        def fq_act(a: Any, i: int) -> Any:  # per tensor, scale from a moving-average max (no read-back)
            if not p["act_quant"]:
                return a
            with t.no_grad():
                running[i].lerp_(a.detach().abs().amax().float(), 0.1)
            scale = (running[i] / qmax).clamp(min=1e-8)
            return t.fake_quantize_per_tensor_affine(a.float(), scale, zp0, qmin, qmax)

        def forward() -> Any:
            h = x
            with _amp(c, name):
                for i in range(L):
                    z = F.relu(F.linear(fq_act(h, 2 * i), fq_weight(W1[i]), b1[i]))
                    h = h + F.linear(fq_act(z, 2 * i + 1), fq_weight(W2[i]), b2[i])
            return h
        step_opt, opt = _trainer(c, W1 + W2 + b1 + b2, name)

        def op() -> None:
            step_opt(forward().float().square().mean())
        return _job(c, op, [W1, W2, b1, b2, zp, zp0, running, x, opt], T * flop_tok, "FLOP")
    return build


#: family -> (parameter sampler, builder factory): round 12's test families
FRESH8_TEST: dict[str, tuple[Callable[[random.Random], dict[str, Any]],
                             Callable[[dict[str, Any]], Callable[[Ctx], Job]]]] = {
    "lora_finetune": (p_lora, b_lora),
    "lattice_boltzmann": (p_lbm, b_lbm),
    "pointnet_fps": (p_fps, b_fps),
    "pinn_train": (p_pinn, b_pinn),
    "sparse_conv3d": (p_spconv, b_spconv),
    "rl_rollout": (p_rl, b_rl),
    "particle_filter": (p_pf, b_pf),
    "qat_finetune": (p_qat, b_qat),
}


def fresh8_intended(family: str, p: dict[str, Any]) -> str:
    """What a round-12 test run was built to be (informational: the GPM rule gives the truth)."""
    if family == "lora_finetune":  # the frozen base's products against its weight read
        return "compute" if int(p["tokens"]) >= (64 if p["dtype"] == "fp32" else 256) else "memory"
    if family == "qat_finetune":
        big = int(p["d"]) >= 1024 or p["dtype"] == "fp32"  # fp32's ridge is low (SIMT)
        return "compute" if int(p["tokens"]) >= 1024 and big else "memory"
    if family == "pinn_train":  # width^2 products against width-sized elementwise derivative chains
        return "compute" if int(p["width"]) >= 256 else "memory"
    if family == "sparse_conv3d":
        return "compute" if int(p["channels"]) >= (64 if p["dtype"] == "fp32" else 256) else "memory"
    if family == "rl_rollout":
        return "compute" if int(p["hidden"]) >= 256 and int(p["log_envs"]) >= 14 else "memory"
    if family == "lattice_boltzmann":  # populations in L2: no DRAM traffic to speak of
        q, esize = (9 if p["lattice"] == "D2Q9" else 19), _esize(str(p["dtype"]))
        return "compute" if q * esize << int(p["log_sites"]) <= 16 << 20 else "memory"
    return "memory"
