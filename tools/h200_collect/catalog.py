"""The fixed workload table (66 named jobs), its selection and its listing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from h200_collect.config import LABELS, STARTUP_S, Config
from h200_collect.context import Ctx, Job, Workload
from h200_collect.workloads.dense import (
    b_gemm,
    b_gemv,
)
from h200_collect.workloads.hpc import (
    b_bincount,
    b_cg,
    b_cholesky,
    b_copy,
    b_fft,
    b_gather,
    b_h2d,
    b_lu,
    b_mc_option,
    b_nbody,
    b_reduce,
    b_scatter_add,
    b_sort,
    b_spmm,
    b_spmv,
    b_stencil2d,
    b_stencil3d,
)
from h200_collect.workloads.nets import (
    b_dlrm_infer,
    b_dlrm_train,
    b_gpt_decode,
    b_gpt_prefill,
    b_gpt_train,
    b_mlp_train,
    b_resnet_infer,
    b_resnet_train,
    b_rnn_train,
    b_vit_infer,
    b_vit_train,
)
from h200_collect.workloads.phases import (
    b_bursty,
    b_idle_hold,
    b_launch_tiny,
    b_mlp_b1,
    b_phase_alternate,
    b_phase_compute_memory,
    b_phase_idle_compute,
    b_phase_memory_idle,
    b_phase_train_decode,
)
from h200_collect.workloads.starved import (
    b_starved_resnet,
    b_starved_sleep,
    b_starved_tokenize,
)


def workloads() -> list[Workload]:
    """All workloads in run order; neighbours differ in kind so PART=0/1 each get a mix."""
    W: list[Workload] = []

    def add(name: str, label: str, family: str, desc: str, build: Callable[[Ctx], Job]) -> None:
        W.append(Workload(name, label, family, desc, build))

    add("gemm_bf16_4096", "compute", "gemm", "bf16 GEMM 4096^3 x64", b_gemm("bf16", 4096, 64))
    add("gemm_bf16_16384", "compute", "gemm", "bf16 GEMM 16384^3", b_gemm("bf16", 16384, 1))
    add("gemm_fp16_8192", "compute", "gemm", "fp16 GEMM 8192^3 x8", b_gemm("fp16", 8192, 8))
    add("gemm_tf32_8192", "compute", "gemm", "tf32 GEMM 8192^3 x4", b_gemm("tf32", 8192, 4))
    add("gemm_fp32_8192", "compute", "gemm", "fp32 (SIMT, no TF32) GEMM 8192^3", b_gemm("fp32", 8192, 1))
    add("gemm_fp64_8192", "compute", "gemm", "fp64 (DMMA) GEMM 8192^3", b_gemm("fp64", 8192, 1))
    add("gemm_int8_8192", "compute", "gemm", "int8 GEMM 8192^3 (torch._int_mm) x8", b_gemm("int8", 8192, 8))
    add("gemm_fp8_8192", "compute", "gemm", "fp8 e4m3 GEMM 8192^3 (_scaled_mm) x16", b_gemm("fp8", 8192, 16))
    add("gemv_bf16_m32", "memory", "gemm", "32-row bf16 GEMM over 8x 8192^2 weights", b_gemv)
    add("gpt_train_bf16_b8_s1024", "compute", "model", "GPT 215M train AMP, batch 8 x 1024",
        b_gpt_train(8, 1024))
    add("gpt_train_bf16_b32_s512", "compute", "model", "GPT 215M train AMP, batch 32 x 512",
        b_gpt_train(32, 512))
    add("gpt_train_bf16_b2_s4096", "compute", "model", "GPT 215M train AMP, batch 2 x 4096 (flash attn)",
        b_gpt_train(2, 4096))
    add("gpt_train_fp32_b4_s512", "compute", "model", "GPT 215M train fp32 (no TF32), batch 4 x 512",
        b_gpt_train(4, 512, amp=False))
    add("gpt_prefill_bf16_b16_s2048", "compute", "model", "GPT 215M bf16 prefill forward 16 x 2048",
        b_gpt_prefill(16, 2048))
    add("gpt3b_decode_b1_ctx512", "memory", "model", "GPT 3.1B GQA KV-cache decode, batch 1, ctx 512",
        b_gpt_decode(1, 512))
    add("gpt3b_decode_b8_ctx2048", "memory", "model", "GPT 3.1B decode, batch 8, ctx 2048",
        b_gpt_decode(8, 2048))
    add("gpt3b_decode_b64_ctx1024", "memory", "model", "GPT 3.1B decode, batch 64, ctx 1024",
        b_gpt_decode(64, 1024))
    add("gpt3b_decode_b256_ctx512", "compute", "model", "GPT 3.1B decode, batch 256, ctx 512",
        b_gpt_decode(256, 512))
    add("resnet50_train_b32", "compute", "model", "ResNet-50 train AMP channels-last, batch 32",
        b_resnet_train(32))
    add("resnet50_train_b128", "compute", "model", "ResNet-50 train AMP, batch 128", b_resnet_train(128))
    add("resnet50_train_b256", "compute", "model", "ResNet-50 train AMP, batch 256", b_resnet_train(256))
    add("resnet50_infer_b512", "compute", "model", "ResNet-50 inference bf16, batch 512",
        b_resnet_infer(512))
    add("vit_b16_train_b64", "compute", "model", "ViT-B/16 train AMP, batch 64", b_vit_train(64))
    add("vit_b16_infer_b256", "compute", "model", "ViT-B/16 inference bf16, batch 256", b_vit_infer(256))
    add("mlp_train_b8192", "compute", "model", "5-layer 8192-wide MLP train AMP, batch 8192", b_mlp_train)
    add("lstm_train_b64", "memory", "model", "2-layer LSTM-1024 LM train fp32, batch 64 x 128",
        b_rnn_train("lstm", 64))
    add("gru_train_b512", "compute", "model", "2-layer GRU-1024 LM train fp32, batch 512 x 128",
        b_rnn_train("gru", 512))
    add("dlrm_train_b8192", "memory", "model", "DLRM: 8x2M-row embedding bags (sparse SGD), batch 8192",
        b_dlrm_train)
    add("dlrm_infer_b65536", "memory", "model", "DLRM inference, batch 65536", b_dlrm_infer)
    add("stencil3d_7pt_fp32_512", "memory", "hpc", "Jacobi 7-point, 512^3 fp32", b_stencil3d("fp32", 512))
    add("stencil3d_7pt_fp64_384", "memory", "hpc", "Jacobi 7-point, 384^3 fp64", b_stencil3d("fp64", 384))
    add("stencil2d_5pt_fp32_16k", "memory", "hpc", "Jacobi 5-point, 16384^2 fp32", b_stencil2d)
    add("fft1d_c64", "memory", "hpc", "batched 1-D FFT 256 x 1M complex64", b_fft(1))
    add("fft2d_c64", "memory", "hpc", "2-D FFT 16 x 4096^2 complex64", b_fft(2))
    add("fft3d_c128", "memory", "hpc", "3-D FFT 512^3 complex128", b_fft(3))
    add("spmv_csr_fp32", "memory", "hpc", "CSR SpMV 16M rows x 16 nnz random", b_spmv)
    add("spmm_csr_fp32", "memory", "hpc", "CSR SpMM 4M rows x 32 nnz times 64 columns", b_spmm)
    add("cg_fp64_poisson3d", "memory", "hpc", "fp64 conjugate gradient, 3-D Poisson 256^3 CSR", b_cg)
    add("lu_solve_fp64_16384", "compute", "hpc", "dense fp64 LU solve 16384^2, 64 rhs", b_lu)
    add("cholesky_fp64_16384", "compute", "hpc", "dense fp64 Cholesky 16384^2", b_cholesky)
    add("nbody_fp32", "compute", "hpc", "all-pairs N-body 65536 bodies fp32 (CuPy kernel)", b_nbody("fp32"))
    add("nbody_fp64", "compute", "hpc", "all-pairs N-body 32768 bodies fp64 (CuPy kernel)", b_nbody("fp64"))
    add("mc_option_fp32", "compute", "hpc", "Monte-Carlo option pricing, in-register RNG (jiterator)",
        b_mc_option)
    add("histogram_bincount", "memory", "hpc", "bincount of 256M ints into 1M bins", b_bincount)
    add("scatter_add_random", "memory", "hpc", "scatter_add 256M values into 64M random slots", b_scatter_add)
    add("reduce_sum_max_norm", "memory", "hpc", "sum, max, norm over 1G fp32", b_reduce)
    add("sort_int64_128M", "memory", "hpc", "sort 128M int64 keys", b_sort)
    add("stream_copy_4GB", "memory", "hpc", "device-to-device copy 4 GB", b_copy)
    add("gather_random_128M", "memory", "hpc", "random gather of 128M from 1G fp32", b_gather)
    add("pcie_h2d_pinned", "low", "io", "pinned host-to-device copies 1 GB", b_h2d)
    add("starved_resnet_cpu_aug", "low", "starved", "ResNet-50 b32 fed by numpy per-image augmentation",
        b_starved_resnet)
    add("starved_gpt_tokenize", "low", "starved", "GPT train b8 fed by Python tokenisation",
        b_starved_tokenize)
    add("starved_sleep_gemm", "low", "starved", "150 ms wait, then 4 small GEMMs", b_starved_sleep)
    add("phase_compute_then_memory", "mixed", "phase", "bf16 GEMM first half, copy second half",
        b_phase_compute_memory)
    add("phase_memory_then_idle", "mixed", "phase", "3-D stencil first half, idle holding memory after",
        b_phase_memory_idle)
    add("phase_alternate_3s", "mixed", "phase", "fp16 GEMM / copy alternating every 3 s", b_phase_alternate)
    add("phase_train_then_decode", "mixed", "phase", "GPT train 60%, then batch-4 decode",
        b_phase_train_decode)
    add("phase_idle_then_compute", "mixed", "phase", "idle 40% (staging), then bf16 GEMM",
        b_phase_idle_compute)
    add("bursty_gemm_10pct", "low", "bursty", "bf16 GEMM 10% of each 2 s", b_bursty(0.1))
    add("bursty_gemm_30pct", "compute", "bursty", "bf16 GEMM 30% of each 2 s", b_bursty(0.3))
    add("bursty_gemm_70pct", "compute", "bursty", "bf16 GEMM 70% of each 2 s", b_bursty(0.7))
    add("bursty_copy_50pct", "memory", "bursty", "copy 50% of each 2 s", b_bursty(0.5, memory=True))
    add("idle_hold_16GB", "idle", "idle", "sleeps holding 16 GB", b_idle_hold(16))
    add("idle_hold_56GB", "idle", "idle", "sleeps holding 56 GB", b_idle_hold(56))
    add("launch_tiny_add", "low", "tiny", "2000 in-place adds on 16 floats per step", b_launch_tiny)
    add("mlp_infer_b1", "low", "tiny", "batch-1 MLP inference, host read-back per request", b_mlp_b1)
    return W


def select(ws: list[Workload], cfg: Config) -> list[Workload]:
    names = {w.name for w in ws}
    unknown = [n for n in cfg.only if n not in names]
    if unknown:
        raise SystemExit(f"ONLY names unknown workloads: {', '.join(unknown)} (LIST=1 shows them)")
    out = []
    for i, w in enumerate(ws):
        if cfg.part is not None and i % cfg.parts != cfg.part:
            continue
        if cfg.only and w.name not in cfg.only:
            continue
        out.append(w)
    return out


def print_table(ws: list[Workload], cfg: Config) -> None:
    print(f"# {'idx':>3} part label    family   name{' ' * 30} description")
    for i, w in enumerate(ws):
        print(f"{i:5d} {i % cfg.parts:4d} {w.label:8s} {w.family:8s} {w.name:34s} {w.desc}")
    counts = Counter(w.label for w in ws)
    print("# per label: " + ", ".join(f"{k}={counts.get(k, 0)}" for k in LABELS) + f"; total={len(ws)}")
    for p in range(cfg.parts):
        n = sum(1 for i in range(len(ws)) if i % cfg.parts == p)
        est = STARTUP_S + n * (cfg.dur + cfg.gap)
        print(f"# PART={p}: {n} workloads, estimated {est:.0f} s at DUR={cfg.dur:g} GAP={cfg.gap:g}")

