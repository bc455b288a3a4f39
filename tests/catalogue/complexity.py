"""Reference answers and catalogued wrong answers for lesson 08's checks
(txlearn/checks/complexity.py), written the way a learner would write them."""

import numpy as np

# ------------------------------------------------------------------ attention_flops


def flops_ref(T, d_model, n_heads):
    projections = 4 * 2 * T * d_model * d_model
    d_k = d_model // n_heads
    scores = n_heads * 2 * T * T * d_k
    weighted_sum = n_heads * 2 * T * T * d_k
    return projections + scores + weighted_sum


def flops_macs(T, d_model, n_heads):
    return 4 * T * d_model * d_model + 2 * T * T * d_model


def flops_no_scores(T, d_model, n_heads):
    return 8 * T * d_model * d_model + 2 * T * T * d_model


def flops_projections_only(T, d_model, n_heads):
    return 8 * T * d_model * d_model


def flops_one_head(T, d_model, n_heads):
    d_k = d_model // n_heads
    return 8 * T * d_model * d_model + 4 * T * T * d_k


def flops_times_heads(T, d_model, n_heads):
    return 8 * T * d_model * d_model + n_heads * 4 * T * T * d_model


def flops_no_W_O(T, d_model, n_heads):
    return 6 * T * d_model * d_model + 4 * T * T * d_model


def flops_float(T, d_model, n_heads):
    return float(flops_ref(T, d_model, n_heads))


# ------------------------------------------------------------------ online_softmax_update

def update_ref(m, l, acc, scores, V):
    m_new = np.maximum(m, scores.max(axis=-1))
    shift = np.where(m_new == -np.inf, 0.0, m_new)
    alpha = np.exp(m - shift)
    p = np.exp(scores - shift[:, None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[:, None] * acc + p @ V


def update_block_max_only(m, l, acc, scores, V):
    m_new = scores.max(axis=-1)                              # the running max m left out
    shift = np.where(m_new == -np.inf, 0.0, m_new)
    with np.errstate(all="ignore"):
        alpha = np.where(m == -np.inf, 0.0, np.exp(m - shift))
    p = np.exp(scores - shift[:, None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[:, None] * acc + p @ V


def update_no_rescale(m, l, acc, scores, V):
    m_new = np.maximum(m, scores.max(axis=-1))
    shift = np.where(m_new == -np.inf, 0.0, m_new)
    p = np.exp(scores - shift[:, None])
    return m_new, l + p.sum(axis=-1), acc + p @ V


def update_no_rescale_sum(m, l, acc, scores, V):
    m_new, _, acc_new = update_ref(m, l, acc, scores, V)
    shift = np.where(m_new == -np.inf, 0.0, m_new)
    return m_new, l + np.exp(scores - shift[:, None]).sum(axis=-1), acc_new


def update_no_rescale_acc(m, l, acc, scores, V):
    m_new, l_new, _ = update_ref(m, l, acc, scores, V)
    shift = np.where(m_new == -np.inf, 0.0, m_new)
    return m_new, l_new, acc + np.exp(scores - shift[:, None]) @ V


def update_alpha_inverted(m, l, acc, scores, V):
    m_new = np.maximum(m, scores.max(axis=-1))
    alpha = np.exp(m_new - m)
    p = np.exp(scores - m_new[:, None])
    return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + p @ V


def update_old_max(m, l, acc, scores, V):
    p = np.exp(scores - m[:, None])
    return m, l + p.sum(-1), acc + p @ V


def update_normalised(m, l, acc, scores, V):
    m_new, l_new, acc_new = update_ref(m, l, acc, scores, V)
    return m_new, l_new, acc_new / l_new[:, None]


def update_no_nan_guard(m, l, acc, scores, V):
    m_new = np.maximum(m, scores.max(axis=-1))
    alpha = np.exp(m - m_new)
    p = np.exp(scores - m_new[:, None])
    return m_new, alpha * l + p.sum(-1), alpha[:, None] * acc + p @ V


def update_returns_two(m, l, acc, scores, V):
    return update_ref(m, l, acc, scores, V)[1:]


def update_global_max(m, l, acc, scores, V):
    m_new = np.maximum(m, scores.max())                   # one max for every row
    shift = np.where(m_new == -np.inf, 0.0, m_new)
    alpha = np.exp(m - shift)
    p = np.exp(scores - shift[:, None])
    return m_new, alpha * l + p.sum(axis=-1), alpha[:, None] * acc + p @ V


# ------------------------------------------------------------------ tiled_attention

def _tiled(Q, K, V, mask, block_size, scale=True, m0=-np.inf, last=True, normalise=True,
           guard=True, mask_cols=True, fill=-np.inf, invert=False, update=None):
    L, d_k = Q.shape
    S = K.shape[0]
    m, l, acc = np.full(L, m0), np.zeros(L), np.zeros((L, V.shape[1]))
    stops = range(0, S, block_size) if last else range(0, S - block_size + 1, block_size)
    for start in stops:
        stop = min(start + block_size, S)
        s = Q @ K[start:stop].T / (np.sqrt(d_k) if scale else 1.0)
        if mask is not None:
            cols = mask[:, start:stop] if mask_cols else mask[:, :stop - start]
            s = np.where(~cols if invert else cols, s, fill)
        with np.errstate(all="ignore"):
            m, l, acc = (update or update_ref)(m, l, acc, s, V[start:stop])
    if not normalise:
        return acc
    with np.errstate(all="ignore"):
        if not guard:
            return acc / l[:, None]
        return np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1.0)[:, None], 0.0)


def tiled_ref(Q, K, V, mask=None, block_size=2):
    return _tiled(Q, K, V, mask, block_size)


def tiled_mask_inverted(Q, K, V, mask=None, block_size=2):
    return _tiled(Q, K, V, mask, block_size, invert=True)


def tiled_not_normalised(Q, K, V, mask=None, block_size=2):
    return _tiled(Q, K, V, mask, block_size, normalise=False)


def tiled_max_starts_at_zero(Q, K, V, mask=None, block_size=2):
    return _tiled(Q, K, V, mask, block_size, m0=0.0)


def tiled_drops_last_block(Q, K, V, mask=None, block_size=2):
    return _tiled(Q, K, V, mask, block_size, last=False)


def tiled_unscaled(Q, K, V, mask=None, block_size=2):
    return _tiled(Q, K, V, mask, block_size, scale=False)


def tiled_nan_rows(Q, K, V, mask=None, block_size=2):
    return _tiled(Q, K, V, mask, block_size, guard=False)


def tiled_big_negative(Q, K, V, mask=None, block_size=2):      # issue 23: -1e9, not -inf
    return _tiled(Q, K, V, mask, block_size, fill=-1e9)


def tiled_mask_first_columns(Q, K, V, mask=None, block_size=2):
    return _tiled(Q, K, V, mask, block_size, mask_cols=False)


def tiled_global_max(Q, K, V, mask=None, block_size=2):  # its own update, one max for all rows
    return _tiled(Q, K, V, mask, block_size, update=update_global_max)


REFERENCE = {
    "attention_flops": (flops_ref,),
    "online_softmax_update": (update_ref,),
    "tiled_attention": (tiled_ref,),
}

WRONG = {
    "attention_flops": [
        ("MACs, not FLOPs", (flops_macs,), "you counted multiply-accumulates"),
        ("scores omitted", (flops_no_scores,), "scores Q K^T cost"),
        ("projections only", (flops_projections_only,), "counted only the four projections"),
        ("one head only", (flops_one_head,), "single head"),
        ("times n_heads", (flops_times_heads,), "do not multiply by n_heads"),
        ("no W_O", (flops_no_W_O,), "output projection W_O"),
        ("float", (flops_float,), "whole number"),
    ],
    "online_softmax_update": [
        ("no rescaling", (update_no_rescale,), "multiply both by"),
        ("old sum not rescaled", (update_no_rescale_sum,), "rescale the old sum"),
        ("old output not rescaled", (update_no_rescale_acc,), "rescale the old output"),
        ("alpha inverted", (update_alpha_inverted,), "yours is exp(m' - m)"),
        ("old max kept", (update_old_max,), "use the new max"),
        ("new max from the block alone (learner 23)", (update_block_max_only,),
         "took the block's max alone"),
        ("output normalised", (update_normalised,), "keep acc unnormalised"),
        ("NaN when all masked", (update_no_nan_guard,), "is NaN"),
        ("two outputs", (update_returns_two,), "return three things"),
        ("one max for the whole block", (update_global_max,), "not the max of the whole block"),
    ],
    "tiled_attention": [
        ("hidden scores -1e9 (issue 23)", (tiled_big_negative,), "not a large negative number"),
        ("acc not divided by l", (tiled_not_normalised,), "you returned acc itself"),
        ("running max starts at 0", (tiled_max_starts_at_zero,), "start the running max at minus infinity"),
        ("last short block dropped", (tiled_drops_last_block,), "the last block is shorter"),
        ("no 1/sqrt(d_k)", (tiled_unscaled,), "divide each block's scores by sqrt(d_k)"),
        ("NaN for a query with no key", (tiled_nan_rows,), "divide only where l > 0"),
        ("mask columns of the first block reused", (tiled_mask_first_columns,), "slice the mask's columns"),
        ("mask inverted (learner 23)", (tiled_mask_inverted,), "hides the keys the mask allows"),
        ("its own update with one max for the whole block", (tiled_global_max,),
         "not the max of the whole block"),
    ],
}
