"""What set 09's checks of the loss and the sampler compare with: the cases of next_token_loss,
sampling_distribution and top_p (:mod:`txlearn.checks.capstone`), their float64 references, the
outputs of the catalogued mistakes (``tests/catalogue/capstone.py``) on the same inputs, and the
hints aimed at each mistake. The one sampler, :func:`txlearn.sampling.next_token_distribution`,
is the right answer of the sampling checks.
"""

from __future__ import annotations

import math

import numpy as np
import torch


__all__ = ["SAMPLE_HALF", "NO_SHIFT", "SHIFT_BACKWARDS", "PAD_COUNTED", "MEAN_ALL", "INPUT_MASK", "LOSS_AXIS",
           "PER_SEQUENCE", "SUMMED", "LOSS_UNSTABLE", "NOT_SCALAR", "LOSS_DEFAULT", "loss_np",
           "loss_mistakes", "loss_cases", "TEMP_MULTIPLIED", "SOFTMAX_AXIS", "TIES_HIGH",
           "TIES_ALL", "OFF_BY_ONE", "NO_RENORM", "TEMP_ZERO", "TEMP_TINY", "GREEDY_LAST", "SAMPLE_UNSTABLE",
           "NOT_FLOAT64", "SAMPLE_DEFAULT", "probs_mistakes", "sampling_cases", "DROPS_CROSSING",
           "TOP_P_BEFORE_T", "TOP_P_RENORM", "TOP_P_TIES", "TOP_P_BEFORE_K", "UNSORTED", "TAIL",
           "TOP_P_DEFAULT", "top_p_mistakes", "top_p_cases"]


# ================================================================= exercise: next_token_loss

NO_SHIFT = ("which token do the logits at position t predict?",
            "the logits at position t predict the NEXT token, t + 1: compare the logits of "
            "positions 0 .. T-2 with the tokens at 1 .. T-1 (T - 1 predictions); yours compares "
            "each position with its own token")
SHIFT_BACKWARDS = ("which side of the window loses a position?",
                   "you shifted the wrong way: the first T - 1 positions' logits predict the last "
                   "T - 1 tokens, not the other way round")
PAD_COUNTED = ("what should a prediction of a padding token count for?",
               "leave out every prediction whose target is padding (mask False): it is not text; "
               "yours averages over them too")
MEAN_ALL = ("what do you divide the sum by?",
            "divide by the number of predictions you counted (real targets), not by every "
            "position of the padded batch")
INPUT_MASK = ("a prediction belongs to the token it predicts",
              "a prediction counts when its TARGET is real: take the mask at positions 1 .. T-1 "
              "(the predicted tokens), not at 0 .. T-2 (the inputs)")
LOSS_AXIS = ("over which axis is each prediction a distribution?",
             "the log-softmax runs over the vocabulary, the last axis; yours normalises over "
             "another one (the positions or the batch)")
PER_SEQUENCE = ("every counted prediction weighs the same",
                "take one mean over all counted predictions of the batch; a mean of per-sequence "
                "means gives a short sequence's tokens more weight")
SUMMED = ("the loss is a mean, not a sum",
          "divide the summed negative log-probabilities by the number of counted predictions")
LOSS_UNSTABLE = ("what does exp() do with logits a hundred apart, in float32?",
                 "the log of a softmax underflows to log(0) = -inf (and exp of a large logit "
                 "overflows): use torch.log_softmax (or F.cross_entropy), which subtracts the "
                 "maximum and never takes the log of 0")
NOT_SCALAR = ("the loss is one number that autograd can differentiate",
              "return a 0-dimensional tensor (no .item(), no float(): backward needs the graph)")
LOSS_DEFAULT = ("mean over real targets of -log softmax(logits[t])[ids[t + 1]]",)


def _log_softmax_np(z, axis=-1):
    m = z.max(axis=axis, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=axis, keepdims=True))


def _nll_np(z, targets, axis=-1):
    """-log softmax(z)[target] per position: z (B, L, V), targets (B, L) -> (B, L)."""
    return -np.take_along_axis(_log_softmax_np(z, axis), targets[..., None], -1)[..., 0]


def loss_np(z, ids, mask):
    nll = _nll_np(z[:, :-1], ids[:, 1:])
    w = np.ones_like(nll) if mask is None else mask[:, 1:].astype(np.float64)
    return float((nll * w).sum() / w.sum())


IN_BITS = ("in which unit is the loss?",
           "nats: the natural logarithm (log_softmax, cross_entropy); yours is in bits "
           "(divided by log 2, or log2 of the probability)")


def loss_mistakes(z, ids, mask):
    w_full = np.ones(ids.shape) if mask is None else mask.astype(np.float64)
    w = w_full[:, 1:]
    nll = _nll_np(z[:, :-1], ids[:, 1:])
    return [
        (lambda: (_nll_np(z, ids) * w_full).sum() / w_full.sum(), NO_SHIFT),
        (lambda: _nll_np(z, ids).mean(), NO_SHIFT),
        (lambda: (_nll_np(z[:, 1:], ids[:, :-1]) * w).sum() / w.sum(), SHIFT_BACKWARDS),
        (lambda: (_nll_np(z[:, 1:], ids[:, :-1]) * w_full[:, :-1]).sum() / w_full[:, :-1].sum(),
         SHIFT_BACKWARDS),
        (lambda: nll.mean(), PAD_COUNTED),
        (lambda: (nll * w).sum() / nll.size, MEAN_ALL),
        (lambda: (nll * w_full[:, :-1]).sum() / w_full[:, :-1].sum(), INPUT_MASK),
        (lambda: (_nll_np(z[:, :-1], ids[:, 1:], axis=1) * w).sum() / w.sum(), LOSS_AXIS),
        (lambda: (_nll_np(z[:, :-1], ids[:, 1:], axis=0) * w).sum() / w.sum(), LOSS_AXIS),
        (lambda: np.mean([(nll[b] * w[b]).sum() / w[b].sum() for b in range(len(w))
                          if w[b].sum() > 0]), PER_SEQUENCE),
        (lambda: (nll * w).sum(), SUMMED),
        (lambda: (nll * w).sum() / w.sum() / np.log(2), IN_BITS),
    ]


def loss_cases():
    rng = np.random.default_rng(9)
    z = rng.normal(0.0, 2.0, size=(1, 5, 7))
    yield "one sequence, T = 5, n_vocab = 7, mask=None", z, rng.integers(0, 7, (1, 5)), None
    z = rng.normal(0.0, 2.0, size=(2, 6, 5)).astype(np.float32)
    mask = np.arange(6)[None, :] < np.array([6, 3])[:, None]
    ids = np.where(mask, rng.integers(1, 5, (2, 6)), 0)
    yield "padding at the end: lengths [6, 3], T = 6, float32", z, ids, mask
    z = rng.normal(0.0, 1.0, size=(2, 4, 6)).astype(np.float32)
    ids = rng.integers(0, 6, (2, 4))
    z[0, 1, :] = 50.0                        # the max of a row, far above its target's logit
    z[0, 1, ids[0, 2]] = -60.0
    z[1, 0, ids[1, 1]] = 100.0
    yield "logits a hundred apart (float32), mask=None", z, ids, None
    z = rng.normal(0.0, 1.5, size=(3, 8, 4))
    mask = np.arange(8)[None, :] < np.array([8, 1, 5])[:, None]
    ids = np.where(mask, rng.integers(1, 4, (3, 8)), 0)
    yield "a batch (3, 8) of lengths [8, 1, 5]", z, ids, mask


# ================================================================= exercise: sampling_distribution

TEMP_MULTIPLIED = ("a temperature above 1 should flatten the distribution",
                   "divide the logits by the temperature; you multiplied by it")
SOFTMAX_AXIS = ("which axis holds the vocabulary?",
                "take the softmax over the last axis (the vocabulary); with a batch of rows, axis "
                "0 mixes different rows")
TIES_HIGH = ("with a tie at the k-th value, which indices stay?",
             "break ties by the LOWEST index: sort in descending order with a stable sort, so "
             "equal logits keep their index order; yours keeps the highest indices")
TIES_TOPK = ("with a tie at the k-th value, which indices stay?",
             "torch.topk promises no order among equal values: it may return any of the tied "
             "indices. Break ties by the LOWEST index: a stable descending sort keeps equal "
             "logits in index order; yours matches torch.topk's choice")
TIES_ALL = ("how many tokens does top-k keep?",
            "exactly k: comparing with the k-th largest value keeps every token tied with it "
            "too; choose k indices (ties: the lowest) instead")
OFF_BY_ONE = ("count the survivors",
              "top-k keeps exactly k tokens; yours keeps one more (or one fewer)")
NO_RENORM = ("do the kept probabilities sum to 1?",
             "after zeroing the dropped tokens, divide by the sum of what is left")
TEMP_ZERO = ("what does temperature 0 mean?",
             "temperature 0 is greedy: return a one-hot at the first index of the maximum, "
             "without dividing by 0")
TEMP_TINY = ("what does temperature 0 mean?",
             "temperature 0 is greedy, a one-hot at the FIRST index of the maximum: a tiny "
             "temperature in its place shares the weight between equal maxima (here 0.5 and 0.5)")
GREEDY_LAST = ("with two equal maxima, which one does greedy choose?",
               "the FIRST index of the maximum (the rule of torch.argmax); yours takes the last")
SAMPLE_UNSTABLE = ("what does exp() do with 1000 / 0.01?",
                   "subtract the maximum logit before dividing by the temperature: the largest "
                   "entry becomes exp(0) = 1 and nothing overflows")
NOT_FLOAT64 = ("the distribution is float64",
               "return float64 probabilities (convert the logits first): float32 loses tiny "
               "probabilities")
SOFTMAX_LOW_PRECISION = ("in which dtype do you take the softmax?",
                         "convert the logits to float64 before the softmax: a softmax in float16 "
                         "rounds every probability to about 3 digits, and casting its result to "
                         "float64 afterwards does not bring them back")
SAMPLE_DEFAULT = ("softmax((z - max z) / temperature) over the last axis, then keep exactly the "
                  "k largest (ties: lowest index) and renormalise",)


def _softmax_t(z, t, dim=-1):
    z = torch.as_tensor(z, dtype=torch.float64)
    return torch.softmax((z - z.max(dim=dim, keepdim=True).values) / t, dim=dim)


def _keep_top_k(z, k, ties="low", extra=0):
    """Bool mask of the kept tokens: k (+ extra) largest logits, ties by lowest/highest index."""
    z = torch.as_tensor(z, dtype=torch.float64)
    n = z.shape[-1]
    if ties == "all":
        kth = torch.sort(z, dim=-1, descending=True).values[..., k - 1:k]
        return z >= kth
    if ties == "high":
        flipped = torch.sort(z.flip(-1), dim=-1, descending=True, stable=True).indices
        order = n - 1 - flipped
    else:
        order = torch.sort(z, dim=-1, descending=True, stable=True).indices
    keep = torch.zeros(z.shape, dtype=torch.bool)
    return keep.scatter(-1, order[..., :min(n, k + extra)], True)


def _renorm(p, keep, renorm=True):
    p = p * keep
    return p / p.sum(dim=-1, keepdim=True) if renorm else p


def probs_mistakes(z, t, k):
    z_in, z = z, torch.as_tensor(z, dtype=torch.float64)
    n = z.shape[-1]
    kk = n if k is None else k
    keep = _keep_top_k(z, kk)
    out = [(lambda: _renorm(_softmax_t(z * t * t, t), keep), TEMP_MULTIPLIED)]
    if torch.as_tensor(z_in).dtype == torch.float16:
        low = torch.as_tensor(z_in)
        out.append((lambda: _renorm(torch.softmax((low - low.max(-1, keepdim=True).values) / t,
                                                  dim=-1).double(), keep), SOFTMAX_LOW_PRECISION))
    if z.ndim > 1:
        out.append((lambda: _renorm(_softmax_t(z, t, dim=0), keep), SOFTMAX_AXIS))
    if k is not None and k < n:
        p = _softmax_t(z, t)
        topk = torch.zeros(z.shape, dtype=torch.bool).scatter(-1, torch.topk(z, k, dim=-1).indices,
                                                              True)
        out += [(lambda: _renorm(p, topk), TIES_TOPK),
                (lambda: _renorm(p, _keep_top_k(z, k, "high")), TIES_HIGH),
                (lambda: _renorm(p, _keep_top_k(z, k, "all")), TIES_ALL),
                (lambda: _renorm(p, _keep_top_k(z, k, extra=1)), OFF_BY_ONE),
                (lambda: _renorm(p, _keep_top_k(z, k, extra=-1)), OFF_BY_ONE),
                (lambda: _renorm(p, keep, renorm=False), NO_RENORM)]
    return out


def sampling_cases():
    g = torch.Generator().manual_seed(3)
    batch, batch64 = torch.randn(2, 5, generator=g), torch.randn(2, 6, generator=g, dtype=torch.float64)
    yield "temperature 2, logits [2, 1, 0, -1, 0.5] (float32)", \
        torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5]), 2.0, None
    yield "temperature 0.5, a batch of 2 rows of 5 logits", batch, 0.5, None
    yield "top_k = 3 on a batch (2, 6), temperature 0.7", batch64, 0.7, 3
    yield "top_k = 2, three logits tied at the 2nd value: [1, 3, 3, 3, 0]", \
        torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0], dtype=torch.float64), 1.0, 2
    yield "temperature 0 (greedy), two equal maxima: [1, 5, 5, 2]", \
        torch.tensor([1.0, 5.0, 5.0, 2.0]), 0.0, None
    yield "large logits [1000, 999, 0] at temperature 0.01", \
        torch.tensor([1000.0, 999.0, 0.0], dtype=torch.float64), 0.01, None
    yield "a forbidden token (-inf) and top_k = 10 >= n_vocab", \
        torch.tensor([0.0, -math.inf, 1.0, 0.5]), 1.0, 10
    yield "top_k = 1: greedy, two equal maxima [0.3, 2, -1, 2]", \
        torch.tensor([0.3, 2.0, -1.0, 2.0]), 0.7, 1
    yield "float16 logits [8, 7.5, 0, -3] at temperature 1e-4", \
        torch.tensor([8.0, 7.5, 0.0, -3.0], dtype=torch.float16), 1e-4, None
    yield "float16 logits [1, 0.5, -0.25, 2] at temperature 1", \
        torch.tensor([1.0, 0.5, -0.25, 2.0], dtype=torch.float16), 1.0, None


SAMPLE_HALF = ("in which dtype do you divide by the temperature?",
               "convert the logits to float64 first, then subtract the maximum and divide: in "
               "float16, 8 / 1e-4 = 80000 is already past the largest float16 (65504), so the "
               "division gives inf and the softmax NaN")


# ================================================================= exercise: top_p

DROPS_CROSSING = ("is the token that crosses p kept?",
                  "keep a token when the mass BEFORE it is below p: the token whose probability "
                  "carries the sum past p stays; yours stops just before it")
KEEPS_AT_P = ("a token whose mass before it is exactly p: kept or not?",
              "a token is kept when the mass before it is strictly BELOW p; once the tokens "
              "before it already hold p, it is dropped (yours compares with <=)")
TOP_P_BEFORE_T = ("in which order do temperature and top-p act?",
                  "apply the temperature first, then top-k, then top-p: the nucleus is chosen on "
                  "the tempered distribution; yours chose it at temperature 1")
TOP_P_RENORM = ("do the kept probabilities sum to 1?",
                "after zeroing the tokens outside the nucleus, divide by the sum of what is left")
TOP_P_TIES = ("when two tokens are equally likely, which one comes first?",
              "sort with a stable sort, descending, so that equal probabilities keep their index "
              "order: the lowest index comes first")
TOP_P_BEFORE_K = ("in which order do top-k and top-p act?",
                  "top-k first: choose the nucleus among the k survivors after renormalising "
                  "them, not on the full distribution")
UNSORTED = ("the nucleus holds the MOST probable tokens, wherever they sit in the vocabulary",
            "yours keeps the first tokens in vocabulary order: either it sums the mass in "
            "vocabulary order (sort the probabilities in descending order first), or it computes "
            "the keep mask on the sorted list and applies it to p as it is (a mask of sorted "
            "positions: put it back in vocabulary order through the sort's indices, with scatter)")
TAIL = ("which end of the sorted list do you keep?",
        "keep the head of the sorted list (mass before the token below p), not the tail whose "
        "mass exceeds p")
TOP_P_DEFAULT = ("temperature, then top-k, then keep the descending prefix whose mass before each "
                 "token is below p; renormalise",)


def _nucleus(p, top_p, ties="low", rule="before"):
    """Keep mask of top-p over probabilities p (float64 tensor, last axis)."""
    n = p.shape[-1]
    if ties == "high":
        order = n - 1 - torch.sort(p.flip(-1), dim=-1, descending=True, stable=True).indices
    elif ties == "unsorted":
        order = torch.arange(n).expand(p.shape)
    else:
        order = torch.sort(p, dim=-1, descending=True, stable=True).indices
    sp = p.gather(-1, order)
    after = sp.cumsum(-1)
    keep_sorted = {"before": after - sp < top_p, "before_eq": after - sp <= top_p,
                   "drop": after < top_p,
                   "drop_eq": after <= top_p, "tail": after > top_p}[rule]
    return torch.zeros(p.shape, dtype=torch.bool).scatter(-1, order, keep_sorted)


def top_p_mistakes(z, t, k, top_p):
    from txlearn.sampling import next_token_distribution

    z = torch.as_tensor(z, dtype=torch.float64)
    p = next_token_distribution(z, t, k)
    out = [(lambda: _renorm(p, _nucleus(p, top_p, rule="drop")), DROPS_CROSSING),
           (lambda: _renorm(p, _nucleus(p, top_p, rule="drop_eq")), DROPS_CROSSING),
           (lambda: _renorm(p, _nucleus(p, top_p, rule="before_eq")), KEEPS_AT_P),
           (lambda: _renorm(p, _nucleus(next_token_distribution(z, 1.0, k), top_p)),
            TOP_P_BEFORE_T),
           (lambda: _renorm(p, _nucleus(p, top_p), renorm=False), TOP_P_RENORM),
           (lambda: _renorm(p, _nucleus(p, top_p, ties="high")), TOP_P_TIES),
           (lambda: _renorm(p, _nucleus(p, top_p, ties="unsorted")), UNSORTED),
           (lambda: _renorm(p, _nucleus(p, top_p, rule="tail")), TAIL)]
    if k is not None:
        full = next_token_distribution(z, t)
        out.append((lambda: _renorm(full, _nucleus(full, top_p) & _keep_top_k(z, k)),
                    TOP_P_BEFORE_K))
    return out


def top_p_cases():
    yield ("probabilities [0.15, 0.5, 0.05, 0.3], top_p = 0.6",
           torch.tensor([0.15, 0.5, 0.05, 0.3], dtype=torch.float64).log(), 1.0, None, 0.6)
    yield ("temperature 2, then top_p = 0.7: logits [3, 1, 0.5, 0, -1]",
           torch.tensor([3.0, 1.0, 0.5, 0.0, -1.0]), 2.0, None, 0.7)
    yield ("four equal logits, top_p = 0.5: the mass before the third token is exactly 0.5",
           torch.zeros(4, dtype=torch.float64), 1.0, None, 0.5)
    yield ("equal probabilities: [0.4, 0.2, 0.2, 0.2], top_p = 0.55",
           torch.tensor([0.4, 0.2, 0.2, 0.2], dtype=torch.float64).log(), 1.0, None, 0.55)
    yield ("top_k = 3, then top_p = 0.8: logits [2, 1.5, 1, 0.9, 0.5]",
           torch.tensor([2.0, 1.5, 1.0, 0.9, 0.5], dtype=torch.float64), 1.0, 3, 0.8)
    g = torch.Generator().manual_seed(4)
    yield ("a batch (3, 6) of float32 logits, temperature 0.7, top_p = 0.9",
           torch.randn(3, 6, generator=g) * 2, 0.7, None, 0.9)
    yield ("top_p = 1 keeps every token", torch.tensor([0.5, -0.5, 1.5]), 1.0, None, 1.0)
    yield ("top_p = None, top_k = 2", torch.tensor([0.5, -0.5, 1.5]), 1.0, 2, None)
    yield ("temperature 0 with top_p = 0.5", torch.tensor([0.5, 2.5, 2.5]), 0.0, None, 0.5)
