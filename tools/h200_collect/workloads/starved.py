"""GPU jobs starved by the host: data loading, tokenisation, waiting."""

from __future__ import annotations

from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.models import _adamw, _gpt_small


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

