"""Dense linear algebra: square GEMMs per dtype and a skinny (weight-streaming) GEMM."""

from __future__ import annotations

from collections.abc import Callable

from h200_collect.context import Ctx, Job


def b_gemm(dt: str, n: int, reps: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        m = c.n(n, 128)
        if dt == "tf32":
            t.backends.cuda.matmul.allow_tf32 = True
        if dt == "int8":
            a = t.randint(-127, 127, (m, m), dtype=t.int8, device=c.dev)
            b = t.randint(-127, 127, (m, m), dtype=t.int8, device=c.dev)
            def op() -> object: return t._int_mm(a, b)
            unit = "OP"
        elif dt == "fp8":
            a = t.randn(m, m, device=c.dev).to(t.float8_e4m3fn)
            b = t.randn(m, m, device=c.dev).to(t.float8_e4m3fn).t()  # column-major as required
            one = t.tensor(1.0, device=c.dev)
            def op() -> object:
                return t._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16)
            unit = "FLOP"
        else:
            a = t.randn(m, m, device=c.dev, dtype=c.dtype(dt))
            b = t.randn_like(a)
            def op() -> object: return a @ b
            unit = "FLOP"

        def step() -> None:
            for _ in range(reps):
                op()
        return Job(step, reps * 2.0 * m**3, unit, [a, b])
    return build


def b_gemv(c: Ctx) -> Job:
    """Skinny bf16 GEMM (32 rows) over eight 8192x8192 weights: weight streaming, like decode."""
    t = c.torch
    d = c.n(8192, 256)
    W = [t.randn(d, d, device=c.dev, dtype=t.bfloat16) for _ in range(8)]
    x = t.randn(32, d, device=c.dev, dtype=t.bfloat16)

    def step() -> None:
        for _ in range(4):
            for w in W:
                x @ w
    return Job(step, 4 * 8 * d * d * 2.0, "B", [W, x])

