"""Framework models: GPT train/prefill/decode, ResNet-50, ViT, MLP, RNNs, DLRM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from h200_collect.context import Ctx, Job
from h200_collect.models import _adamw, _gpt_3b, _gpt_small, _train_step


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


def b_gpt_decode(batch: int, ctx_len: int, tokens: int = 16) -> Callable[[Ctx], Job]:
    """KV-cache decode of the 3.1B GPT: ``tokens`` decode steps per ``step``."""
    def build(c: Ctx) -> Job:
        model = _gpt_3b(c)
        B, L = c.n(batch, 2), c.n(ctx_len, 16)
        step, caches = _decoder(c, model, B, L, gen=c.n(128, 8), tokens=c.n(tokens, 2))
        n_params = sum(p.numel() for p in model.parameters())
        return Job(step, 2.0 * n_params * B * c.n(tokens, 2), "FLOP", [model, caches])
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


