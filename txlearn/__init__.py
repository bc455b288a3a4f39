"""txlearn: the transformer from first principles.

The components, one module per lesson, in the order the course builds them: ``softmax`` (01),
``masks`` and ``attention`` (02), ``heads`` (03), ``positional`` (04), ``ffn`` (05), ``norms`` (06),
``layer`` (07), ``complexity`` (08), and ``sampling`` (choosing the next token, 09); ``precision``
states the dtype rule (float32 arithmetic for float16/bfloat16 inputs); ``plotting`` draws the
course's figures. Two subpackages: ``capstone`` (lesson 09: data, model, training,
checkpoints, generation, the pretrained encoder) and ``course`` (notebook generation and grading);
``checks`` holds the exercise checks that learners' check cells call, and ``learner_calls`` what
those checks and the grader's sandboxed runner compute the same way. Import what you need from its
module, e.g. ``from txlearn.attention import scaled_dot_product_attention``. Modules load lazily, so
``import txlearn`` is cheap.

Modules that moved into the subpackages keep their old import paths (``txlearn.training``,
``txlearn.data``, ``txlearn.pretrained``, ``txlearn.build``, ``txlearn.grading``): see
:mod:`txlearn._moved`.
"""

import importlib

from txlearn import _moved

__version__ = "0.1.0"

_MODULES = (
    "softmax", "masks", "attention", "heads", "positional", "ffn", "norms", "layer",
    "complexity", "sampling", "precision", "plotting", "learner_calls", "checks", "capstone",
    "course", "cli",
)

_moved.install()


def __getattr__(name):
    if name in _MODULES or f"{__name__}.{name}" in _moved.MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'txlearn' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_MODULES))
