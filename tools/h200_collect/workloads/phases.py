"""Time structure: phase changes, duty cycles, idle jobs holding memory, tiny launches."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.models import _adamw, _gpt_small, _train_step
from h200_collect.workloads.hpc import b_stencil3d
from h200_collect.workloads.nets import _decoder


def _gemm_op(c: Ctx, n: int = 8192, dt: str = "bf16") -> tuple[Callable[[], None], Any]:
    t = c.torch
    m = c.n(n, 64)
    a = t.randn(m, m, device=c.dev, dtype=c.dtype(dt))

    def op() -> None:
        for _ in range(4):
            a @ a
    return op, a


def _copy_op(c: Ctx, n: int = 512 << 20) -> tuple[Callable[[], None], Any]:
    t = c.torch
    x = t.randn(c.n(n, 4096), device=c.dev)
    y = t.empty_like(x)

    def op() -> None:
        y.copy_(x)
        x.add_(y, alpha=1e-6)
    return op, (x, y)


def b_phase_compute_memory(c: Ctx) -> Job:
    g, ga = _gemm_op(c)
    m, ma = _copy_op(c)
    return Job(lambda: g() if c.frac() < 0.5 else m(), 0.0, "-", [ga, ma])


def b_phase_memory_idle(c: Ctx) -> Job:
    st = b_stencil3d("fp32", 512)(c)

    def step() -> None:
        if c.frac() < 0.5:
            st.step()
        else:
            c.sleep(0.25)  # results written, job lingers holding its buffers
    return Job(step, 0.0, "-", st.state)


def b_phase_alternate(c: Ctx) -> Job:
    g, ga = _gemm_op(c, 8192, "fp16")
    m, ma = _copy_op(c)
    period = 0.6 if c.small else 3.0
    return Job(lambda: g() if int(c.elapsed() / period) % 2 == 0 else m(), 0.0, "-", [ga, ma])


def b_phase_train_decode(c: Ctx) -> Job:
    t = c.torch
    model = _gpt_small(c)
    opt = _adamw(c, model)
    B, S = c.n(16, 2), c.n(512, 32)
    ids = t.randint(0, model.vocab, (B, S + 1), device=c.dev)
    F = t.nn.functional

    def loss() -> Any:
        return F.cross_entropy(model(ids[:, :-1]).reshape(-1, model.vocab).float(), ids[:, 1:].reshape(-1))
    train = _train_step(c, model, opt, loss, True)
    dec, caches = _decoder(c, model, c.n(4, 1), c.n(512, 8), gen=c.n(128, 4), tokens=c.n(16, 2))

    def step() -> None:
        if c.frac() < 0.6:
            train()
        else:
            with c.autocast():
                dec()
    return Job(step, 0.0, "-", [model, opt, ids, caches])


def b_phase_idle_compute(c: Ctx) -> Job:
    g, ga = _gemm_op(c)
    return Job(lambda: c.sleep(0.25) if c.frac() < 0.4 else g(), 0.0, "-", [ga])


def b_bursty(duty: float, memory: bool = False) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        op, keep = _copy_op(c) if memory else _gemm_op(c)
        period = 0.2 if c.small else 2.0

        def step() -> None:
            if (c.elapsed() % period) < duty * period:
                op()
            else:
                time.sleep(0.02)
        return Job(step, 0.0, "-", [keep])
    return build


def b_idle_hold(gib: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        hog = t.ones(c.n(gib << 30, 1 << 20), dtype=t.uint8, device=c.dev)
        return Job(lambda: c.sleep(0.25), 0.0, "-", [hog])
    return build


def b_launch_tiny(c: Ctx) -> Job:
    t = c.torch
    x = t.zeros(16, device=c.dev)

    def step() -> None:
        for _ in range(c.n(2000, 20)):
            x.add_(1.0)
    return Job(step, 0.0, "-", [x])


def b_mlp_b1(c: Ctx) -> Job:
    """Batch-1 online inference: 8-layer fp32 MLP, the result read back to the host each request."""
    t = c.torch
    with t.device(c.dev):
        m = c.nn.mlp([c.n(1024, 16)] * 9).eval()
    x = t.randn(1, c.n(1024, 16), device=c.dev)

    def step() -> None:
        with t.no_grad():
            for _ in range(50):
                float(m(x)[0, 0])
    return Job(step, 0.0, "-", [m, x])

