"""Real architectures written out in torch.nn code (no downloads) and training-step helpers."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from h200_collect.context import Ctx


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


