"""txlearn: the transformer from first principles; this file gives lazy access to its modules.

The components, one module per lesson, in the order the course builds them: ``softmax`` (01),
``masks`` and ``attention`` (02), ``heads`` (03), ``positional`` (04), ``ffn`` (05), ``norms`` (06),
``layer`` (07), what a layer costs (08: ``counting``, ``measuring``, ``recurrent`` and
``flash_attention``), ``sampling`` (choosing the next token, 09) and ``tokens`` (byte-level BPE:
where the tokens come from); ``precision`` states the
dtype rule (float32 arithmetic for float16/bfloat16 inputs); ``plotting`` draws the course's
figures. Then what is built from them, ``models`` (the character model, the MiniLM encoder, the
Llama-style decoder), what trains them, ``training`` (data, configuration, schedule, loop,
checkpoints, generation, ``txlearn train``), and the course's machinery: ``checks`` (the exercise
checks that learners' check cells call), ``learner_calls`` (what those checks and the grader's
sandboxed runner compute the same way) and ``course`` (notebook generation, grading, the book).
Import what you need from its module, e.g. ``from txlearn.attention import
scaled_dot_product_attention``. Modules load lazily, so ``import txlearn`` is cheap.
"""

import importlib

__version__ = "0.1.0"

_MODULES = (
    "softmax", "masks", "attention", "heads", "positional", "ffn", "norms", "layer",
    "counting", "measuring", "recurrent", "flash_attention", "sampling", "tokens", "precision",
    "plotting",
    "models", "training", "learner_calls", "checks", "capstone", "course", "cli",
)


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'txlearn' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_MODULES))
