"""The CuPy kernels of workloads/fresh7.py, compiled for the host and run thread by thread.

Why: the lead records these families on the H200 once; a kernel that indexes wrong would spoil the
recording and cannot be re-run unseen. There is no GPU here, but the kernels are barrier-free, so
running every (block, thread) of a small grid one after another is a faithful execution (atomics
become plain read-modify-writes). g++ compiles the same source text CuPy hands to NVRTC, under a
few stand-in definitions; the results must equal the torch references of the CPU path.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.test_collect_tool import load_sweep

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the kernels")

STANDIN = r"""
#include <cstdint>
struct dim3_ { unsigned int x, y, z; };
static dim3_ threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
static inline unsigned int atomicCAS(unsigned int* a, unsigned int cmp, unsigned int v) {
    unsigned int old = *a; if (old == cmp) *a = v; return old; }
static inline unsigned int atomicAdd(unsigned int* a, unsigned int v) {
    unsigned int old = *a; *a += v; return old; }
extern "C" void set_thread(unsigned int b, unsigned int t, unsigned int nb, unsigned int nt) {
    blockIdx.x = b; threadIdx.x = t; gridDim.x = nb; blockDim.x = nt; }
"""
BLOCKS, THREADS = 3, 5  # a ragged grid: grid-stride loops must cover every element once


def build(src: str, tmp: Path, name: str) -> Any:
    cpp, so = tmp / f"{name}.cpp", tmp / f"{name}.so"
    cpp.write_text(STANDIN + src)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-Wno-unknown-pragmas", "-o", str(so), str(cpp)],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(so))


def launch(lib: Any, fn: str, *args: Any) -> None:
    cargs = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args]
    for b in range(BLOCKS):
        for t in range(THREADS):
            lib.set_thread(b, t, BLOCKS, THREADS)
            getattr(lib, fn)(*cargs)


LL, I32, U32 = ctypes.c_longlong, ctypes.c_int, ctypes.c_uint


@pytest.mark.parametrize("real,dtype", [("float", torch.float32), ("double", torch.float64)])
@pytest.mark.parametrize("order", ["sorted", "shuffled", "stencil"])
def test_lj_forces_match_the_torch_reference(tmp_path: Path, real: str, dtype: Any, order: str) -> None:
    load_sweep()
    from h200_collect.workloads.fresh7 import LJ_SRC, md_neighbors

    lib = build(LJ_SRC.replace("REAL", real), tmp_path, "lj")
    n, k = 97, 8
    nbr, offs = md_neighbors(torch, n, k, order, "cpu")
    pos = torch.rand(n, 4, dtype=dtype) * 4
    force = torch.zeros_like(pos)
    use_list = order != "stencil"
    for off, n_launch in ((0, 60), (60, 60)):  # two rolling launches cover all n (and wrap)
        launch(lib, "lj", pos, nbr, offs, force, LL(n), I32(k), I32(int(use_list)), LL(n_launch), LL(off))
    q = nbr.long() if use_list else (torch.arange(n).unsqueeze(1) + offs.long()) % n
    d = pos[:, None, :3] - pos[q][:, :, :3]
    r2 = d.square().sum(-1) + 0.8
    inv6 = r2.reciprocal() ** 3
    f = torch.where(r2 < 6.25, 24 * inv6 * (2 * inv6 - 1) / r2, torch.zeros_like(r2))
    want = (d * f.unsqueeze(-1)).sum(1)
    assert torch.allclose(force[:, :3], want, rtol=1e-4, atol=1e-4)
    assert bool((force[:, 3] == 0).all())


def test_hash_join_finds_exactly_the_build_keys_and_counts_groups(tmp_path: Path) -> None:
    load_sweep()
    from h200_collect.workloads.fresh7 import HASHJOIN_SRC, hashjoin_keys, int32_bits

    lib = build(HASHJOIN_SRC, tmp_path, "hj")
    n_build, n_probe, slots = 90, 400, 128  # load 0.7: long probe chains, wrap-around included
    bkeys, pkeys = hashjoin_keys(torch, n_build, n_probe, 0.5, "cpu")
    bk, pk = int32_bits(torch, bkeys), int32_bits(torch, pkeys)
    tkeys, tvals = torch.zeros(slots, dtype=torch.int32), torch.zeros(slots, dtype=torch.int32)
    out = torch.zeros(n_probe, dtype=torch.int32)
    launch(lib, "hj_build", bk, tkeys, tvals, LL(n_build), U32(slots - 1), I32(0))
    assert int((tkeys != 0).sum()) == n_build
    for off in range(0, n_probe, 150):
        launch(lib, "hj_probe", pk, tkeys, tvals, out, LL(n_probe), LL(150), LL(off), U32(slots - 1))
    where = {int(k): i for i, k in enumerate(bkeys)}
    want = [where.get(int(k), -1) for k in pkeys]  # the build row of each probe key, or a miss
    assert out.tolist() == want
    assert 0 < want.count(-1) < n_probe
    # group-by: counting rows per key on top of the built table
    rows = bk[torch.randint(0, n_build, (300,))]
    before = tvals.clone()
    launch(lib, "hj_build", rows, tkeys, tvals, LL(300), U32(slots - 1), I32(1))
    assert int((tkeys != 0).sum()) == n_build
    counts = torch.bincount(torch.tensor([where[int(k) % (1 << 32)] for k in rows]), minlength=n_build)
    slot_of = {int(k): s for s, k in enumerate(tkeys.tolist()) if k}
    for i, kk in enumerate(bk.tolist()):
        assert int(tvals[slot_of[kk]] - before[slot_of[kk]]) == int(counts[i])


@pytest.mark.parametrize("feature_major", [0, 1])
def test_forest_walk_matches_the_torch_reference(tmp_path: Path, feature_major: int) -> None:
    load_sweep()
    from h200_collect.workloads.fresh7 import TREES_SRC

    lib = build(TREES_SRC, tmp_path, "trees")
    n, F, T, D = 41, 7, 5, 4
    inner = (1 << D) - 1
    x = torch.rand(n, F)
    feat = torch.randint(0, F, (T, inner), dtype=torch.int32)
    thr = torch.rand(T, inner)
    leaf = torch.randn(T, 1 << D)
    xs = x.t().contiguous() if feature_major else x
    out = torch.zeros(n)
    for off in (0, 30):
        launch(lib, "forest", xs, feat, thr, leaf, out, LL(n), I32(F), I32(T), I32(D), I32(feature_major),
               LL(30), LL(off))
    tr = torch.arange(T).unsqueeze(0)
    node = torch.zeros(n, T, dtype=torch.long)
    for _ in range(D):
        v = x.gather(1, feat[tr, node].long())
        node = 2 * node + 1 + (v > thr[tr, node]).long()
    assert torch.allclose(out, leaf[tr, node - inner].sum(1), atol=1e-5)


def test_dfa_counts_match_the_torch_reference(tmp_path: Path) -> None:
    load_sweep()
    from h200_collect.workloads.fresh7 import DFA_SRC

    lib = build(DFA_SRC, tmp_path, "dfa")
    S, C, chunks = 37, 64, 23
    text = torch.randint(0, 256, (chunks * C,), dtype=torch.uint8)
    table = torch.randint(0, S, (S, 256), dtype=torch.int32)
    matches = torch.zeros(chunks, dtype=torch.int32)
    for off in (0, 16):
        launch(lib, "dfa", text, table, matches, LL(chunks), I32(C // 4), U32(S // 8), LL(16), LL(off))
    tb = text.view(chunks, C).long()
    state = torch.zeros(chunks, dtype=torch.long)
    hits = torch.zeros(chunks, dtype=torch.long)
    for b in range(C):
        state = table[state, tb[:, b]].long()
        hits += state < S // 8
    assert matches.tolist() == hits.tolist()
