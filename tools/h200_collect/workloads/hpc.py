"""HPC kernels: stencils, FFT, sparse, CG, dense factorisations, N-body, Monte Carlo, data movement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job


def b_stencil3d(dt: str, n: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        m = c.n(n, 16)
        u = t.randn(m, m, m, device=c.dev, dtype=c.dtype(dt))
        v = u.clone()

        def sweep(a: Any, b: Any) -> None:
            i = slice(1, -1)
            b[i, i, i] = (a[:-2, i, i] + a[2:, i, i] + a[i, :-2, i] + a[i, 2:, i]
                          + a[i, i, :-2] + a[i, i, 2:]) * (1.0 / 6.0)

        def step() -> None:
            for _ in range(2):
                sweep(u, v)
                sweep(v, u)
        return Job(step, 4 * 2.0 * u.numel() * u.element_size(), "B", [u, v])
    return build


def b_stencil2d(c: Ctx) -> Job:
    t = c.torch
    m = c.n(16384, 32)
    u = t.randn(m, m, device=c.dev)
    v = u.clone()

    def sweep(a: Any, b: Any) -> None:
        b[1:-1, 1:-1] = 0.25 * (a[:-2, 1:-1] + a[2:, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:])

    def step() -> None:
        for _ in range(4):
            sweep(u, v)
            sweep(v, u)
    return Job(step, 8 * 2.0 * u.numel() * 4, "B", [u, v])


def b_fft(dims: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        if dims == 1:
            x = t.randn(c.n(256, 4), c.n(1 << 20, 1024), device=c.dev, dtype=t.complex64)
            def op() -> object: return t.fft.fft(x)
        elif dims == 2:
            x = t.randn(c.n(16, 2), c.n(4096, 64), c.n(4096, 64), device=c.dev, dtype=t.complex64)
            def op() -> object: return t.fft.fft2(x)
        else:
            m = c.n(512, 16)
            x = t.randn(m, m, m, device=c.dev, dtype=t.complex128)
            def op() -> object: return t.fft.fftn(x)

        def step() -> None:
            for _ in range(4):
                op()
        return Job(step, 4 * 2.0 * x.numel() * x.element_size(), "B", [x])
    return build


def _random_csr(c: Ctx, n: int, k: int, dtype: Any) -> Any:
    """Random CSR with k sorted column indices per row, built directly on the device (fast)."""
    t = c.torch
    col = t.randint(0, n, (n, k), device=c.dev).sort(dim=1).values.reshape(-1)
    crow = t.arange(0, n * k + 1, k, device=c.dev)
    val = t.randn(n * k, device=c.dev, dtype=dtype)
    return t.sparse_csr_tensor(crow, col, val, (n, n))


def b_spmv(c: Ctx) -> Job:
    t = c.torch
    n = c.n(16 << 20, 256)
    A = _random_csr(c, n, 16, t.float32)
    x = t.randn(n, device=c.dev)

    def step() -> None:
        for _ in range(10):
            A @ x
    return Job(step, 10 * n * 16 * 12.0, "B", [A, x])


def b_spmm(c: Ctx) -> Job:
    t = c.torch
    n = c.n(4 << 20, 256)
    A = _random_csr(c, n, 32, t.float32)
    D = t.randn(n, c.n(64, 4), device=c.dev)

    def step() -> None:
        for _ in range(2):
            A @ D
    return Job(step, 0.0, "-", [A, D])


def _poisson3d(c: Ctx, m: int) -> Any:
    """7-point Laplacian on an m^3 grid (Dirichlet) as fp64 CSR; columns sorted within rows."""
    t = c.torch
    N = m**3
    r = t.arange(N, device=c.dev)
    i, j, k = r // (m * m), (r // m) % m, r % m
    offs = [(-m * m, i > 0), (-m, j > 0), (-1, k > 0), (0, None), (1, k < m - 1), (m, j < m - 1),
            (m * m, i < m - 1)]
    cols = t.stack([r + o for o, _ in offs], 1)
    valid = t.stack([t.ones_like(i, dtype=t.bool) if v is None else v for _, v in offs], 1)
    vals = t.full(cols.shape, -1.0, dtype=t.float64, device=c.dev)
    vals[:, 3] = 6.0
    crow = t.zeros(N + 1, dtype=t.int64, device=c.dev)
    crow[1:] = valid.sum(1).cumsum(0)
    return t.sparse_csr_tensor(crow, cols[valid], vals[valid], (N, N))


def b_cg(c: Ctx) -> Job:
    """Conjugate gradient in fp64 on the 3-D Poisson matrix; 10 iterations per step, restarts."""
    t = c.torch
    A = _poisson3d(c, c.n(256, 8))
    n = A.shape[0]
    s: dict[str, Any] = {}

    def restart() -> None:
        s["b"] = t.randn(n, device=c.dev, dtype=t.float64)
        s["x"] = t.zeros_like(s["b"])
        s["r"] = s["b"].clone()
        s["p"] = s["r"].clone()
        s["rr"] = s["r"].dot(s["r"])
        s["rr0"] = float(s["rr"])
    restart()

    def step() -> None:
        for _ in range(10):
            Ap = A @ s["p"]
            alpha = s["rr"] / s["p"].dot(Ap)
            s["x"].add_(alpha * s["p"])
            s["r"].sub_(alpha * Ap)
            rr = s["r"].dot(s["r"])
            s["p"] = s["r"] + (rr / s["rr"]) * s["p"]
            s["rr"] = rr
        if float(s["rr"]) < 1e-20 * s["rr0"]:
            restart()
    return Job(step, 0.0, "-", [A, s])


def _spd(c: Ctx, n: int) -> Any:
    t = c.torch
    S = t.randn(n, n, device=c.dev, dtype=t.float64)
    S = (S + S.T) * 0.5
    S.diagonal().add_(float(n))
    return S


def b_lu(c: Ctx) -> Job:
    t = c.torch
    n = c.n(16384, 64)
    A = _spd(c, n)
    B = t.randn(n, 64, device=c.dev, dtype=t.float64)
    return Job(lambda: t.linalg.solve(A, B), 2.0 / 3.0 * n**3, "FLOP", [A, B])


def b_cholesky(c: Ctx) -> Job:
    t = c.torch
    n = c.n(16384, 64)
    A = _spd(c, n)
    return Job(lambda: t.linalg.cholesky(A), n**3 / 3.0, "FLOP", [A])


NBODY_SRC = r"""
extern "C" __global__ void nbody(const REAL* __restrict__ p, REAL* __restrict__ acc, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  REAL xi = p[4*i], yi = p[4*i+1], zi = p[4*i+2];
  REAL ax = 0, ay = 0, az = 0;
  for (int j = 0; j < n; j++) {
    REAL dx = p[4*j] - xi, dy = p[4*j+1] - yi, dz = p[4*j+2] - zi;
    REAL r2 = dx*dx + dy*dy + dz*dz + (REAL)1e-3;
    REAL inv = RSQRT(r2);
    REAL s = p[4*j+3] * inv * inv * inv;
    ax += dx * s; ay += dy * s; az += dz * s;
  }
  acc[3*i] = ax; acc[3*i+1] = ay; acc[3*i+2] = az;
}
"""


def b_nbody(dt: str) -> Callable[[Ctx], Job]:
    """All-pairs gravity. On CUDA a CuPy (NVRTC) kernel: FMA/rsqrt bound. On CPU a torch reference."""
    def build(c: Ctx) -> Job:
        t = c.torch
        n = c.n(65536 if dt == "fp32" else 32768, 128)
        flop = 20.0 * n * n
        if not c.cuda:
            p = t.randn(n, 4, dtype=c.dtype(dt))

            def ref() -> None:
                d = p[None, :, :3] - p[:, None, :3]
                inv = (d.pow(2).sum(-1) + 1e-3).rsqrt()
                (d * (p[None, :, 3] * inv**3)[..., None]).sum(1)
            return Job(ref, flop, "FLOP", [p])
        import cupy as cp  # on the GPU machine; absent here is a FAIL, not a silent fallback

        real = "float" if dt == "fp32" else "double"
        src = NBODY_SRC.replace("REAL", real).replace("RSQRT", "rsqrtf" if dt == "fp32" else "rsqrt")
        kern = cp.RawKernel(src, "nbody")
        cdt = cp.float32 if dt == "fp32" else cp.float64
        p = cp.random.standard_normal((n, 4), dtype=cdt)
        acc = cp.empty((n, 3), dtype=cdt)
        grid = ((n + 255) // 256,)

        def step() -> None:
            for _ in range(4 if dt == "fp32" else 1):
                kern(grid, (256,), (p, acc, cp.int32(n)))
            cp.cuda.get_current_stream().synchronize()
        return Job(step, flop * (4 if dt == "fp32" else 1), "FLOP", [p, acc, kern])
    return build


MC_SRC = """
template <typename T> T mc_option(T seed, T S0, T K, T r, T sig, T paths) {
  unsigned int s = (unsigned int)seed * 747796405u + 2891336453u;
  T drift = (r - T(0.5) * sig * sig), vol = sig, acc = T(0);
  int np = (int)paths;
  for (int p = 0; p < np; p++) {
    s = s * 1664525u + 1013904223u; T u1 = T(s >> 8) * T(1.0 / 16777216.0) + T(1e-7);
    s = s * 1664525u + 1013904223u; T u2 = T(s >> 8) * T(1.0 / 16777216.0);
    T z = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
    T ST = S0 * expf(drift + vol * z);
    acc += ST > K ? ST - K : T(0);
  }
  return acc / paths;
}
"""


def b_mc_option(c: Ctx) -> Job:
    """Monte-Carlo option pricing with in-register RNG: transcendental/FP32 bound (jiterator)."""
    t = c.torch
    n, paths = c.n(1 << 20, 256), c.n(1024, 8)
    seeds = t.arange(n, device=c.dev, dtype=t.float32)
    if c.cuda:
        fn = t.cuda.jiterator._create_jit_fn(MC_SRC, S0=100.0, K=105.0, r=0.05, sig=0.2, paths=1.0)

        def step() -> None:
            for _ in range(8):
                fn(seeds, S0=100.0, K=105.0, r=0.05, sig=0.2, paths=float(paths)).mean()
        return Job(step, 8 * 40.0 * n * paths, "FLOP", [seeds, fn])

    def ref() -> None:
        u1 = t.rand(n, paths) + 1e-7
        u2 = t.rand(n, paths)
        z = (-2 * u1.log()).sqrt() * (6.2831853 * u2).cos()
        (100.0 * (0.05 - 0.02 + 0.2 * z).exp() - 105.0).clamp_min(0).mean()
    return Job(ref, 40.0 * n * paths, "FLOP", [seeds])


def b_bincount(c: Ctx) -> Job:
    t = c.torch
    x = t.randint(0, 1 << 20, (c.n(256 << 20, 4096),), device=c.dev)
    return Job(lambda: t.bincount(x, minlength=1 << 20), x.numel() * 8.0, "B", [x])


def b_scatter_add(c: Ctx) -> Job:
    t = c.torch
    n = c.n(256 << 20, 4096)
    tgt = t.zeros(c.n(64 << 20, 1024), device=c.dev)
    idx = t.randint(0, tgt.numel(), (n,), device=c.dev)
    src = t.randn(n, device=c.dev)
    return Job(lambda: tgt.scatter_add_(0, idx, src), n * 12.0, "B", [tgt, idx, src])


def b_reduce(c: Ctx) -> Job:
    t = c.torch
    x = t.randn(c.n(1 << 30, 4096), device=c.dev)

    def step() -> None:
        x.sum()
        x.amax()
        t.linalg.vector_norm(x)
    return Job(step, 3 * x.numel() * 4.0, "B", [x])


def b_sort(c: Ctx) -> Job:
    t = c.torch
    keys = t.randint(0, 1 << 62, (c.n(128 << 20, 4096),), device=c.dev)
    return Job(lambda: t.sort(keys), 0.0, "-", [keys])


def b_copy(c: Ctx) -> Job:
    t = c.torch
    x = t.randn(c.n(1 << 30, 4096), device=c.dev)
    y = t.empty_like(x)

    def step() -> None:
        for _ in range(4):
            y.copy_(x)
    return Job(step, 4 * 2.0 * x.numel() * 4, "B", [x, y])


def b_gather(c: Ctx) -> Job:
    t = c.torch
    src = t.randn(c.n(1 << 30, 4096), device=c.dev)
    idx = t.randint(0, src.numel(), (c.n(128 << 20, 1024),), device=c.dev)
    return Job(lambda: src[idx], idx.numel() * 16.0, "B", [src, idx])


def b_h2d(c: Ctx) -> Job:
    t = c.torch
    host = t.empty(c.n(256 << 20, 4096), pin_memory=c.cuda)
    host.fill_(1.0)
    dev = t.empty(host.shape, device=c.dev)

    def step() -> None:
        for _ in range(4):
            dev.copy_(host, non_blocking=True)
    return Job(step, 4 * host.numel() * 4.0, "B", [host, dev])


