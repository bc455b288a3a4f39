"""Lesson 08: the sequential baseline, an Elman RNN layer, and the depth and path length of a graph.

:func:`recurrent_layer` needs T sequential steps where attention needs one (the "sequential
operations" column of the paper's Table 1); :func:`sequential_depth` measures that column on any
autograd graph (the operations on its longest chain, each waiting for the one before), and
:func:`matmul_path_length` the "maximum path length" column (an RNN's grows with the distance,
self-attention's is constant). Source: Vaswani et al. 2017, section 4 and Table 1; Elman 1990; lesson 08.
"""

from __future__ import annotations

import torch

__all__ = ["recurrent_layer", "matmul_path_length", "sequential_depth"]


def recurrent_layer(x: torch.Tensor, W_x: torch.Tensor, W_h: torch.Tensor,
                    b: torch.Tensor) -> torch.Tensor:
    """An Elman RNN layer: ``h_t = tanh(x_t W_x + h_{t-1} W_h + b)``, ``h_0 = 0``.

    Args:
        x: ``(B, T, d_in)``; W_x: ``(d_in, d)``; W_h: ``(d, d)``; b: ``(d,)``.
    Returns:
        all hidden states ``(B, T, d)``, dtype of x.
    Raises:
        ValueError: when the shapes of x, W_x, W_h, b do not fit (both shapes named).

    The loop over t cannot be batched: step t needs h_{t-1}. That is the O(T) "sequential
    operations" of the paper's Table 1 (Vaswani et al. 2017, section 4), against attention's O(1).
    Equals ``torch.nn.RNN`` (tests/test_recurrent.py).
    """
    if x.dim() != 3 or W_x.shape[0] != x.shape[-1]:
        raise ValueError(f"x {tuple(x.shape)} must be (B, T, d_in) with d_in = W_x.shape[0] "
                         f"(W_x {tuple(W_x.shape)})")
    d = W_x.shape[1]
    if W_h.shape != (d, d) or b.shape != (d,):
        raise ValueError(f"W_h {tuple(W_h.shape)} must be ({d}, {d}) and b {tuple(b.shape)} ({d},)")
    x_proj = x @ W_x + b  # (B, T, d): the input part is one batched product
    h = x.new_zeros(x.shape[0], d)  # (B, d)
    states = []
    for t in range(x.shape[1]):  # the sequential part: T steps
        h = torch.tanh(x_proj[:, t] + h @ W_h)  # (B, d)
        states.append(h)
    return torch.stack(states, dim=1)  # (B, T, d)


_MATMUL_NODES = ("MmBackward", "BmmBackward", "AddmmBackward", "BaddbmmBackward", "MvBackward")


def _longest_path(output: torch.Tensor, source: torch.Tensor, weight) -> int:
    """The largest sum of ``weight(node)`` over the autograd paths from `source` to `output`."""
    if not (source.requires_grad and source.is_leaf) or output.grad_fn is None:
        raise ValueError("source must be a leaf with requires_grad=True and output must have "
                         "been computed from it with gradients enabled")
    best: dict = {}  # node -> largest weight from this node down to source (-1: unreachable)
    stack = [(output.grad_fn, False)]
    while stack:  # iterative post-order traversal (graphs of long loops are deep)
        node, children_done = stack.pop()
        if node in best:
            continue
        children = [child for child, _ in node.next_functions if child is not None]
        if not children_done:
            stack.append((node, True))
            stack.extend((c, False) for c in children if c not in best)
            continue
        if getattr(node, "variable", None) is source:
            best[node] = 0
        else:
            reach = [best[c] for c in children if best.get(c, -1) >= 0]
            best[node] = weight(node) + max(reach) if reach else -1
    if best[output.grad_fn] < 0:
        raise ValueError("output does not depend on source")
    return best[output.grad_fn]


def matmul_path_length(output: torch.Tensor, source: torch.Tensor) -> int:
    """The most matrix products on any path from `source` to `output` in the autograd graph.

    A measured "path length" (Vaswani et al. 2017, Table 1, maximum path length): how many
    matrix products a signal from `source` (a leaf tensor with ``requires_grad=True``) passes
    through before it reaches `output`. For an RNN it grows with the distance between positions;
    for self-attention it is a constant. Counts the autograd nodes ``mm``, ``bmm``, ``addmm``,
    ``baddbmm`` and ``mv``.

    Returns an int >= 0. Raises ValueError when `source` is not a leaf that requires grad, or
    when `output` does not depend on it. Source: lesson 08.
    """
    return _longest_path(output, source,
                         lambda node: int(type(node).__name__.startswith(_MATMUL_NODES)))


def sequential_depth(output: torch.Tensor, source: torch.Tensor) -> int:
    """The operations on the longest chain of the autograd graph from `source` to `output`.

    Each operation waits for the results it consumes, so however many processors there are,
    `output` cannot be computed in fewer than this many steps, one operation each (the
    "sequential operations" of Vaswani et al. 2017, Table 1). Every autograd node counts 1,
    whatever its size: a ``(4096, 4096)`` product and a scalar add are one step each; what
    runs side by side (the T rows of a batched product) counts once. An RNN's depth grows
    linearly in T (a few operations per step); attention's does not depend on T.

    Returns an int >= 0. Raises ValueError when `source` is not a leaf that requires grad, or
    when `output` does not depend on it. Source: lesson 08.
    """
    return _longest_path(output, source, lambda node: 1)
