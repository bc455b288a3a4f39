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


REFERENCE = {
    "attention_flops": (flops_ref,),
    "online_softmax_update": (update_ref,),
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
        ("output normalised", (update_normalised,), "keep acc unnormalised"),
        ("NaN when all masked", (update_no_nan_guard,), "is NaN"),
        ("two outputs", (update_returns_two,), "return the new running max, sum and output"),
    ],
}
