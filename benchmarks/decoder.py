"""Lesson 10's decoder generating text: with and without the KV cache, beside transformers.

    .venv/bin/python benchmarks/decoder.py            # prompts of 37 and ~300 tokens, ~3-4 min
    .venv/bin/python benchmarks/decoder.py --quick    # the 37-token chat prompt only, ~1 min

SmolLM2-135M-Instruct (float32, greedy) generates ``--new`` tokens after each prompt three ways:
the course's ``LlamaDecoder`` through ``txlearn.training.generate.generate`` with its key/value cache
and without it (the whole context recomputed at every step), and ``transformers``'
``LlamaForCausalLM.generate`` (its own cache) on the same file. Every variant must produce the same
tokens (checked). Times include the prefill of the prompt; each is the fastest of ``--repeats``
rounds, the variants timed in turn within a round so that a change of load touches all of them.
Prints one markdown table (copy it into benchmarks/README.md): tokens/s, cached / uncached and
ours / transformers. Not part of the tests: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from txlearn.models.gguf import load_decoder  # noqa: E402
from txlearn.models.llama_reference import (chat_ids, load_tokenizer, reference_generate,  # noqa: E402
                                            reference_model)
from txlearn.training.generate import generate  # noqa: E402


def prompts(tokenizer, quick: bool) -> dict[str, list[int]]:
    """The chat prompt of lesson 10 and, unless quick, ~300 tokens of the Python reference."""
    out = {"chat (37 tokens)": chat_ids(tokenizer, "What is the capital of France?")}
    if not quick:
        import pydoc_data.topics
        text = "".join(pydoc_data.topics.topics.values())
        ids = tokenizer(text[:2000])["input_ids"][:300]
        out[f"text ({len(ids)} tokens)"] = ids
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short prompt only")
    parser.add_argument("--new", type=int, default=32, help="tokens to generate (default 32)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds; fastest kept (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    print(f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{args.threads} thread(s); {args.new} new tokens, greedy, float32")
    model, oracle, tokenizer = load_decoder(), reference_model(), load_tokenizer()
    variants = {
        "ours, cached": lambda p: generate(model, p, args.new, temperature=0),
        "ours, uncached": lambda p: generate(model, p, args.new, temperature=0, use_cache=False),
        "transformers generate": lambda p: reference_generate(oracle, p, args.new),
    }
    print("\n| prompt | ours cached (tok/s) | ours uncached (tok/s) | cached / uncached "
          "| transformers generate (tok/s) | ours cached / transformers |")
    print("|---|---|---|---|---|---|")
    for name, p in prompts(tokenizer, args.quick).items():
        best, outputs = {v: math.inf for v in variants}, {}
        for _ in range(args.repeats):
            for v, fn in variants.items():
                t0 = time.perf_counter()
                outputs[v] = fn(p)
                best[v] = min(best[v], time.perf_counter() - t0)
        first = outputs["ours, cached"]
        assert all(torch.equal(first, o) for o in outputs.values()), "the variants disagree"
        rate = {v: args.new / t for v, t in best.items()}
        print(f"| {name} | {rate['ours, cached']:.1f} | {rate['ours, uncached']:.1f} | "
              f"{rate['ours, cached'] / rate['ours, uncached']:.1f} | "
              f"{rate['transformers generate']:.1f} | "
              f"{rate['ours, cached'] / rate['transformers generate']:.2f} |")


if __name__ == "__main__":
    main()
