"""The other recipe of issue 27: a minimal GPT trained on a CPU, in plain PyTorch, on the course's text.

    .venv/bin/python benchmarks/minigpt.py --seconds 170     # as many iterations as fit in 170 s
    .venv/bin/python benchmarks/minigpt.py --iters 2000      # a fixed number, as its README runs it

What it reproduces (written for this benchmark from the recipe's description, no external
checkout): the character-level configuration of a well-known minimal GPT as its README runs it on
a CPU. Pre-LN GPT-2 blocks (LayerNorm without bias, one ``(d, 3d)`` query-key-value projection,
``F.scaled_dot_product_attention(is_causal=True)``, a GELU MLP of ``4 d``), learned positions,
the output head tied to the token table, no biases anywhere; d 128, 4 layers, 4 heads, T 64,
B 12, dropout 0. Weights drawn from N(0, 0.02^2), the residual output projections from
N(0, (0.02 / sqrt(2 n_layers))^2). AdamW (0.9, 0.99), weight decay 0.1 on every parameter of
two or more dimensions (matrices and both tables) and none on the gains; learning rate 1e-3
after a linear warm-up of 100 iterations, cosine decay to 1e-4 at the last iteration, gradient
norm clipped at 1.0, float32 on the CPU. Like the original it estimates the train and validation
loss on 20 random batches every 250 iterations (its README's CPU command: ``eval_iters 20``),
inside the timed run.

What it shares with the course: the text (``load_corpus()``), the vocabulary and the split (the
last 10% by position), and the final score, the course's one protocol (``evaluate`` in the
course's training loop): the mean next-character cross-entropy over *every* non-overlapping
window of the validation split, here windows of this recipe's T = 64.

``--seconds S`` is the wall time of the whole process from its start (interpreter start and
``import torch`` aside, as in ``txlearn train``'s budget): after iteration 50 it times its
iterations and sets the number of iterations (the length of the cosine) to what fits before the
final evaluation; every 100 iterations it checks again and, when the number that fits moved by
more than 10% (another program took or freed the cores), lays the rest of the decay over the new
number, keeping the learning rate continuous; no iteration starts that would end past the
budget. A user of the original sets the number by hand; this benchmark gives the recipe the
schedule that fits, so that the comparison is between recipes, not between guesses.

The last line of output is one JSON object (steps, seconds, the validation loss, ...), read by
``benchmarks/versus.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

STARTED = time.perf_counter()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


class Config:
    n_layers, n_heads, d, T, B = 4, 4, 128, 64, 12
    dropout = 0.0
    lr, min_lr, warmup = 1e-3, 1e-4, 100
    betas, weight_decay, grad_clip = (0.9, 0.99), 0.1, 1.0
    eval_interval, eval_iters = 250, 20
    seed = 1337


class Norm(nn.Module):
    """LayerNorm with a gain and no bias."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class SelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads = c.n_heads
        self.qkv = nn.Linear(c.d, 3 * c.d, bias=False)
        self.proj = nn.Linear(c.d, c.d, bias=False)
        self.dropout = c.dropout

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2)
                   for t in (q, k, v))                                      # (B, h, T, d_k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, d)
        return F.dropout(self.proj(y), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.attn, self.ln2 = Norm(c.d), SelfAttention(c), Norm(c.d)
        self.fc = nn.Linear(c.d, 4 * c.d, bias=False)
        self.proj = nn.Linear(4 * c.d, c.d, bias=False)
        self.dropout = c.dropout

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = self.proj(F.gelu(self.fc(self.ln2(x))))
        return x + F.dropout(h, self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, c, n_vocab):
        super().__init__()
        self.c = c
        self.tok = nn.Embedding(n_vocab, c.d)
        self.pos = nn.Embedding(c.T, c.d)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = Norm(c.d)
        self.head = nn.Linear(c.d, n_vocab, bias=False)
        self.head.weight = self.tok.weight                                  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
        for b in self.blocks:   # the residual branches' output projections, scaled down
            for w in (b.attn.proj.weight, b.proj.weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * c.n_layers))

    def forward(self, ids):
        T = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        x = F.dropout(x, self.c.dropout, self.training)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))                                     # (B, T, n_vocab)


def flops_per_iteration(model: GPT, c) -> float:
    """The usual count (forward and backward): 6 N per token for the N weights of the matrix
    products (the positions' table is a lookup, not counted) plus 12 n_layers T d per token for
    the attention's scores and weighted values, counted over the whole T x T square as the
    course counts it (``txlearn train`` uses the same count)."""
    n = sum(p.numel() for p in model.parameters()) - model.pos.weight.numel()
    return (6 * n + 12 * c.n_layers * c.T * c.d) * c.B * c.T


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--seconds", type=float, help="wall-time budget of the whole process")
    how.add_argument("--iters", type=int, help="a fixed number of iterations")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--block-size", type=int, default=Config.T, help=f"T (default {Config.T})")
    p.add_argument("--batch-size", type=int, default=Config.B, help=f"B (default {Config.B})")
    p.add_argument("--dropout", type=float, default=Config.dropout)
    p.add_argument("--lr", type=float, default=Config.lr, help="peak (min: lr / 10)")
    p.add_argument("--held-out", action="store_true",
                   help="the sweep's protocol (benchmarks/recipe_sweep.py): train on the first 90%% "
                        "of the training split, score on its last 10%%; the validation split "
                        "is not touched")
    args = p.parse_args(argv)
    from txlearn.training.data import CharVocab, load_corpus, split_by_position, val_windows

    if args.threads:
        torch.set_num_threads(args.threads)
    c = Config()
    c.T, c.B, c.dropout = args.block_size, args.batch_size, args.dropout
    c.lr, c.min_lr = args.lr, args.lr / 10
    text = load_corpus()
    vocab = CharVocab.from_text(text)
    train_ids, val_ids = split_by_position(vocab.encode(text), 128)   # the course's split
    if args.held_out:
        train_ids, val_ids = split_by_position(train_ids, 128)
    torch.manual_seed(c.seed)
    model = GPT(c, len(vocab))
    params = [q for q in model.parameters()]
    optimizer = torch.optim.AdamW(
        [{"params": [q for q in params if q.dim() >= 2], "weight_decay": c.weight_decay},
         {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0}],
        lr=c.lr, betas=c.betas)
    deadline = STARTED + args.seconds if args.seconds else math.inf

    def batch(ids):
        starts = torch.randint(len(ids) - c.T, (c.B,))
        w = ids[starts[:, None] + torch.arange(c.T + 1)]                    # (B, T + 1)
        return w[:, :-1], w[:, 1:]

    @torch.no_grad()
    def estimate():
        model.eval()
        out = {}
        for name, ids in (("train", train_ids), ("val", val_ids)):
            losses = []
            for _ in range(c.eval_iters):
                x, y = batch(ids)
                losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
            out[name] = statistics.mean(losses)
        model.train()
        return out

    @torch.no_grad()
    def whole_validation():
        model.eval()
        x, y = val_windows(val_ids, c.T)                                    # (W, T) each
        total = sum(F.cross_entropy(model(x[i:i + 64]).flatten(0, 1), y[i:i + 64].flatten(),
                                    reduction="sum").item() for i in range(0, len(x), 64))
        return total / y.numel(), len(x)

    total = args.iters or 10 ** 9          # the cosine's length; planned when --seconds
    progress, times, marks, lr = 0.0, [], [], c.lr
    n_windows = (len(val_ids) - 1) // c.T
    eval_seconds = None
    it, stopped_by, t_loop = 0, "steps", time.perf_counter()
    while it < total:
        if it % c.eval_interval == 0:
            t = time.perf_counter()
            est = estimate()
            eval_seconds = time.perf_counter() - t
            print(f"iter {it}: train {est['train']:.4f}, val {est['val']:.4f} (estimates)",
                  flush=True)
        t = time.perf_counter()
        lr = c.lr * (it + 1) / (c.warmup + 1) if it < c.warmup else \
            c.min_lr + (c.lr - c.min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        for g in optimizer.param_groups:
            g["lr"] = lr
        x, y = batch(train_ids)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = loss.item()
        if it >= c.warmup:
            progress += (1.0 - progress) / max(1, total - it)
        it += 1
        now = time.perf_counter()
        times.append(now - t)
        marks.append(now)
        if args.seconds:
            per_window = (eval_seconds or 0.1) / (2 * c.eval_iters * c.B)
            reserve = 1.5 * per_window * n_windows + 1.0
            if it == 50 or (it > c.warmup and it % 100 == 0):
                k = min(200, len(marks) - 1)
                per = 1.03 * (marks[-1] - marks[-1 - k]) / k
                per += eval_seconds / c.eval_interval
                fit = it + max(1, int((deadline - now - reserve) / per))
                if it == 50 or abs(fit - total) > 0.1 * total:
                    total = max(fit, c.warmup + 1)
            recent = statistics.median(times[-10:])
            if now + max(recent, times[-1]) + reserve >= deadline and it < total:
                stopped_by = "time"
                break
        if it % 100 == 0:
            print(f"iter {it}/{total}: loss {loss:.4f}, lr {lr:.2e}, "
                  f"{1e3 * statistics.median(times[-100:]):.0f} ms/iter", flush=True)
    loop_seconds = time.perf_counter() - t_loop
    val, windows = whole_validation()
    flops = flops_per_iteration(model, c)
    row = {"recipe": "minigpt", "T": c.T, "B": c.B, "dropout": c.dropout, "lr": c.lr,
           "steps": it, "planned": total, "stopped_by": stopped_by,
           "loop_s": round(loop_seconds, 2), "wall_s": round(time.perf_counter() - STARTED, 2),
           "val_nats": round(val, 4), "val_windows": windows,
           "threads": torch.get_num_threads(), "gflop_per_step": round(flops / 1e9, 3),
           "gflop_s": round(flops * it / loop_seconds / 1e9, 1),
           "median_step_ms": round(1e3 * statistics.median(times), 1),
           "load": round(os.getloadavg()[0], 2)}
    print(f"minigpt: whole validation {val:.4f} nats/char over {windows} windows of T {c.T}, "
          f"after {it} iterations ({stopped_by}); {loop_seconds:.1f} s of training, "
          f"{row['gflop_s']} GFLOP/s")
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()
