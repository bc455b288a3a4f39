"""`txlearn train` against the minimal-GPT recipe at equal wall time, run as a user runs them.

    .venv/bin/python benchmarks/versus.py                       # 1 round on this machine, ~6 min
    .venv/bin/python benchmarks/versus.py --rounds 2
    .venv/bin/python benchmarks/versus.py --machine one-thread  # a slower machine: 1 thread each
    .venv/bin/python benchmarks/versus.py --machine busy        # ... or a second busy process

Each round runs, in a fresh process each and one after the other (the order alternates between
rounds, so that a change of load hits both alike):

- ``python -m txlearn train --out <tmp> --force --no-progress --max-seconds S`` (the course's
  run with its defaults; the recipe it chooses, its step count and its whole-validation loss are
  read from its output);
- ``python benchmarks/minigpt.py --seconds S`` (the other recipe in plain PyTorch, as many
  iterations as fit in the same S seconds: ``benchmarks/minigpt.py``).

Both are scored by the course's one protocol, the mean next-character cross-entropy over every
non-overlapping window of the validation split (windows of each run's own T). ``--machine``
simulates a slower machine than this one: ``one-thread`` gives both runs one thread
(``--threads 1``), ``busy`` starts a second process that keeps one core busy (a float32 matrix
product loop on one thread) for the whole of both runs. The load average is recorded before and
after each run; the table is printed at the end and every row is appended to
``benchmarks/results/versus.jsonl``. Not part of the tests; run it on a quiet machine for
figures to publish.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "versus.jsonl"
BUSY = ("import torch\ntorch.set_num_threads(1)\na = torch.randn(512, 512)\n"
        "while True:\n    a @ a\n")


def course(seconds: float, threads: int | None, out: Path) -> dict:
    cmd = [sys.executable, "-m", "txlearn", "train", "--out", str(out), "--force",
           "--no-progress", "--max-seconds", str(seconds)]
    if threads:
        cmd += ["--threads", str(threads)]
    row = _run(cmd)
    text = row.pop("stdout")
    m = re.search(r"model: validation ([\d.]+) nats/char .* after (\d+) steps \(([\d.]+) s of "
                  r"training in this run, stopped by (\w+)\)", text)
    if not m:
        sys.exit(f"could not read txlearn train's result:\n{text}")
    recipe = re.search(r"^recipe: (.*)$", text, re.M)
    speed = re.search(r"^speed: (.*)$", text, re.M)
    precision = re.search(r"budget \d+ s \((\w+), (\w+)", text)
    row.update(recipe="txlearn train", val_nats=float(m.group(1)), steps=int(m.group(2)),
               loop_s=float(m.group(3)), stopped_by=m.group(4),
               choice=recipe.group(1) if recipe else "",
               speed=speed.group(1) if speed else "",
               precision=precision.group(2) if precision else "")
    row["log"] = text
    return row


def minigpt(seconds: float, threads: int | None) -> dict:
    cmd = [sys.executable, str(HERE / "minigpt.py"), "--seconds", str(seconds)]
    if threads:
        cmd += ["--threads", str(threads)]
    row = _run(cmd)
    result = json.loads(row.pop("stdout").strip().splitlines()[-1])
    return {**result, **row, "recipe": "minimal GPT (T 64, B 12, d 128, 4 layers, fp32)"}


def _run(cmd: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TXLEARN_TRAIN_SECONDS"}
    load_before = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return {"wall_s": round(wall, 1), "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2), "stdout": proc.stdout}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=170.0, help="each run's budget (170)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--machine", choices=["as-is", "one-thread", "busy"], default="as-is")
    p.add_argument("--show-log", action="store_true", help="print txlearn train's output")
    args = p.parse_args(argv)
    threads = 1 if args.machine == "one-thread" else None
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"machine: {args.machine}; {args.seconds:.0f} s each; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    busy = None
    if args.machine == "busy":
        busy = subprocess.Popen([sys.executable, "-c", BUSY])
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                order = ["course", "minigpt"] if r % 2 == 0 else ["minigpt", "course"]
                for which in order:
                    row = course(args.seconds, threads, Path(tmp) / "run.safetensors") \
                        if which == "course" else minigpt(args.seconds, threads)
                    row.update(round=r + 1, machine=args.machine,
                               time=time.strftime("%Y-%m-%d %H:%M"))
                    log = row.pop("log", "")
                    if args.show_log and log:
                        print(log)
                    rows.append(row)
                    RESULTS.parent.mkdir(parents=True, exist_ok=True)
                    with RESULTS.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"round {r + 1}: {row['recipe']}: {row['steps']} steps, "
                          f"{row['wall_s']} s, whole validation {row['val_nats']:.3f} "
                          f"(load {row['load_before']} -> {row['load_after']})", flush=True)
    finally:
        if busy is not None:
            busy.kill()
    print()
    print("| round | run | steps | wall (s) | whole-validation loss (nats/char) | load average "
          "(before -> after) | what the course's run chose |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['round']} | {row['recipe']} | {row['steps']:,} | {row['wall_s']} | "
              f"{row['val_nats']:.3f} | {row['load_before']} -> {row['load_after']} | "
              f"{row.get('choice', '')} |")
    for r in range(1, args.rounds + 1):
        pair = {row["recipe"].split()[0]: row["val_nats"] for row in rows if row["round"] == r}
        if len(pair) == 2:
            gap = pair["minimal"] - pair["txlearn"]
            print(f"round {r}: txlearn train is {gap:+.3f} nats/char below the minimal GPT "
                  f"(goal: at least 0.05)")


if __name__ == "__main__":
    main()
