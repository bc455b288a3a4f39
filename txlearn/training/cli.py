"""The ``txlearn train`` and ``txlearn sample`` subcommands (lesson 09's character model).

:func:`add_train_parser` and :func:`add_sample_parser` add them to the ``txlearn`` command's parser
(:mod:`txlearn.cli`); a :class:`txlearn.training.data.UserError` becomes one line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from txlearn.sampling import check_settings
from txlearn.training.checkpoint import load_checkpoint
from txlearn.training.config import TrainConfig
from txlearn.training.data import UserError, load_corpus
from txlearn.training.generate import sample_text
from txlearn.training.loop import train
from txlearn.training.schedule import ENV_SECONDS

__all__ = ["add_train_parser", "add_sample_parser", "DEFAULT_CHECKPOINT"]

DEFAULT_CHECKPOINT = "checkpoints/capstone.safetensors"


_CLI_FIELDS = ("d_model", "n_heads", "n_layers", "d_ff", "block_size", "batch_size", "max_steps",
               "lr", "min_lr", "warmup_steps", "dropout", "init", "precision", "eval_interval",
               "seed", "max_seconds", "grad_accum")
# the recipe fields default to None (chosen by the run): their types
_RULE_TYPES = {"d_model": int, "d_ff": int, "block_size": int, "batch_size": int, "lr": float,
               "min_lr": float, "dropout": float, "init": str}


def _threads(value: str):
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value!r}")
    return n


def _add_device(p) -> None:
    p.add_argument("--device", default="auto",
                   help="auto (default: the GPU when PyTorch sees one, else the CPU), cpu, "
                        "cuda or cuda:N")


def add_train_parser(subparsers) -> None:
    """Add ``txlearn train``: train the capstone model, print baselines and validation loss."""
    p = subparsers.add_parser(
        "train", help="train the capstone character model (lesson 09)",
        description="Train a small causal transformer on the Python language reference "
                    "(pydoc_data) or on --text FILE, print its validation loss beside the "
                    f"uniform/unigram/bigram baselines, save a checkpoint. {ENV_SECONDS} caps "
                    "the wall time. Data-parallel on several processes: "
                    "torchrun --nproc_per_node=N -m txlearn train ...")
    p.add_argument("--text", metavar="FILE", help="a UTF-8 text file (default: pydoc_data topics)")
    p.add_argument("--out", metavar="CKPT", default=DEFAULT_CHECKPOINT,
                   help=f"checkpoint path (default: {DEFAULT_CHECKPOINT})")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_device(p)
    p.add_argument("--threads", type=_threads, default="auto",
                   help="CPU threads: auto (default: OMP_NUM_THREADS when set, else the faster "
                        "of all cores and one, timed on the first steps) or a number")
    defaults = TrainConfig()
    for name in _CLI_FIELDS:
        default = getattr(defaults, name)
        kind = _RULE_TYPES[name] if default is None else type(default)
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                       help="default: chosen from the speed measured at the start "
                            "(txlearn.training.recipe)" if default is None
                       else f"default {default}")
    p.set_defaults(func=_run_train)


def _run_train(args) -> int:
    out = Path(args.out)
    if out.exists() and not (args.resume or args.force):
        raise UserError(f"{out} exists; pass --resume to continue it or --force to overwrite it")
    config = load_checkpoint(out)["config"] if args.resume else TrainConfig()
    overrides = {k: getattr(args, k) for k in _CLI_FIELDS if getattr(args, k) is not None}
    config = dataclasses.replace(config, **overrides)
    text = load_corpus(args.text)
    train(config, text, checkpoint=out, resume=args.resume, progress=not args.no_progress,
          device=args.device, threads=args.threads)
    return 0


def add_sample_parser(subparsers) -> None:
    """Add ``txlearn sample CKPT --prompt TEXT [--prompt TEXT ...]``: generate with temperature,
    top-k, top-p and a repetition penalty (through the key/value cache), several prompts as one
    batch."""
    p = subparsers.add_parser("sample", help="generate text from a capstone checkpoint",
                              description="Generate characters from a checkpoint of "
                                          "`txlearn train`, using the key/value cache.")
    p.add_argument("checkpoint", metavar="CKPT")
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue (default: 'def '); repeat it to generate several "
                        "prompts at once, as one left-padded batch")
    p.add_argument("--length", type=int, default=300, help="characters to generate (300)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=10,
                   help="sample among the k likeliest (default 10; 0 = no limit)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample among the smallest set of likeliest characters whose probability "
                        "reaches P (nucleus sampling, 0 < P <= 1; applied after --top-k)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide a positive logit and multiply a negative one by this for every "
                        "character already in the text (default 1 = off; lesson 02: 1.3 breaks "
                        "greedy decoding's loops in part, 2 finds another loop)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-cache", action="store_true", help="recompute the context every step")
    _add_device(p)
    p.set_defaults(func=_run_sample)


def _run_sample(args) -> int:
    if args.length < 0:
        raise UserError(f"--length must be >= 0, got {args.length}")
    if args.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0 = no limit), got {args.top_k}")
    top_k = args.top_k or None
    try:
        check_settings(args.temperature, top_k, args.top_p, args.repetition_penalty)
    except ValueError as err:
        raise UserError(f"sampling settings: {err}") from None
    prompts = args.prompt or ["def "]
    texts = sample_text(args.checkpoint, prompts, args.length, args.temperature, top_k,
                        args.seed, not args.no_cache, args.top_p, device=args.device,
                        repetition_penalty=args.repetition_penalty)
    if len(texts) == 1:
        print(texts[0])
        return 0
    for i, text in enumerate(texts):
        print(f"--- prompt {i + 1} of {len(texts)}: {prompts[i]!r}")
        print(text)
    return 0
