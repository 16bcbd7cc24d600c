"""The device-side pieces of workloads/fresh8.py, checked on the host against plain references.

Why: the lead records these families on the H200 once; a piece that computes the wrong thing (a
neighbour map off by one offset, a sampling loop that repeats points, a lattice that leaks mass)
would spoil the recording and cannot be re-run unseen. The families are torch only, so the same
functions run here on the CPU, on small inputs, against brute-force Python or dense torch
references.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from tests.test_collect_tool import load_sweep

torch = pytest.importorskip("torch")


def test_farthest_point_sampling_matches_the_definition() -> None:
    """Each pick is the point farthest from all earlier picks (min distance, argmax), none repeated."""
    load_sweep()
    from h200_collect.workloads.fresh8 import farthest_points

    xyz = torch.rand(3, 50, 3, dtype=torch.float64)
    start = torch.tensor([0, 7, 49])
    idx = farthest_points(torch, xyz, 12, start)
    for b in range(3):
        picks = [int(start[b])]
        for _ in range(11):
            d = [min(float((xyz[b, i] - xyz[b, j]).square().sum()) for j in picks) for i in range(50)]
            picks.append(max(range(50), key=d.__getitem__))
        assert idx[b].tolist() == picks
        assert len(set(picks)) == 12


def test_ball_query_takes_the_first_points_within_the_radius() -> None:
    load_sweep()
    from h200_collect.workloads.fresh8 import ball_query

    xyz = torch.rand(2, 60, 3, dtype=torch.float64)
    centres = xyz[:, [3, 17, 40]]
    r, K = 0.35, 5
    gi = ball_query(torch, xyz, centres, r, K)
    for b in range(2):
        for s in range(3):
            inside = [i for i in range(60) if float((xyz[b, i] - centres[b, s]).norm()) <= r]
            want = (inside + [inside[0]] * K)[:K]
            assert gi[b, s].tolist() == want, (b, s)


@pytest.mark.parametrize("occupancy", ["uniform", "surface"])
def test_sparse_conv_equals_the_dense_convolution_at_the_active_voxels(occupancy: str) -> None:
    """The gather-product-scatter over the 27 neighbour maps is a 3x3x3 convolution (padding 1) of
    the zero-filled volume, read at the active voxels; and the maps hold exactly the active pairs."""
    load_sweep()
    from h200_collect.workloads.fresh8 import neighbour_maps, submanifold_conv, voxel_keys

    keys, G = voxel_keys(torch, 300, occupancy, "cpu", 5)
    n = keys.numel()
    assert bool((keys[1:] > keys[:-1]).all()) and int(keys.max()) < G ** 3
    maps = neighbour_maps(torch, keys, G)
    coords = {(int(k) // (G * G), int(k) // G % G, int(k) % G): i for i, k in enumerate(keys)}
    for k, (dx, dy, dz) in enumerate(itertools.product((-1, 0, 1), repeat=3)):
        want = sorted((coords[(x + dx, y + dy, z + dz)], i) for (x, y, z), i in coords.items()
                      if (x + dx, y + dy, z + dz) in coords)
        assert sorted(zip(maps[k][0].tolist(), maps[k][1].tolist(), strict=True)) == want, k
    Cin, Cout = 3, 4
    h = torch.randn(n, Cin, dtype=torch.float64)
    w = torch.randn(27, Cin, Cout, dtype=torch.float64)
    out = submanifold_conv(torch, h, w, maps, torch.float64)
    dense = torch.zeros(1, Cin, G, G, G, dtype=torch.float64)
    xyz = torch.stack([keys // (G * G), keys // G % G, keys % G], 1)
    dense[0, :, xyz[:, 0], xyz[:, 1], xyz[:, 2]] = h.t()
    weight = w.permute(2, 1, 0).reshape(Cout, Cin, 3, 3, 3)  # offset k = (dx, dy, dz) row-major
    ref = torch.nn.functional.conv3d(dense, weight, padding=1)[0][:, xyz[:, 0], xyz[:, 1], xyz[:, 2]].t()
    assert torch.allclose(out, ref, atol=1e-10)


@pytest.mark.parametrize("dims", [2, 3])
def test_lattice_velocity_sets_are_the_standard_ones(dims: int) -> None:
    """Weights sum to 1, first moment 0, second moment c_s^2 = 1/3 times the identity."""
    load_sweep()
    from h200_collect.workloads.fresh8 import lbm_lattice

    vel, w = lbm_lattice(dims)
    assert len(vel) == (9 if dims == 2 else 19) and len(set(vel)) == len(vel)
    c = torch.tensor(vel, dtype=torch.float64)
    wt = torch.tensor(w, dtype=torch.float64)
    assert math.isclose(float(wt.sum()), 1.0)
    assert torch.allclose(wt @ c, torch.zeros(dims, dtype=torch.float64))
    assert torch.allclose(torch.einsum("q,qa,qb->ab", wt, c, c), torch.eye(dims, dtype=torch.float64) / 3)


@pytest.mark.parametrize("lattice,collision", [("D2Q9", "bgk"), ("D2Q9", "mrt"), ("D3Q19", "bgk"),
                                               ("D3Q19", "mrt")])
def test_lattice_boltzmann_steps_keep_the_mass_and_stay_bounded(lattice: str, collision: str) -> None:
    sweep = load_sweep()
    from h200_collect.context import Ctx

    p = {"lattice": lattice, "log_sites": 16, "dtype": "fp64", "collision": collision, "tau": 0.8}
    job = sweep.FAMILIES["lattice_boltzmann"][1](p)(Ctx(torch, "cpu", True, 1.0))
    f = job.state[0]
    mass = float(f.sum())
    for _ in range(20):
        job.step()
    assert math.isclose(float(f.sum()), mass, rel_tol=1e-10)
    assert bool(torch.isfinite(f).all()) and float(f.abs().max()) < 1.0


@pytest.mark.parametrize("stratified", [False, True])
def test_resampling_draws_ancestors_in_proportion_to_their_weights(stratified: bool) -> None:
    """Systematic resampling gives particle i floor(N w_i) or ceil(N w_i) children; stratified, about
    N w_i; both return valid indices."""
    load_sweep()
    from h200_collect.workloads.fresh8 import resample_indices

    B, N = 3, 4000
    w = torch.rand(B, N, dtype=torch.float64) ** 4
    w = w / w.sum(1, keepdim=True)
    grid = torch.arange(N, dtype=torch.float64)
    u0 = torch.rand(B, N if stratified else 1, dtype=torch.float64)
    idx = resample_indices(torch, w, grid, u0)
    assert int(idx.min()) >= 0 and int(idx.max()) < N
    counts = torch.stack([torch.bincount(idx[b], minlength=N) for b in range(B)]).double()
    if stratified:
        assert float((counts - N * w).abs().max()) < 4
    else:
        assert bool(((counts - N * w).abs() < 1 + 1e-9).all())


def test_fake_quantised_weights_take_at_most_two_to_the_bits_values_per_channel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The QAT step trains through weights on a 2^bits-level grid per output channel."""
    sweep = load_sweep()
    from h200_collect.context import Ctx

    captured: list[Any] = []
    real = torch.fake_quantize_per_channel_affine

    def spy(*args: Any) -> Any:
        out = real(*args)
        captured.append(out.detach())
        return out
    monkeypatch.setattr(torch, "fake_quantize_per_channel_affine", spy)
    p = {"d": 512, "layers": 2, "tokens": 64, "bits": 4, "act_quant": True, "dtype": "fp32"}
    sweep.FAMILIES["qat_finetune"][1](p)(Ctx(torch, "cpu", True, 1.0)).step()
    assert len(captured) == 4  # two products per block, two blocks
    for wq in captured:
        assert max(len(set(row.tolist())) for row in wq) <= 16
