"""The measurements behind `txlearn train`'s recipe rule (issue 27): which recipe is best for a compute budget.

    .venv/bin/python benchmarks/recipe_sweep.py run NAME [NAME ...] --budget 0.25 0.5
    .venv/bin/python benchmarks/recipe_sweep.py table          # every run, as a markdown table
    .venv/bin/python benchmarks/recipe_sweep.py list           # the recipes and their FLOPs a step

A budget is a number of floating-point operations, given as a fraction of ``C_FULL``, what the
old default run spends (2,700 steps of 8.58 GFLOP: 23.2 TFLOP). A machine turns seconds into
FLOPs at the rate it measures (``txlearn train`` prints it), so a budget in FLOPs is a budget in
seconds on any machine; the recipes of one width reach the same FLOP/s on the CPU within a few
per cent (``benchmarks/README.md``), so at equal FLOPs they also take equal time.

Each run trains one recipe for ``round(budget * C_FULL / flops_per_step)`` steps (its cosine
laid over exactly those steps) with the sweep's protocol of ``benchmarks/train_sweep.py``: on
the first 90% of the training split, scored on the last 10% of it (every non-overlapping window
of the recipe's own T), never on the validation split. The loss after a given number of steps
does not depend on the machine's speed (same seed, same data order), so the runs can be made on
a slow or shared machine, one thread, float32 (``--precision bf16 --threads 2`` for the larger
budgets, on a CPU with native bfloat16; each row records its precision, and one budget run
both ways measures what that changes). Results are appended to
``benchmarks/results/recipe_runs.jsonl``; lesson 09 reads them and derives the rule from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_sweep import sweep_text  # noqa: E402

from txlearn.training.config import TrainConfig  # noqa: E402
from txlearn.training.recipe import C_FULL, flops_per_step  # noqa: E402

RUNS = Path(__file__).resolve().parent / "results" / "recipe_runs.jsonl"

# Every recipe as its differences from the old defaults (T 128, B 12, d_model 128, 4 layers,
# lr 2e-3 cosine to 2e-4, dropout 0.1, the layers' own initialisation).
RECIPES = {
    "old defaults": {},
    "T 128, B 12, no dropout": dict(dropout=0.0),
    "T 128, B 12, gpt2 init, no dropout": dict(init="gpt2", dropout=0.0),
    "T 64, B 24, no dropout": dict(block_size=64, batch_size=24, dropout=0.0),
    "T 64, B 24, gpt2 init, no dropout": dict(block_size=64, batch_size=24, dropout=0.0,
                                              init="gpt2"),
    "T 64, B 12, gpt2 init, no dropout": dict(block_size=64, batch_size=12, dropout=0.0,
                                              init="gpt2"),
    "T 32, B 48, gpt2 init, no dropout": dict(block_size=32, batch_size=48, dropout=0.0,
                                              init="gpt2"),
    "T 64, B 24, gpt2 init, dropout 0.1": dict(block_size=64, batch_size=24, init="gpt2"),
    "T 128, B 12, gpt2 init, dropout 0.1": dict(init="gpt2"),
    "T 64, B 24, gpt2 init, no dropout, lr 3e-3": dict(block_size=64, batch_size=24,
                                                       dropout=0.0, init="gpt2", lr=3e-3,
                                                       min_lr=3e-4),
    "T 64, B 12, gpt2 init, no dropout, lr 3e-3": dict(block_size=64, batch_size=12,
                                                       dropout=0.0, init="gpt2", lr=3e-3,
                                                       min_lr=3e-4),
    "T 32, B 24, gpt2 init, no dropout": dict(block_size=32, batch_size=24, dropout=0.0,
                                              init="gpt2"),
    "d 96, T 64, B 12, gpt2 init, no dropout": dict(d_model=96, d_ff=384, block_size=64,
                                                    batch_size=12, dropout=0.0, init="gpt2"),
    "d 96, T 64, B 12, gpt2 init, no dropout, lr 3e-3": dict(
        d_model=96, d_ff=384, block_size=64, batch_size=12, dropout=0.0, init="gpt2", lr=3e-3,
        min_lr=3e-4),
    "d 64, T 64, B 12, gpt2 init, no dropout, lr 3e-3": dict(
        d_model=64, d_ff=256, block_size=64, batch_size=12, dropout=0.0, init="gpt2", lr=3e-3,
        min_lr=3e-4),
    "d 64, T 32, B 24, gpt2 init, no dropout, lr 3e-3": dict(
        d_model=64, d_ff=256, block_size=32, batch_size=24, dropout=0.0, init="gpt2", lr=3e-3,
        min_lr=3e-4),
    "T 64, B 12, gpt2 init, dropout 0.1, lr 3e-3": dict(block_size=64, batch_size=12,
                                                        init="gpt2", lr=3e-3, min_lr=3e-4),
    "d 96, T 128, B 12, gpt2 init, dropout 0.1": dict(d_model=96, d_ff=384, init="gpt2"),
    # the other recipe of benchmarks/minigpt.py (its own model and schedule), for reference
    "minigpt": dict(block_size=64, batch_size=12, dropout=0.0, lr=1e-3, min_lr=1e-4),
}


def config_of(name: str) -> TrainConfig:
    base = dict(d_model=128, n_heads=4, n_layers=4, d_ff=512, block_size=128, batch_size=12,
                lr=2e-3, min_lr=2e-4, warmup_steps=50, weight_decay=0.1, dropout=0.1,
                init="layers", precision="fp32", eval_windows=64, max_seconds=1e9)
    fields = {**base, **RECIPES[name]}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in fields.items() if k in known}), fields


def load() -> list[dict]:
    if not RUNS.exists():
        return []
    return [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()]


def cmd_run(args) -> None:
    from txlearn.training.loop import train
    from txlearn.training.schedule import ENV_SECONDS

    os.environ.pop(ENV_SECONDS, None)
    text = sweep_text()
    done = {(r["name"], r["budget"], r.get("precision", "fp32")) for r in load()}
    for budget in args.budget:
        for name in args.names:
            if (name, budget, args.precision) in done and not args.again:
                continue
            config, fields = config_of(name)
            config = dataclasses.replace(config, precision=args.precision)
            if name == "minigpt":
                row = run_minigpt(budget, config)
                print(f"{name} @ {budget}: {row['steps']} steps, held-out "
                      f"{row['held_out_nats']:.4f} nats/char ({row['wall_s']} s)", flush=True)
                continue
            steps = round(budget * C_FULL / flops_per_step(config))
            config = dataclasses.replace(config, max_steps=steps,
                                         eval_interval=max(50, steps // 8))
            t, p = time.perf_counter(), time.process_time()
            result = train(config, text, progress=False, log=None, threads=args.threads)
            row = {"name": name, "budget": budget, "settings": RECIPES[name],
                   "steps": result.step, "chars": result.step * config.batch_size *
                   config.block_size, "flops": result.step * flops_per_step(config),
                   "held_out_nats": round(result.val_nats, 4),
                   "history": [(h["step"], round(h["val"], 4)) for h in result.history],
                   "wall_s": round(time.perf_counter() - t, 1),
                   "cpu_s": round(time.process_time() - p, 1),
                   "load": round(os.getloadavg()[0], 2), "torch": torch.__version__,
                   "precision": args.precision, "threads": args.threads,
                   "time": time.strftime("%Y-%m-%d %H:%M")}
            RUNS.parent.mkdir(parents=True, exist_ok=True)
            with RUNS.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{name} @ {budget}: {result.step} steps, held-out "
                  f"{result.val_nats:.4f} nats/char ({row['wall_s']} s, load {row['load']})",
                  flush=True)


def run_minigpt(budget: float, config: TrainConfig) -> dict:
    """benchmarks/minigpt.py for the budget's iterations, on the sweep's protocol, one thread."""
    import subprocess

    steps = round(budget * C_FULL / flops_per_step(config))
    t = time.perf_counter()
    out = subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "minigpt.py"),
                          "--iters", str(steps), "--threads", "1", "--held-out"],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    history = []   # "iter 250: train 2.1, val 2.2 (estimates)"
    for line in out.splitlines():
        if line.startswith("iter ") and "(estimates)" in line:
            words = line.split()
            history.append((int(words[1].rstrip(":")), float(words[-2])))
    row = {"name": "minigpt", "budget": budget, "settings": RECIPES["minigpt"],
           "steps": r["steps"], "chars": r["steps"] * r["B"] * r["T"],
           "flops": r["steps"] * flops_per_step(config), "held_out_nats": r["val_nats"],
           "history": history, "wall_s": round(time.perf_counter() - t, 1),
           "cpu_s": r["loop_s"], "load": r["load"], "torch": torch.__version__,
           "time": time.strftime("%Y-%m-%d %H:%M")}
    with RUNS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def cmd_table(args) -> None:
    rows = sorted(load(), key=lambda r: (r["budget"], r["held_out_nats"]))
    print("| budget (x 23.2 TFLOP) | recipe | steps | characters | held-out loss (nats/char) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['budget']} | {r['name']} | {r['steps']:,} | {r['chars'] / 1e6:.2f} M | "
              f"{r['held_out_nats']:.3f} |")


def cmd_list(args) -> None:
    for name in RECIPES:
        config, _ = config_of(name)
        f = flops_per_step(config)
        print(f"{name}: {f / 1e9:.2f} GFLOP a step, {C_FULL / f:.0f} steps at budget 1")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("names", nargs="+", choices=list(RECIPES), metavar="NAME")
    r.add_argument("--budget", type=float, nargs="+", required=True)
    r.add_argument("--again", action="store_true")
    r.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="fp32 (the sweep's protocol) or bf16 autocast, where the CPU computes "
                        "it natively: about 2-4x the steps an hour")
    r.add_argument("--threads", type=int, default=1)
    sub.add_parser("table")
    sub.add_parser("list")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# {platform.machine()}, torch {torch.__version__}", file=sys.stderr)
    {"run": cmd_run, "table": cmd_table, "list": cmd_list}[args.cmd](args)


if __name__ == "__main__":
    main()
