"""Reference answers and catalogued wrong answers for lesson 01's checks (txlearn/checks/softmax.py).

Each wrong answer is a mistake a learner plausibly makes; the text beside it must appear in the
check's failure message (the targeted hint or the case that exposes it).
"""

import math

import numpy as np

# ------------------------------------------------------------------ stable_softmax


def softmax_ref(x, axis=-1):
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def softmax_no_shift(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def softmax_clamped_shift(x, axis=-1):
    z = x - np.maximum(x.max(axis=axis, keepdims=True), 0)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def softmax_global_max(x, axis=-1):
    e = np.exp(x - x.max())
    return e / e.sum(axis=axis, keepdims=True)


def softmax_axis_zero(x, axis=-1):  # ignores `axis`, always the first one
    return softmax_ref(x, axis=0)


def softmax_last_axis(x, axis=-1):  # ignores `axis`, always the last one
    return softmax_ref(x, axis=-1)


def softmax_no_keepdims(x, axis=-1):
    e = np.exp(x - x.max(axis=axis))
    return e / e.sum(axis=axis)


def softmax_sum_no_keepdims(x, axis=-1):  # the max keeps its axis, the sum does not
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis)


def softmax_global_sum(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum()


def softmax_in_place(x, axis=-1):
    x -= x.max(axis=axis, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=axis, keepdims=True)
    return x


def softmax_loop_forever(x, axis=-1):
    while True:
        pass


# ------------------------------------------------------------------ scaled_scores


def scores_ref(Q, K):
    d_k = Q.shape[-1]
    return Q @ np.swapaxes(K, -1, -2) / math.sqrt(d_k)


def scores_unscaled(Q, K):
    return Q @ np.swapaxes(K, -1, -2)


def scores_by_d_k(Q, K):
    return Q @ np.swapaxes(K, -1, -2) / Q.shape[-1]


def scores_times_sqrt(Q, K):
    return Q @ np.swapaxes(K, -1, -2) * math.sqrt(Q.shape[-1])


def scores_transposed(Q, K):  # K Q^T: (S, L)
    return K @ np.swapaxes(Q, -1, -2) / math.sqrt(Q.shape[-1])


def scores_dot_T(Q, K):  # K.T reverses every axis of a batched K
    return Q @ K.T / math.sqrt(Q.shape[-1])


def scores_np_dot(Q, K):  # np.dot of N-D arrays pairs every batch entry with every other
    return np.dot(Q, np.swapaxes(K, -1, -2)) / math.sqrt(Q.shape[-1])


def scores_d_k_from_axis_1(Q, K):  # right for 2-D inputs only
    return Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[1])


def scores_sqrt_len(Q, K):
    return Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[0])


def scores_with_softmax(Q, K):
    return softmax_ref(scores_ref(Q, K), axis=-1)


def scores_in_place(Q, K):
    Q /= math.sqrt(Q.shape[-1])
    return Q @ np.swapaxes(K, -1, -2)


# ------------------------------------------------------------------ softmax_jacobian


def jacobian_ref(x):
    s = softmax_ref(x)
    return np.diag(s) - np.outer(s, s)


def jacobian_no_diag(x):
    s = softmax_ref(x)
    return -np.outer(s, s)


def jacobian_no_outer(x):
    return np.diag(softmax_ref(x))


def jacobian_diag_only(x):
    s = softmax_ref(x)
    return np.diag(s * (1 - s))


def jacobian_sign(x):
    s = softmax_ref(x)
    return np.outer(s, s) - np.diag(s)


def jacobian_of_logits(x):
    return np.diag(x) - np.outer(x, x)


def jacobian_elementwise(x):
    s = softmax_ref(x)
    return np.diag(s) - s * s


def jacobian_1d_matmul(x):  # s @ s.T of a 1-D s is the scalar sum s_i^2
    s = softmax_ref(x)
    return np.diag(s) - s @ s.T


def jacobian_no_delta(x):
    s = softmax_ref(x)
    return np.outer(s, 1 - s)


def jacobian_unstable(x):
    s = softmax_no_shift(x)
    return np.diag(s) - np.outer(s, s)


def jacobian_vector(x):
    s = softmax_ref(x)
    return s * (1 - s)


# ------------------------------------------------------------------ log_softmax


def softmax_default_axis0(x, axis=0):                 # issue 23: the default changed
    return softmax_ref(x, axis)


def log_softmax_default_axis0(x, axis=0):
    return log_softmax_ref(x, axis)


def log_softmax_ref(x, axis=-1):
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def log_of_softmax(x, axis=-1):
    with np.errstate(divide="ignore"):
        return np.log(softmax_ref(x, axis))


def log_softmax_no_shift(x, axis=-1):
    return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def log_softmax_unshifted_x(x, axis=-1):
    z = x - x.max(axis=axis, keepdims=True)
    return x - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def log_softmax_axis_zero(x, axis=-1):
    return log_softmax_ref(x, axis=0)


def log_softmax_no_keepdims(x, axis=-1):
    z = x - x.max(axis=axis)
    return z - np.log(np.exp(z).sum(axis=axis))


REFERENCE = {
    "stable_softmax": (softmax_ref,),
    "scaled_scores": (scores_ref,),
    "softmax_jacobian": (jacobian_ref,),
    "log_softmax": (log_softmax_ref,),
}

WRONG = {
    "stable_softmax": [
        ("default axis 0 (issue 23)", (softmax_default_axis0,), "keep the signature's default"),
        ("no max shift", (softmax_no_shift,), "subtract the maximum"),
        ("shift clamped at 0", (softmax_clamped_shift,), "do not clamp the shift at 0"),
        ("one global max", (softmax_global_max,), "maximum of each slice"),
        ("wrong axis (always 0)", (softmax_axis_zero,), "use the `axis` argument"),
        ("wrong axis (always last)", (softmax_last_axis,), "always used the last axis"),
        ("max without keepdims", (softmax_no_keepdims,), "keep the reduced axis"),
        ("sum without keepdims (the max with)", (softmax_sum_no_keepdims,),
         "your sum does not"),
        ("sum over the whole array", (softmax_global_sum,), "not the whole array"),
        ("modifies its input in place", (softmax_in_place,), "the caller still needs"),
        ("never returns", (softmax_loop_forever,), "loop that never ends"),
    ],
    "scaled_scores": [
        ("no scaling", (scores_unscaled,), "divide the dot products by sqrt(d_k)"),
        ("divides by d_k", (scores_by_d_k,), "you divided by d_k"),
        ("multiplies by sqrt(d_k)", (scores_times_sqrt,), "you multiplied by sqrt(d_k)"),
        ("K Q^T", (scores_transposed,), "not K @ Q^T"),
        ("K.T on batched input", (scores_dot_T,), "transpose only the last two axes"),
        ("np.dot on batched input", (scores_np_dot,), "np.dot of n-d arrays is not a batched"),
        ("d_k from axis 1", (scores_d_k_from_axis_1,), "LAST axis"),
        ("sqrt of the number of queries", (scores_sqrt_len,), "LAST axis"),
        ("softmax applied", (scores_with_softmax,), "return the scores themselves"),
        ("scales Q in place", (scores_in_place,), "the caller still needs `Q`"),
    ],
    "softmax_jacobian": [
        ("no diagonal term", (jacobian_no_diag,), "the diagonal needs s_i"),
        ("no outer product", (jacobian_no_outer,), "off-diagonal entries are -s_i s_j"),
        ("diagonal only", (jacobian_diag_only,), "only the diagonal s_i (1 - s_i)"),
        ("sign flipped", (jacobian_sign,), "sign is flipped"),
        ("logits instead of probabilities", (jacobian_of_logits,), "not the logits"),
        ("elementwise s * s", (jacobian_elementwise,), "outer product"),
        ("s @ s.T of a 1-D s", (jacobian_1d_matmul,), "s.t is s itself"),
        ("no Kronecker delta", (jacobian_no_delta,), "not s_i (1 - s_j)"),
        ("unstable softmax inside", (jacobian_unstable,), "subtract the maximum"),
        ("returns a vector", (jacobian_vector,), "the jacobian is a full matrix"),
    ],
    "log_softmax": [
        ("default axis 0 (issue 23)", (log_softmax_default_axis0,), "keep the signature's default"),
        ("log of softmax", (log_of_softmax,), "log(0) = -inf"),
        ("log-sum-exp without shift", (log_softmax_no_shift,), "overflows for large x"),
        ("shift not applied to x", (log_softmax_unshifted_x,), "off by max(x)"),
        ("wrong axis", (log_softmax_axis_zero,), "use the `axis` argument"),
        ("max without keepdims", (log_softmax_no_keepdims,), "keep the reduced axis"),
    ],
}
