"""txlearn: the transformer from first principles.

One module per component, in the order the course builds it: ``softmax``, ``masks``, ``attention``,
``heads``, ``positional``, ``ffn``, ``norms``, ``layer``, ``complexity``; then the capstone's ``data``,
``training`` and ``pretrained``. Import what you need from its module, e.g.
``from txlearn.attention import scaled_dot_product_attention``. Modules load lazily, so
``import txlearn`` is cheap.
"""

import importlib

__version__ = "0.1.0"

_MODULES = (
    "softmax", "masks", "attention", "heads", "positional", "ffn", "norms", "layer",
    "complexity", "data", "training", "pretrained", "plotting", "checks", "build", "grading",
)


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'txlearn' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_MODULES))
