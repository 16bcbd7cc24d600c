"""Collect real H200 training data: 1 Hz NVML/GPM telemetry while 66 labelled workloads run.

Why: the classifier's default model must be trained on real jobs, and the 21 jobs in
shared/data/h200-dev are too few. Each workload stands for one job and carries the class it was
built to have (`label`); the GPM rule later gives the truth. Output keeps the format of
shared/tools/h200_probe.py as stored in shared/data/h200-dev/raw (what the replay backend reads):

  $OUT/<tag>_caps.json           static device facts
  $OUT/<tag>_samples_1hz.parquet every poll; `job` = workload name, `startup`/`gap` when none runs
  $OUT/<tag>_runs.csv            job,label,start,end,steps,rate,unit,energy_j,avg_power_w

Setup (allocation, model build, one warm-up step) happens in the gap before a job's timed window,
so a job's recorded interval is its steady work. Partial outputs are rewritten atomically every
~30 s and after each job, so a killed run still leaves usable data.

Read-only towards the GPU's settings: never changes power limits, clocks, persistence, MIG or
NVLink multicast, never resets the device.

Env:
  DUR=13        seconds per workload          GAP=2       minimum seconds between workloads
  PART=k        run workloads with index % PARTS == k (PARTS=2 default)
  ONLY=a,b      run only the named workloads  TAG=name    output prefix (default collect_part<k>)
  LIST=1        print the workload table and exit (needs neither torch nor a GPU)
  SMOKE=1       every workload for 0.3 s with small sizes; prints OK/FAIL per workload
  DEVICE=cpu    local check only: small sizes on the CPU, no NVML sampler
  DEADLINE=s    stop starting workloads that would end after s seconds (default 530; smoke 110;
                0 = none); skipped names are printed as an ONLY= line to run later
  OUT=dir       output directory (default /tmp/out)
"""

from __future__ import annotations

import contextlib
import csv
import gc
import io
import itertools
import json
import os
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

LABELS = ("compute", "memory", "mixed", "low", "idle")
RUN_FIELDS = ["job", "label", "start", "end", "steps", "rate", "unit", "energy_j", "avg_power_w",
              "job_id", "user"]
USERS = ("ayaka", "bruno", "chen", "dana", "emeka", "farah")
GPM_IDS = {
    "gpm_sm_util": 2, "gpm_sm_occupancy": 3, "gpm_int_util": 4, "gpm_any_tensor_util": 5,
    "gpm_dfma_tensor_util": 6, "gpm_hmma_tensor_util": 7, "gpm_dmma_tensor_util": 8,
    "gpm_dram_bw_util": 10, "gpm_fp64_util": 11, "gpm_fp32_util": 12, "gpm_fp16_util": 13,
    "gpm_pcie_tx_mibs": 20, "gpm_pcie_rx_mibs": 21, "gpm_graphics_util": 1,
}
INT_COLS = ("clock_event_reasons", "energy_mj", "mem_clock_mhz", "n_procs", "power_instant_mw",
            "power_mw", "pstate", "sm_clock_mhz", "temp_c", "util_gpu", "util_mem")
FLOAT_COLS = ("fb_used_mib", "nvml_basic_us", "nvml_gpm_us", "ts", *GPM_IDS)
STARTUP_S = 15.0  # torch import + CUDA context + sampler lead-in, measured order of magnitude
FLUSH_EVERY_S = 30.0


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    """Everything the environment decides, read once."""

    out: str
    dur: float
    gap: float
    part: int | None
    parts: int
    only: tuple[str, ...]
    list_only: bool
    smoke: bool
    device: str
    deadline: float
    tag: str
    job_base: int
    spool: str | None

    @staticmethod
    def from_env(env: dict[str, str]) -> Config:
        smoke = env.get("SMOKE", "") not in ("", "0")
        part = int(env["PART"]) if env.get("PART", "") != "" else None
        parts = int(env.get("PARTS", "2"))
        if part is not None and not 0 <= part < parts:
            raise SystemExit(f"PART={part} must be in 0..{parts - 1} (PARTS={parts})")
        dur = 0.3 if smoke else float(env.get("DUR", "13"))
        gap = float(env.get("GAP", "0.2" if smoke else "2"))
        deadline = float(env.get("DEADLINE", "110" if smoke else "530"))
        tag = env.get("TAG") or ("smoke" if smoke else f"collect_part{part}" if part is not None
                                 else "collect_all")
        only = tuple(x.strip() for x in env.get("ONLY", "").split(",") if x.strip())
        return Config(out=env.get("OUT", "/tmp/out"), dur=dur, gap=gap, part=part, parts=parts,
                      only=only, list_only=env.get("LIST", "") not in ("", "0"), smoke=smoke,
                      device=env.get("DEVICE", "cuda"), deadline=deadline, tag=tag,
                      job_base=int(env.get("JOB_BASE", str(6000 + 100 * (part or 0)))),
                      spool=env.get("SPOOL") or None)


@dataclass
class Job:
    """A built workload: step() does one unit of work; work is FLOP or bytes per step (0 = n/a)."""

    step: Callable[[], object]
    work: float = 0.0
    unit: str = "-"
    state: list[Any] = field(default_factory=list)  # keeps buffers alive; dropped after the job


@dataclass(frozen=True)
class Workload:
    name: str
    label: str
    family: str
    desc: str
    build: Callable[[Ctx], Job]


class Ctx:
    """What builders need: torch, the device, size scaling and the job's clock."""

    def __init__(self, torch: Any, device: str, small: bool, dur: float) -> None:
        self.torch = torch
        self.dev = device
        self.cuda = device.startswith("cuda")
        self.small = small
        self.dur = dur
        self.t0 = time.time()
        self._nn: Any = None

    def n(self, full: int, small: int) -> int:
        return small if self.small else full

    def elapsed(self) -> float:
        """Seconds since the timed window began (multi-phase and bursty jobs key off it)."""
        return time.time() - self.t0

    def frac(self) -> float:
        return self.elapsed() / self.dur

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def sleep(self, s: float) -> None:
        time.sleep(min(s, 0.05) if self.small else s)

    @property
    def nn(self) -> Any:
        if self._nn is None:
            self._nn = _model_classes(self.torch)
        return self._nn

    def autocast(self, enabled: bool = True) -> Any:
        return self.torch.autocast("cuda" if self.cuda else "cpu", dtype=self.torch.bfloat16,
                                   enabled=enabled)

    def dtype(self, name: str) -> Any:
        t = self.torch
        return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32, "tf32": t.float32,
                "fp64": t.float64}[name]


# ----------------------------------------------------------------------------- models (torch.nn)


def _model_classes(torch: Any) -> SimpleNamespace:
    """Real architectures written out in code (no downloads): GPT, ResNet-50, ViT, DLRM, MLP."""
    nn = torch.nn
    F = nn.functional

    class Block(nn.Module):  # pre-norm decoder block, SwiGLU MLP, grouped-query attention
        def __init__(self, d: int, heads: int, kv_heads: int, ff: int, dtype: Any) -> None:
            super().__init__()
            self.h, self.kvh, self.hd = heads, kv_heads, d // heads
            self.n1 = nn.RMSNorm(d, dtype=dtype)
            self.q = nn.Linear(d, d, bias=False, dtype=dtype)
            self.kv = nn.Linear(d, 2 * kv_heads * self.hd, bias=False, dtype=dtype)
            self.o = nn.Linear(d, d, bias=False, dtype=dtype)
            self.n2 = nn.RMSNorm(d, dtype=dtype)
            self.up = nn.Linear(d, 2 * ff, bias=False, dtype=dtype)
            self.down = nn.Linear(ff, d, bias=False, dtype=dtype)

        def forward(self, x: Any, cache: Any = None, pos: int = 0) -> Any:
            B, T, D = x.shape
            h = self.n1(x)
            q = self.q(h).view(B, T, self.h, self.hd).transpose(1, 2)
            kv = self.kv(h).view(B, T, 2, self.kvh, self.hd)
            k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            gqa = self.kvh != self.h
            if cache is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            else:
                kc, vc = cache
                kc[:, :, pos:pos + T] = k
                vc[:, :, pos:pos + T] = v
                a = F.scaled_dot_product_attention(q, kc[:, :, :pos + T], vc[:, :, :pos + T],
                                                   enable_gqa=gqa)
            x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
            g, u = self.up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)

    class GPT(nn.Module):
        def __init__(self, vocab: int, d: int, layers: int, heads: int, kv_heads: int, ff: int,
                     dtype: Any = None) -> None:
            super().__init__()
            self.vocab = vocab
            self.emb = nn.Embedding(vocab, d, dtype=dtype)
            self.blocks = nn.ModuleList(Block(d, heads, kv_heads, ff, dtype) for _ in range(layers))
            self.norm = nn.RMSNorm(d, dtype=dtype)
            self.head = nn.Linear(d, vocab, bias=False, dtype=dtype)

        def forward(self, ids: Any, caches: Any = None, pos: int = 0) -> Any:
            x = self.emb(ids)
            for i, b in enumerate(self.blocks):
                x = b(x, None if caches is None else caches[i], pos)
            return self.head(self.norm(x))

        def new_cache(self, batch: int, length: int, fill: int) -> list[tuple[Any, Any]]:
            out = []
            for b in self.blocks:
                w = b.q.weight
                kc = torch.zeros(batch, b.kvh, length, b.hd, dtype=w.dtype, device=w.device)
                vc = torch.zeros_like(kc)
                kc[:, :, :fill].normal_()
                vc[:, :, :fill].normal_()
                out.append((kc, vc))
            return out

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, stride: int) -> None:
            super().__init__()
            cout = mid * 4
            self.c1, self.b1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
            self.c2, self.b2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
            self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

        def forward(self, x: Any) -> Any:
            y = F.relu(self.b1(self.c1(x)))
            y = F.relu(self.b2(self.c2(y)))
            y = self.b3(self.c3(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):  # ResNet-50 layout [3, 4, 6, 3] at width 64
        def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), width: int = 64,
                     classes: int = 1000) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], width
            for i, n in enumerate(layers):
                mid = width * 2**i
                for j in range(n):
                    blocks.append(Bottleneck(cin, mid, 2 if (j == 0 and i > 0) else 1))
                    cin = mid * 4
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x: Any) -> Any:
            x = self.blocks(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class ViT(nn.Module):  # ViT-B/16 layout: d=768, 12 layers, 12 heads
        def __init__(self, img: int, patch: int = 16, d: int = 768, layers: int = 12, heads: int = 12,
                     classes: int = 1000) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, d, patch, patch)
            self.cls = nn.Parameter(torch.zeros(1, 1, d))
            self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, d) * 0.02)
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, classes)

        def forward(self, x: Any) -> Any:
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            return self.head(self.norm(self.enc(x)[:, 0]))

    class DLRM(nn.Module):  # embedding-heavy recommender: sparse bags + bottom/top MLPs
        def __init__(self, tables: int, rows: int, dim: int) -> None:
            super().__init__()
            self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
                                     for _ in range(tables))
            self.bottom = nn.Sequential(nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, dim), nn.ReLU())
            self.top = nn.Sequential(nn.Linear((tables + 1) * dim, 1024), nn.ReLU(),
                                     nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 1))

        def forward(self, dense: Any, idx: Any, offsets: Any) -> Any:
            z = [self.bottom(dense)] + [e(idx[i], offsets) for i, e in enumerate(self.emb)]
            return self.top(torch.cat(z, 1)).squeeze(1)

    def mlp(sizes: list[int]) -> Any:
        mods: list[Any] = []
        for a, b in itertools.pairwise(sizes):
            mods += [nn.Linear(a, b), nn.GELU()]
        return nn.Sequential(*mods[:-1])

    return SimpleNamespace(GPT=GPT, ResNet=ResNet, ViT=ViT, DLRM=DLRM, mlp=mlp)


def _gpt_small(c: Ctx, dtype: Any = None) -> Any:
    """~215M-parameter GPT used for training jobs (d=1024, 12 layers, 16 heads, 32k vocab)."""
    t = c.torch
    with t.device(c.dev):
        if c.small:
            return c.nn.GPT(512, 64, 2, 4, 4, 128, dtype)
        return c.nn.GPT(32000, 1024, 12, 16, 16, 2816, dtype)


def _gpt_3b(c: Ctx) -> Any:
    """~3.1B-parameter bf16 GPT with grouped-query attention, used for KV-cache decode."""
    t = c.torch
    with t.device(c.dev):
        if c.small:
            return c.nn.GPT(512, 64, 2, 4, 2, 128, t.bfloat16).eval()
        return c.nn.GPT(32000, 4096, 16, 32, 8, 11008, t.bfloat16).eval()


def _train_step(c: Ctx, model: Any, opt: Any, loss_fn: Callable[[], Any], amp: bool) -> Callable[[], None]:
    def step() -> None:
        with c.autocast(amp):
            loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def _adamw(c: Ctx, model: Any) -> Any:
    return c.torch.optim.AdamW(model.parameters(), lr=1e-4, fused=c.cuda)


# ----------------------------------------------------------------------------- builders


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


def b_gpt_train(batch: int, seq: int, amp: bool = True) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        model = _gpt_small(c)
        opt = _adamw(c, model)
        B, S = c.n(batch, 2), c.n(seq, 32)
        ids = t.randint(0, model.vocab, (B, S + 1), device=c.dev)
        F = t.nn.functional

        def loss() -> Any:
            logits = model(ids[:, :-1])
            return F.cross_entropy(logits.reshape(-1, model.vocab).float(), ids[:, 1:].reshape(-1))
        n_params = sum(p.numel() for p in model.parameters())
        return Job(_train_step(c, model, opt, loss, amp), 6.0 * n_params * B * S, "FLOP", [model, opt, ids])
    return build


def b_gpt_prefill(batch: int, seq: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        model = _gpt_small(c, t.bfloat16).eval()
        ids = t.randint(0, model.vocab, (c.n(batch, 2), c.n(seq, 32)), device=c.dev)

        def step() -> None:
            with t.no_grad():
                model(ids)
        n_params = sum(p.numel() for p in model.parameters())
        return Job(step, 2.0 * n_params * ids.numel(), "FLOP", [model, ids])
    return build


def _decoder(c: Ctx, model: Any, batch: int, ctx_len: int, gen: int = 128,
             tokens: int = 16) -> tuple[Callable[[], None], Any]:
    """KV-cache decode: `tokens` new tokens per step; the cache rewinds to the prompt after `gen`."""
    t = c.torch
    caches = model.new_cache(batch, ctx_len + gen, ctx_len)
    st: dict[str, Any] = {"pos": ctx_len, "ids": t.randint(0, model.vocab, (batch, 1), device=c.dev)}

    def step() -> None:
        with t.no_grad():
            for _ in range(tokens):
                if st["pos"] >= ctx_len + gen:
                    st["pos"] = ctx_len
                logits = model(st["ids"], caches, st["pos"])
                st["ids"] = logits[:, -1:].argmax(-1)
                st["pos"] += 1
    return step, caches


def b_gpt_decode(batch: int, ctx_len: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        model = _gpt_3b(c)
        B, L = c.n(batch, 2), c.n(ctx_len, 16)
        step, caches = _decoder(c, model, B, L, gen=c.n(128, 8), tokens=c.n(16, 2))
        n_params = sum(p.numel() for p in model.parameters())
        return Job(step, 2.0 * n_params * B * c.n(16, 2), "FLOP", [model, caches])
    return build


def _images(c: Ctx, batch: int, img: int) -> tuple[Any, Any]:
    t = c.torch
    x = t.randn(batch, 3, img, img, device=c.dev).to(memory_format=t.channels_last)
    y = t.randint(0, 1000, (batch,), device=c.dev)
    return x, y


def b_resnet_train(batch: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        with t.device(c.dev):
            m = (c.nn.ResNet((1, 1, 1, 1), 8) if c.small else c.nn.ResNet()).to(memory_format=t.channels_last)
        opt = t.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        x, y = _images(c, c.n(batch, 2), c.n(224, 32))
        step = _train_step(c, m, opt, lambda: t.nn.functional.cross_entropy(m(x), y), True)
        return Job(step, x.shape[0] * 3 * 4.1e9 * 2, "FLOP", [m, opt, x, y])
    return build


def b_resnet_infer(batch: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        with t.device(c.dev):
            m = (c.nn.ResNet((1, 1, 1, 1), 8) if c.small else c.nn.ResNet()).eval()
        m = m.to(memory_format=t.channels_last)
        x, _ = _images(c, c.n(batch, 2), c.n(224, 32))

        def step() -> None:
            with t.no_grad(), c.autocast():
                m(x)
        return Job(step, x.shape[0] * 4.1e9 * 2, "FLOP", [m, x])
    return build


def _vit(c: Ctx) -> Any:
    t = c.torch
    with t.device(c.dev):
        return c.nn.ViT(32, 8, 32, 1, 2, 10) if c.small else c.nn.ViT(224)


def b_vit_train(batch: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        m = _vit(c)
        opt = _adamw(c, m)
        x, y = _images(c, c.n(batch, 2), c.n(224, 32))
        y = y % m.head.out_features
        step = _train_step(c, m, opt, lambda: t.nn.functional.cross_entropy(m(x), y), True)
        return Job(step, x.shape[0] * 17.6e9 * 2 * 3, "FLOP", [m, opt, x, y])
    return build


def b_vit_infer(batch: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        m = _vit(c).eval()
        x, _ = _images(c, c.n(batch, 2), c.n(224, 32))

        def step() -> None:
            with t.no_grad(), c.autocast():
                m(x)
        return Job(step, x.shape[0] * 17.6e9 * 2, "FLOP", [m, x])
    return build


def b_mlp_train(c: Ctx) -> Job:
    t = c.torch
    w = c.n(8192, 64)
    with t.device(c.dev):
        m = c.nn.mlp([c.n(4096, 32), w, w, w, w, 1000])
    opt = _adamw(c, m)
    B = c.n(8192, 16)
    x = t.randn(B, c.n(4096, 32), device=c.dev)
    y = t.randint(0, 1000, (B,), device=c.dev)
    step = _train_step(c, m, opt, lambda: t.nn.functional.cross_entropy(m(x), y), True)
    n_params = sum(p.numel() for p in m.parameters())
    return Job(step, 6.0 * n_params * B, "FLOP", [m, opt, x, y])


def b_rnn_train(kind: str, batch: int) -> Callable[[Ctx], Job]:
    def build(c: Ctx) -> Job:
        t = c.torch
        nn = t.nn
        H, V, S = c.n(1024, 32), c.n(8000, 50), c.n(128, 8)
        with t.device(c.dev):
            emb = nn.Embedding(V, c.n(512, 16))
            rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(c.n(512, 16), H, num_layers=2, batch_first=True)
            head = nn.Linear(H, V)
            model = nn.ModuleList([emb, rnn, head])
        opt = t.optim.Adam(model.parameters(), lr=1e-3)
        ids = t.randint(0, V, (c.n(batch, 2), S + 1), device=c.dev)

        def loss() -> Any:
            h, _ = rnn(emb(ids[:, :-1]))
            return nn.functional.cross_entropy(head(h).reshape(-1, V), ids[:, 1:].reshape(-1))
        return Job(_train_step(c, model, opt, loss, False), 0.0, "-", [model, opt, ids])
    return build


def _dlrm(c: Ctx) -> Any:
    t = c.torch
    with t.device(c.dev):
        return c.nn.DLRM(c.n(8, 2), c.n(2_000_000, 100), c.n(128, 8))


def _dlrm_batch(c: Ctx, m: Any, B: int, bag: int) -> tuple[Any, Any, Any]:
    t = c.torch
    rows = m.emb[0].num_embeddings
    dense = t.randn(B, 13, device=c.dev)
    idx = t.randint(0, rows, (len(m.emb), B * bag), device=c.dev)
    offsets = t.arange(0, B * bag, bag, device=c.dev)
    return dense, idx, offsets


def b_dlrm_train(c: Ctx) -> Job:
    t = c.torch
    m = _dlrm(c)
    opt = t.optim.SGD(m.parameters(), lr=0.01)
    B = c.n(8192, 8)

    def loss() -> Any:
        dense, idx, off = _dlrm_batch(c, m, B, 32)
        y = t.randint(0, 2, (B,), device=c.dev).float()
        return t.nn.functional.binary_cross_entropy_with_logits(m(dense, idx, off), y)
    return Job(_train_step(c, m, opt, loss, False), 0.0, "-", [m, opt])


def b_dlrm_infer(c: Ctx) -> Job:
    t = c.torch
    m = _dlrm(c).eval()
    B = c.n(65536, 8)

    def step() -> None:
        with t.no_grad():
            m(*_dlrm_batch(c, m, B, 32))
    return Job(step, 0.0, "-", [m])


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


def b_starved_resnet(c: Ctx) -> Job:
    """CPU-side 'decode + augment' of each batch in numpy, then one small ResNet-50 step."""
    import numpy as np

    t = c.torch
    with t.device(c.dev):
        m = (c.nn.ResNet((1, 1, 1, 1), 8) if c.small else c.nn.ResNet()).to(memory_format=t.channels_last)
    opt = t.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    B, img = c.n(32, 2), c.n(160, 32)

    def batch() -> tuple[Any, Any]:
        out = np.empty((B, img, img, 3), np.float32)
        for k in range(B):  # per-image work, as a data loader worker would do
            raw = rng.integers(0, 255, (img + 32, img + 32, 3), dtype=np.uint8).astype(np.float32)
            blur = (raw[:-2, 1:-1] + raw[2:, 1:-1] + raw[1:-1, :-2] + raw[1:-1, 2:]) * 0.25
            out[k] = blur[15:15 + img, 15:15 + img][:, ::-1] / 255.0 - 0.5
        x = t.from_numpy(out).permute(0, 3, 1, 2).to(c.dev).contiguous(memory_format=t.channels_last)
        return x, t.randint(0, 1000, (B,), device=c.dev)

    def step() -> None:
        x, y = batch()
        with c.autocast():
            loss = t.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return Job(step, 0.0, "-", [m, opt])


def b_starved_tokenize(c: Ctx) -> Job:
    """Python tokenisation of each batch (dict lookups over generated text), then one GPT step."""
    import random

    t = c.torch
    model = _gpt_small(c)
    opt = _adamw(c, model)
    rnd = random.Random(0)
    words = [f"w{i}" for i in range(50000)]
    vocab = {w: i % model.vocab for i, w in enumerate(words)}
    B, S = c.n(8, 2), c.n(512, 32)
    F = t.nn.functional

    def step() -> None:
        text = " ".join(rnd.choice(words) for _ in range(c.n(150_000, 500)))
        toks = [vocab.get(w, 0) for w in text.split()][: B * (S + 1)]
        ids = t.tensor(toks, device=c.dev).view(B, S + 1)
        with c.autocast():
            logits = model(ids[:, :-1]).reshape(-1, model.vocab).float()
            loss = F.cross_entropy(logits, ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return Job(step, 0.0, "-", [model, opt])


def b_starved_sleep(c: Ctx) -> Job:
    t = c.torch
    a = t.randn(c.n(4096, 64), c.n(4096, 64), device=c.dev, dtype=t.bfloat16)

    def step() -> None:
        c.sleep(0.15)  # waiting on a remote file system / a slow reader
        for _ in range(4):
            a @ a
    return Job(step, 0.0, "-", [a])


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


# ----------------------------------------------------------------------------- the workload table


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


# ----------------------------------------------------------------------------- NVML sampling


def _safe(f: Callable[..., Any], *a: Any) -> Any:
    try:
        return f(*a)
    except Exception as e:
        return f"ERR {type(e).__name__}: {e}"


def read_caps(N: Any, h: Any) -> dict[str, Any]:
    """Static device facts, exactly as h200_probe.py records them."""
    caps: dict[str, Any] = {
        "name": _safe(N.nvmlDeviceGetName, h),
        "driver": _safe(N.nvmlSystemGetDriverVersion),
        "nvml": _safe(N.nvmlSystemGetNVMLVersion),
        "power_mw": _safe(N.nvmlDeviceGetPowerUsage, h),
        "energy_mj": _safe(N.nvmlDeviceGetTotalEnergyConsumption, h),
        "limit_mw": _safe(N.nvmlDeviceGetPowerManagementLimit, h),
        "default_limit_mw": _safe(N.nvmlDeviceGetPowerManagementDefaultLimit, h),
        "enforced_limit_mw": _safe(N.nvmlDeviceGetEnforcedPowerLimit, h),
        "limit_constraints_mw": _safe(N.nvmlDeviceGetPowerManagementLimitConstraints, h),
        "mig_mode": _safe(N.nvmlDeviceGetMigMode, h),
        "clocks_max_sm": _safe(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_SM),
        "clocks_max_mem": _safe(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_MEM),
        "supported_sm_clocks_sample": None,
        "persistence": _safe(N.nvmlDeviceGetPersistenceMode, h),
        "compute_mode": _safe(N.nvmlDeviceGetComputeMode, h),
        "uuid": _safe(N.nvmlDeviceGetUUID, h),
        "serial": _safe(N.nvmlDeviceGetSerial, h),
        "pci": str(_safe(N.nvmlDeviceGetPciInfo, h)),
    }
    try:
        caps["gpm_supported"] = int(N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    except Exception as e:
        caps["gpm_supported"] = f"ERR {e}"
    mem = _safe(N.nvmlDeviceGetMemoryInfo, h)
    caps["fb_total_mib"] = mem.total / 2**20 if hasattr(mem, "total") else None
    try:
        fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_POWER_INSTANT, N.NVML_FI_DEV_POWER_AVERAGE])
        caps["field_power"] = [(f.nvmlReturn, f.value.uiVal) for f in fv]
    except Exception as e:
        caps["field_power"] = f"ERR {e}"
    return {k: (v if isinstance(v, (int, float, str, type(None), list, dict)) else str(v))
            for k, v in caps.items()}


class Sampler:
    """1 Hz NVML (+GPM over the preceding second) poller in a background thread, as in the probe."""

    def __init__(self, N: Any, h: Any, use_gpm: bool) -> None:
        self.N, self.h, self.use_gpm = N, h, use_gpm
        self.job = "startup"
        self.rows: list[dict[str, Any]] = []
        self.gpm_errors = 0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._th.start()

    def stop(self) -> None:
        self._stop.set()
        self._th.join()

    def _loop(self) -> None:
        N, h = self.N, self.h
        prev = N.nvmlGpmSampleAlloc() if self.use_gpm else None
        cur = N.nvmlGpmSampleAlloc() if self.use_gpm else None
        if self.use_gpm:
            N.nvmlGpmSampleGet(h, prev)
        nxt = time.time() + 1.0
        while not self._stop.is_set():
            time.sleep(max(0.0, nxt - time.time()))
            nxt += 1.0
            try:
                prev, cur = self._poll(prev, cur)
            except Exception:
                traceback.print_exc()

    def _poll(self, prev: Any, cur: Any) -> tuple[Any, Any]:
        N, h = self.N, self.h
        t0 = time.perf_counter()
        r: dict[str, Any] = {"ts": time.time(), "job": self.job}
        r["power_mw"] = N.nvmlDeviceGetPowerUsage(h)
        r["energy_mj"] = N.nvmlDeviceGetTotalEnergyConsumption(h)
        try:
            fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_POWER_INSTANT])
            r["power_instant_mw"] = fv[0].value.uiVal if fv[0].nvmlReturn == 0 else None
        except Exception:
            r["power_instant_mw"] = None
        u = N.nvmlDeviceGetUtilizationRates(h)
        r["util_gpu"], r["util_mem"] = u.gpu, u.memory
        r["sm_clock_mhz"] = N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)
        r["mem_clock_mhz"] = N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM)
        r["temp_c"] = N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)
        r["fb_used_mib"] = N.nvmlDeviceGetMemoryInfo(h).used / 2**20
        r["pstate"] = N.nvmlDeviceGetPerformanceState(h)
        try:
            r["clock_event_reasons"] = N.nvmlDeviceGetCurrentClocksEventReasons(h)
        except Exception:
            r["clock_event_reasons"] = None
        try:
            r["n_procs"] = len(N.nvmlDeviceGetComputeRunningProcesses(h))
        except Exception:
            r["n_procs"] = None
        t1 = time.perf_counter()
        if self.use_gpm:
            N.nvmlGpmSampleGet(h, cur)
            mg = N.c_nvmlGpmMetricsGet_t()
            mg.version = N.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_IDS)
            mg.sample1, mg.sample2 = prev, cur
            for i, mid in enumerate(GPM_IDS.values()):
                mg.metrics[i].metricId = mid
            try:
                N.nvmlGpmMetricsGet(mg)
                for i, k in enumerate(GPM_IDS):
                    r[k] = mg.metrics[i].value if mg.metrics[i].nvmlReturn == 0 else None
            except Exception as e:
                self.gpm_errors += 1
                if self.gpm_errors <= 3:
                    print(f"GPM error: {e}", flush=True)
            prev, cur = cur, prev
        t2 = time.perf_counter()
        r["nvml_basic_us"] = (t1 - t0) * 1e6
        r["nvml_gpm_us"] = (t2 - t1) * 1e6
        self.rows.append(r)
        return prev, cur


# ----------------------------------------------------------------------------- output files


def samples_table(rows: list[dict[str, Any]]) -> Any:
    """Rows -> Arrow table with the raw-sample schema of shared/data/h200-dev (sorted columns)."""
    import pyarrow as pa

    types = {**{c: pa.int64() for c in INT_COLS}, **{c: pa.float64() for c in FLOAT_COLS},
             "job": pa.large_string()}
    schema = pa.schema([(k, types[k]) for k in sorted(types)])
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)


def _atomic_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_samples(path: str, rows: list[dict[str, Any]]) -> None:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(samples_table(rows), buf)
    _atomic_bytes(path, buf.getvalue())


def write_runs(path: str, runs: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=RUN_FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(runs)
    _atomic_bytes(path, buf.getvalue().encode())


# ----------------------------------------------------------------------------- runner


class Runner:
    def __init__(self, cfg: Config, torch: Any, nvml: Any, handle: Any, sampler: Sampler | None,
                 t_start: float) -> None:
        self.cfg, self.torch, self.N, self.h, self.sampler = cfg, torch, nvml, handle, sampler
        self.t_start = t_start  # process start: the deadline counts torch import and CUDA init too
        self.ctx = Ctx(torch, cfg.device, cfg.smoke or cfg.device == "cpu", cfg.dur)
        self.runs: list[dict[str, Any]] = []
        self.prefix = os.path.join(cfg.out, cfg.tag)
        self.index = {w.name: i for i, w in enumerate(workloads())}
        uuid = nvml.nvmlDeviceGetUUID(handle) if nvml is not None else None
        self.uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        self._lock = threading.Lock()
        self._flusher_stop = threading.Event()

    def set_job(self, name: str) -> None:
        if self.sampler:
            self.sampler.job = name

    def energy_mj(self) -> int | None:
        return self.N.nvmlDeviceGetTotalEnergyConsumption(self.h) if self.N else None

    def flush(self) -> None:
        with self._lock:
            write_runs(f"{self.prefix}_runs.csv", self.runs)
            rows = list(self.sampler.rows) if self.sampler else []
            write_samples(f"{self.prefix}_samples_1hz.parquet", rows)

    def _flusher(self) -> None:
        while not self._flusher_stop.wait(FLUSH_EVERY_S):
            try:
                self.flush()
            except Exception:
                traceback.print_exc()

    def free(self) -> None:
        gc.collect()
        if self.ctx.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
            try:
                import cupy as cp
                cp.get_default_memory_pool().free_all_blocks()
            except Exception:
                pass
        self.torch.backends.cuda.matmul.allow_tf32 = False

    def job_identity(self, w: Workload) -> tuple[str, str]:
        """Slurm-like job id and user for a workload: stable across runs (JOB_BASE + table index)."""
        i = self.index[w.name]
        return str(self.cfg.job_base + i), USERS[i % len(USERS)]

    def write_spool(self, job_id: str | None, user: str | None) -> None:
        """Act as the Prolog/Epilog would: the GPU -> job file the telemetry daemon reads.

        Same format as wattclass.jobmap (kept standalone: this tool runs without wattclass).
        """
        if not self.cfg.spool or not self.uuid:
            return
        path = os.path.join(self.cfg.spool, f"{self.uuid}.json")
        if job_id is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        doc = {"version": 1, "job_id": job_id, "user": user, "uid": None, "written_at": time.time()}
        os.makedirs(self.cfg.spool, exist_ok=True)
        _atomic_bytes(path, (json.dumps(doc, sort_keys=True) + "\n").encode())

    def timed(self, w: Workload, job: Job) -> dict[str, Any]:
        c, dur = self.ctx, self.cfg.dur
        c.sync()
        job_id, user = self.job_identity(w)
        self.write_spool(job_id, user)
        self.set_job(w.name)
        t0 = c.t0 = time.time()
        e0 = self.energy_mj()
        n = 0
        while time.time() - t0 < dur:
            job.step()
            n += 1
            c.sync()
        t1 = time.time()
        e1 = self.energy_mj()
        self.set_job("gap")
        self.write_spool(None, None)
        energy = (e1 - e0) / 1e3 if e0 is not None and e1 is not None else None
        return {"job": w.name, "label": w.label, "start": t0, "end": t1, "steps": n,
                "rate": n * job.work / (t1 - t0) if job.work else None, "unit": job.unit,
                "energy_j": energy, "avg_power_w": energy / (t1 - t0) if energy is not None else None,
                "job_id": job_id, "user": user}

    def run_one(self, w: Workload) -> bool:
        t_gap = time.time()
        job: Job | None = None
        try:
            job = w.build(self.ctx)
            self.ctx.t0 = time.time()
            job.step()  # warm-up: kernels selected, plans made, allocator primed
            self.ctx.sync()
            setup = time.time() - t_gap
            time.sleep(max(0.0, self.cfg.gap - setup))
            run = self.timed(w, job)
        except Exception:
            self.set_job("gap")
            if self.sampler:  # the job failed: its samples are no job's
                for r in self.sampler.rows:
                    if r["job"] == w.name:
                        r["job"] = "gap"
            traceback.print_exc()
            print(f"FAIL {w.name}", flush=True)
            return False
        finally:
            job = None
            self.free()
        with self._lock:
            self.runs.append(run)
        rate = f"{run['rate'] / 1e12:9.3f} T{run['unit']}/s" if run["rate"] else " " * 14
        pw = f"{run['avg_power_w']:5.0f} W" if run["avg_power_w"] is not None else "    - W"
        print(f"OK   {w.name:34s} {w.label:8s} setup={setup:5.2f}s steps={run['steps']:6d} {rate} {pw}",
              flush=True)
        self.flush()
        return True

    def run(self, ws: list[Workload]) -> int:
        start = self.t_start
        fl = threading.Thread(target=self._flusher, daemon=True)
        fl.start()
        ok, failed, skipped = 0, [], []
        for w in ws:
            elapsed = time.time() - start
            if self.cfg.deadline and elapsed + self.cfg.dur + self.cfg.gap + 3 > self.cfg.deadline:
                skipped.append(w.name)
                continue
            if self.run_one(w):
                ok += 1
            else:
                failed.append(w.name)
        time.sleep(min(2.0, self.cfg.gap))  # a little idle tail after the last job
        self._flusher_stop.set()
        fl.join()
        if self.sampler:
            self.sampler.stop()
        self.flush()
        print(f"done: {ok} ok, {len(failed)} failed, {len(skipped)} skipped in {time.time() - start:.0f} s; "
              f"files {self.prefix}_*", flush=True)
        if failed:
            print("FAILED: " + ",".join(failed), flush=True)
        if skipped:
            print("SKIPPED (deadline); rerun with ONLY=" + ",".join(skipped), flush=True)
        if self.sampler and self.sampler.rows:
            rows = self.sampler.rows
            med = sorted(r["nvml_basic_us"] for r in rows)[len(rows) // 2]
            gmed = sorted(r["nvml_gpm_us"] for r in rows)[len(rows) // 2]
            print(f"samples {len(rows)} nvml_basic_us median {med:.0f} gpm_us median {gmed:.0f}")
        return 0 if not failed else 1


def main(env: dict[str, str]) -> int:
    t_start = time.time()
    cfg = Config.from_env(env)
    all_w = workloads()
    if cfg.list_only:
        print_table(all_w, cfg)
        return 0
    ws = select(all_w, cfg)
    warnings.filterwarnings("ignore")
    os.makedirs(cfg.out, exist_ok=True)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    nvml: Any = None
    handle: Any = None
    sampler: Sampler | None = None
    if cfg.device.startswith("cuda"):
        import pynvml as nvml

        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        caps = read_caps(nvml, handle)
        _atomic_bytes(f"{cfg.out}/{cfg.tag}_caps.json", json.dumps(caps, indent=1, default=str).encode())
        print(json.dumps(caps, default=str), flush=True)
        sampler = Sampler(nvml, handle, caps.get("gpm_supported") == 1)
        sampler.start()
        torch.zeros(1, device=cfg.device)  # CUDA context during `startup`, not in the first job
        time.sleep(3)
    print(f"{len(ws)} workloads, DUR={cfg.dur:g} GAP={cfg.gap:g} device={cfg.device} tag={cfg.tag}",
          flush=True)
    return Runner(cfg, torch, nvml, handle, sampler, t_start).run(ws)


if __name__ == "__main__":
    sys.exit(main(dict(os.environ)))
