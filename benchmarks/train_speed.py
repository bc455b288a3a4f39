"""Training-step speed of the capstone model, in characters per second, on this machine.

    .venv/bin/python benchmarks/train_speed.py                      # the default shape, ~1 min
    .venv/bin/python benchmarks/train_speed.py --threads 1 2 --precision fp32 bf16
    .venv/bin/python benchmarks/train_speed.py --shape 128,4,128,24 --shape 192,4,128,16

For each shape (d_model, n_layers, block_size T, batch B; n_heads 4, d_ff 4 d_model) and each
thread count and precision, one full training step (forward, loss, backward, gradient clipping,
AdamW) of three models of the same shape and the same algorithm (pre-LN, exact GELU, causal
mask, learned positions, tied output head):

- ``course fused``: ``CharTransformer`` as ``txlearn train`` runs it (``fused=True``: PyTorch's
  fused attention, LayerNorm and GELU kernels inside the course's layers);
- ``course teaching``: ``CharTransformer(fused=False)``, every equation in the course's own code;
- ``torch``: the same network built from ``torch.nn.TransformerEncoderLayer`` (``norm_first``,
  GELU, a causal mask with ``is_causal=True``), weights copied from the course model, outputs
  checked equal to 1e-4 before timing.

The variants are timed in turn, round after round, so a change of load hits all alike; each
figure is the median (and the fastest) of the rounds. chars/s = B * T / step time; ratio =
course / torch time (above 1: the course model is slower). Not part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from txlearn.layer import TransformerLayer
from txlearn.models.char_lm import CharTransformer
from txlearn.training.runtime import autocast

N_VOCAB = 103   # the default corpus's alphabet


class TorchCharModel(nn.Module):
    """The capstone's network from ``nn.TransformerEncoderLayer`` (pre-LN, GELU, causal)."""

    def __init__(self, d_model, n_heads, n_layers, d_ff, block_size):
        super().__init__()
        self.E = nn.Parameter(torch.randn(N_VOCAB, d_model) * 0.02)
        self.P = nn.Parameter(torch.randn(block_size, d_model) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block_size))

    def forward(self, ids):
        T = ids.shape[1]
        x = self.E[ids] + self.P[:T]
        for layer in self.layers:
            x = layer(x, src_mask=self.mask[:T, :T], is_causal=True)
        return self.norm(x) @ self.E.T


def course_copy(ref: TorchCharModel, d_model, n_heads, n_layers, d_ff, block_size, fused):
    model = CharTransformer(N_VOCAB, d_model, n_heads, n_layers, d_ff, block_size, fused=fused)
    with torch.no_grad():
        model.E.copy_(ref.E)
        model.position.W_pos.copy_(ref.P)
        for ours, theirs in zip(model.layers, ref.layers):
            copy = TransformerLayer.from_torch(theirs)
            ours.load_state_dict(copy.state_dict())
        model.norm.gamma.copy_(ref.norm.weight)
        model.norm.beta.copy_(ref.norm.bias)
    return model


def make_step(model, precision, x, y):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    device = torch.device("cpu")

    def step():
        with autocast(precision, device):
            logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return step


def measure(shape, threads, precision, rounds):
    d_model, n_layers, T, B = shape
    n_heads, d_ff = 4, 4 * d_model
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    ref = TorchCharModel(d_model, n_heads, n_layers, d_ff, T)
    models = {"course fused": course_copy(ref, d_model, n_heads, n_layers, d_ff, T, True),
              "course teaching": course_copy(ref, d_model, n_heads, n_layers, d_ff, T, False),
              "torch": ref}
    x = torch.randint(0, N_VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, 1)
    with torch.no_grad():
        want = ref.eval()(x)
        for name, m in models.items():
            diff = (m.eval()(x) - want).abs().max().item()
            assert diff < 1e-4, f"{name} differs from torch by {diff:.1e}"
            m.train()
    steps = {name: make_step(m, precision, x, y) for name, m in models.items()}
    times = {name: [] for name in steps}
    for step in steps.values():   # warm-up: one-time costs, bf16 kernels, allocator
        step()
        step()
    for _ in range(rounds):
        for name, step in steps.items():
            t = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t)
    return {name: (statistics.median(v), min(v)) for name, v in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", default=None, metavar="D,L,T,B",
                   help="d_model,n_layers,block_size,batch_size (repeatable; default: the "
                        "TrainConfig default)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--precision", nargs="+", default=["bf16", "fp32"], choices=["fp32", "bf16"])
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    if args.shape is None:
        from txlearn.training.config import TrainConfig
        from txlearn.training.recipe import CANDIDATES
        c = TrainConfig().with_recipe(next(iter(CANDIDATES.values())))   # the widest candidate
        shapes = [(c.d_model, c.n_layers, c.block_size, c.batch_size)]
    else:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape]
    print(f"# {platform.machine()}, torch {torch.__version__}, {args.rounds} rounds; "
          "median (fastest) step")
    print("| d_model, layers, T, B | threads | precision | course fused chars/s | "
          "course teaching chars/s | torch nn.TransformerEncoderLayer chars/s | "
          "fused / torch time | teaching / torch time |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for threads in args.threads:
            for precision in args.precision:
                r = measure(shape, threads, precision, args.rounds)
                chars = shape[2] * shape[3]
                cell = {k: f"{chars / med:,.0f} ({chars / best:,.0f})"
                        for k, (med, best) in r.items()}
                print(f"| {', '.join(map(str, shape))} | {threads} | {precision} | "
                      f"{cell['course fused']} | {cell['course teaching']} | {cell['torch']} | "
                      f"{r['course fused'][0] / r['torch'][0]:.2f} | "
                      f"{r['course teaching'][0] / r['torch'][0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
