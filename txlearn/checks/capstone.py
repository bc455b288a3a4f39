"""Checks for set 09 (the capstone, ``txlearn/capstone/``): the learner's next-token loss, sampling
distribution and top-p, character model with a KV cache, generation, training loop, MiniLM
encoder and sentence embeddings, all on the learner's own modules of sets 03-07.

The right answers come from the course's package: :func:`txlearn.sampling.next_token_distribution`
(the one sampler), :class:`txlearn.capstone.model.CharTransformer` loaded with the same weights,
the course's MiniLM (:mod:`txlearn.capstone.pretrained`) and ``sentence-transformers`` for the
sentence embeddings (cached in :mod:`txlearn.checks.capstone_oracles`). When an answer differs,
what each catalogued mistake (tests/catalogue/capstone.py) computes on the same inputs chooses the
hint. The learner's objects are used only through ``call``, ``construct``, ``load_state`` and
``state_shapes``, with plain data.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch

from txlearn.checks import (CheckFailure, as_array, call, construct, diagnose, exercise,
                            expect_close, expect_shape, expect_true, load_state, state_shapes)
from txlearn.checks import capstone_oracles as oracles
from txlearn.checks.modules import quiet


def _earlier(*names: str) -> tuple:
    """The exercises of earlier sets among ``names`` that the course has now (a check's ``needs``
    may only name exercises that exist; sets 03-07 are being rewritten as modules)."""
    from pathlib import Path

    texts = [p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("[a-z]*.py")]
    return tuple(n for n in names if any(f'@exercise("{n}"' in t for t in texts))


def _rehint(err: CheckFailure, hint) -> CheckFailure:
    return CheckFailure(err.what, case=err.case, hint=hint, kind=err.kind, frames=err.frames)


def _match(got, expected, *, case, mistakes=(), default, rtol=1e-5, atol=1e-6, dtol=None):
    """expect_close; only when it fails do the mistakes choose the hint (``dtol``: (rtol, atol)
    of that comparison)."""
    try:
        expect_close(got, expected, case=case, hint=default, rtol=rtol, atol=atol)
    except CheckFailure as err:
        r, a = dtol or (rtol, atol)
        raise _rehint(err, diagnose(got, [(quiet(w), h) for w, h in mistakes], default,
                                    rtol=r, atol=a)) from None




def _finite(got) -> bool:
    a = as_array(got, np.float64)
    return a is not None and bool(np.isfinite(a).all())


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch")


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


def _loss_np(z, ids, mask):
    nll = _nll_np(z[:, :-1], ids[:, 1:])
    w = np.ones_like(nll) if mask is None else mask[:, 1:].astype(np.float64)
    return float((nll * w).sum() / w.sum())


def _loss_mistakes(z, ids, mask):
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
    ]


def _loss_cases():
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


@exercise("next_token_loss")
def next_token_loss(next_token_loss):
    for case, z, ids, mask in _loss_cases():
        args = (torch.tensor(z), torch.tensor(ids, dtype=torch.long),
                None if mask is None else torch.tensor(mask))
        got = call(next_token_loss, *args, case=case)
        expect_true(_is_tensor(got), case=case,
                    message=f"returned a {type(got).__name__}, expected a torch.Tensor",
                    hint=NOT_SCALAR)
        expect_shape(got, (), case=case, hint=NOT_SCALAR)
        expected = _loss_np(z.astype(np.float64), ids, mask)
        default = LOSS_UNSTABLE if not _finite(got) else LOSS_DEFAULT
        _match(got, expected, case=case, rtol=1e-5, atol=1e-5, default=default,
               mistakes=[] if not _finite(got) else _loss_mistakes(z.astype(np.float64), ids, mask),
               dtol=(1e-4, 1e-5))


# ================================================================= exercise: sampling_distribution

TEMP_MULTIPLIED = ("a temperature above 1 should flatten the distribution",
                   "divide the logits by the temperature; you multiplied by it")
SOFTMAX_AXIS = ("which axis holds the vocabulary?",
                "take the softmax over the last axis (the vocabulary); with a batch of rows, axis "
                "0 mixes different rows")
TIES_HIGH = ("with a tie at the k-th value, which indices stay?",
             "break ties by the LOWEST index: sort in descending order with a stable sort, so "
             "equal logits keep their index order; yours keeps the highest indices")
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
GREEDY_LAST = ("with two equal maxima, which one does greedy choose?",
               "the FIRST index of the maximum (the rule of torch.argmax); yours takes the last")
SAMPLE_UNSTABLE = ("what does exp() do with 1000 / 0.01?",
                   "subtract the maximum logit before dividing by the temperature: the largest "
                   "entry becomes exp(0) = 1 and nothing overflows")
NOT_FLOAT64 = ("the distribution is float64",
               "return float64 probabilities (convert the logits first): float32 loses tiny "
               "probabilities")
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


def _probs_mistakes(z, t, k):
    z = torch.as_tensor(z, dtype=torch.float64)
    n = z.shape[-1]
    kk = n if k is None else k
    keep = _keep_top_k(z, kk)
    out = [(lambda: _renorm(_softmax_t(z * t * t, t), keep), TEMP_MULTIPLIED)]
    if z.ndim > 1:
        out.append((lambda: _renorm(_softmax_t(z, t, dim=0), keep), SOFTMAX_AXIS))
    if k is not None and k < n:
        p = _softmax_t(z, t)
        out += [(lambda: _renorm(p, _keep_top_k(z, k, "high")), TIES_HIGH),
                (lambda: _renorm(p, _keep_top_k(z, k, "all")), TIES_ALL),
                (lambda: _renorm(p, _keep_top_k(z, k, extra=1)), OFF_BY_ONE),
                (lambda: _renorm(p, _keep_top_k(z, k, extra=-1)), OFF_BY_ONE),
                (lambda: _renorm(p, keep, renorm=False), NO_RENORM)]
    return out


def _sampling_cases():
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


@exercise("sampling_distribution")
def sampling_distribution(next_token_probs):
    from txlearn.sampling import next_token_distribution

    for case, z, t, k in _sampling_cases():
        zero = t == 0
        got = call(next_token_probs, z.clone(), t, k, case=case, hint=TEMP_ZERO if zero else None)
        expected = next_token_distribution(z, t, k)
        expect_shape(got, tuple(z.shape), case=case,
                     hint=("one probability per logit: the shape of the logits",))
        if not _finite(got):
            raise CheckFailure("the probabilities hold NaN or infinity", case=case,
                               hint=TEMP_ZERO if zero else SAMPLE_UNSTABLE)
        if zero:
            last = torch.nn.functional.one_hot(len(z) - 1 - z.flip(-1).argmax(-1), len(z))
            mistakes = [(last.double(), GREEDY_LAST)]
        else:
            mistakes = _probs_mistakes(z, t, k)
        _match(got, expected, case=case, rtol=1e-6, atol=1e-9, mistakes=mistakes,
               default=SAMPLE_DEFAULT, dtol=(1e-5, 1e-7))
        expect_true(getattr(got, "dtype", None) == torch.float64, case=case,
                    message=f"dtype {getattr(got, 'dtype', type(got).__name__)}, expected "
                            f"torch.float64", hint=NOT_FLOAT64)


# ================================================================= exercise: top_p

DROPS_CROSSING = ("is the token that crosses p kept?",
                  "keep a token when the mass BEFORE it is below p: the token whose probability "
                  "carries the sum past p stays; yours stops just before it")
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
UNSORTED = ("the nucleus holds the MOST probable tokens",
            "sort the probabilities in descending order before summing the mass; yours sums "
            "them in vocabulary order")
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
    keep_sorted = {"before": after - sp < top_p, "drop": after < top_p,
                   "drop_eq": after <= top_p, "tail": after > top_p}[rule]
    return torch.zeros(p.shape, dtype=torch.bool).scatter(-1, order, keep_sorted)


def _top_p_mistakes(z, t, k, top_p):
    from txlearn.sampling import next_token_distribution

    z = torch.as_tensor(z, dtype=torch.float64)
    p = next_token_distribution(z, t, k)
    out = [(lambda: _renorm(p, _nucleus(p, top_p, rule="drop")), DROPS_CROSSING),
           (lambda: _renorm(p, _nucleus(p, top_p, rule="drop_eq")), DROPS_CROSSING),
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


def _top_p_cases():
    yield ("probabilities [0.15, 0.5, 0.05, 0.3], top_p = 0.6",
           torch.tensor([0.15, 0.5, 0.05, 0.3], dtype=torch.float64).log(), 1.0, None, 0.6)
    yield ("temperature 2, then top_p = 0.7: logits [3, 1, 0.5, 0, -1]",
           torch.tensor([3.0, 1.0, 0.5, 0.0, -1.0]), 2.0, None, 0.7)
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


@exercise("top_p", needs=("sampling_distribution",))
def top_p(next_token_distribution):
    from txlearn.sampling import next_token_distribution as reference

    for case, z, t, k, p in _top_p_cases():
        got = call(next_token_distribution, z.clone(), t, k, p, case=case)
        expected = reference(z, t, k, p)
        expect_shape(got, tuple(z.shape), case=case,
                     hint=("one probability per logit: the shape of the logits",))
        expect_true(_finite(got), case=case, message="the probabilities hold NaN or infinity",
                    hint=("the kept set is never empty: the most probable token always stays",))
        mistakes = _top_p_mistakes(z, t, k, p) if p is not None and t > 0 else []
        _match(got, expected, case=case, rtol=1e-6, atol=1e-9, mistakes=mistakes,
               default=TOP_P_DEFAULT, dtol=(1e-5, 1e-7))


# ================================================================= exercise: char_model

CHAR_SIZES = dict(n_vocab=11, d_model=16, n_heads=4, d_ff=32, n_layers=2, block_size=12)
UNTIED = ("how many vocabulary-sized matrices does the model have?",
          "tie the output head to the token table: logits = h @ W_E^T with the same W_E that "
          "embeds the ids, no separate output matrix (Press & Wolf 2017)")
NO_FINAL_NORM = ("what comes between the last pre-LN layer and the head?",
                 "a pre-LN stack ends with one more LayerNorm, named norm: logits = "
                 "LayerNorm(x) @ E^T (pre-LN layers leave their output unnormalised)")
NO_POSITIONS = ("how does the model know where a token is?",
                "add the learned position row W_pos[t] to each token's embedding; without it "
                "the model sees a bag of characters")
POS_BY_ID = ("a position row for what?",
             "index W_pos by the positions start .. start + T - 1, not by the token ids")
NOT_REPLACED = ("which embedding does your LanguageModel's forward call?",
                "it calls self.embed: assign the CharEmbedding to self.embed (replacing the "
                "sinusoidal TokenEmbedding), not to an attribute of another name")
TABLE_NAME = ("what does the tied head of your LanguageModel read?",
              "its forward multiplies by self.embed.W_E transposed: name the token table W_E "
              "(and the positions W_pos)")
CHAR_NAMES = ("name the parameters as the statement does",
              "the state dict holds exactly embed.W_E, embed.W_pos, layers.<l>.<your set 07 "
              "names>, norm.gamma and norm.beta")
NO_CAUSAL = ("may a character see the ones after it?",
             "run every layer under your causal mask: position t may attend to positions <= t "
             "only (the logits of position t must not depend on later ids)")
MASK_INVERTED = ("what does True mean in your mask?",
                 "True = may attend: pass the causal mask itself, not its inverse")
POST_LN = ("which order do the capstone's layers use?",
           "build the layers with norm_first=True (pre-LN: x + Sublayer(LayerNorm(x))); yours "
           "are post-LN")
SCALED = ("is the embedding multiplied by anything?",
          "add W_E[ids] and W_pos[t] as they are: the capstone's model does not scale the "
          "embedding by sqrt(d_model) (the paper's TokenEmbedding does)")
POS_NOT_OFFSET = ("where do the new tokens sit after S cached ones?",
                  "with the cache, the T new tokens are positions start .. start + T - 1: take "
                  "those rows of W_pos (forward's start), not rows 0 .. T - 1")
MASK_TOP_LEFT = ("with T new queries over S keys, which keys may query i see?",
                 "the T new queries are the LAST T of S positions: use causal_mask(T, S), "
                 "aligned to the bottom-right corner (query i sees keys 0 .. S - T + i)")
NO_MASK_CACHED = ("may a new token see the new tokens after it?",
                  "with the cache too, run the layers under causal_mask(T, S): without it the "
                  "first new token sees the later ones")
CACHE_IGNORED = ("did the new tokens see the cached ones?",
                 "with use_cache=True pass use_cache to every layer, so that its attention "
                 "appends K and V to the cache and attends over all S = start + T positions")
CACHE_RAISED = ("with a cache, T new queries meet S = start + T keys: do your layers see all S?",
                "pass use_cache to every layer (its attention appends K and V and attends over "
                "all S positions), mask with causal_mask(T, start + T), and take the positions "
                "start .. start + T - 1 (count the cached positions in the model)")
CHAR_DEFAULT = ("x_t = W_E[ids_t] + W_pos[start + t], then your LanguageModel: pre-LN layers "
                "under the causal mask, the final LayerNorm, logits = LN(h) @ W_E^T",)


def _char_reference(seed: int = 0, sizes=None, e_scale: float = 1.0):
    """The course's CharTransformer (float32) with random weights large enough that every part
    matters (the token table ~ N(0, e_scale^2)), and its state dict in the learner's names."""
    from txlearn.capstone.model import CharTransformer

    s = dict(CHAR_SIZES, **(sizes or {}))
    ref = CharTransformer(s["n_vocab"], s["d_model"], s["n_heads"], s["n_layers"], s["d_ff"],
                          s["block_size"])
    g = _seeded_init(ref, seed)

    def randn_like(p):
        return torch.randn(p.shape, generator=g, dtype=p.dtype)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.3 * randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.2 * randn_like(p))
            elif name == "E":
                p.copy_(randn_like(p) * e_scale)
            else:
                p.copy_(randn_like(p) * (0.6 if "position" in name else
                                         1.0 / math.sqrt(p.shape[0])))
    return ref.eval(), _learner_state(ref)


def _seeded_init(ref, seed: int) -> torch.Generator:
    """Give a new CharTransformer the weights ``torch.manual_seed(seed)`` before building it
    gives, drawn from a generator of its own, which is returned for further draws. The global
    generator is shared by the grader's threads (one per submission graded at once): a seeded
    block on it took draws of another student's check, and a right answer failed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in ref.named_parameters():   # in the order the constructors draw them
            leaf = name.rsplit(".", 1)[-1]
            if name in ("E", "position.W_pos"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.02)
            elif leaf in ("W_Q", "W_K", "W_V", "W_O"):
                torch.nn.init.xavier_uniform_(p, generator=g)
            elif leaf in ("W_1", "W_2", "W_3"):
                bound = 1.0 / math.sqrt(p.shape[0])
                torch.nn.init.uniform_(p, -bound, bound, generator=g)
    return g


_NAMES = {"E": "embed.W_E", "position.W_pos": "embed.W_pos"}   # CharTransformer -> learner


def _learner_state(ref) -> dict:
    """``{learner name: tensor}`` of a CharTransformer: the token table as ``embed.W_E``, the
    positions as ``embed.W_pos``, the layers and the final norm under their own names."""
    return {_NAMES.get(k, k): v.detach().clone() for k, v in ref.state_dict().items()}


@contextmanager
def _norm_first(ref, value: bool):
    saved = [layer.norm_first for layer in ref.layers]
    for layer in ref.layers:
        layer.norm_first = value
    try:
        yield
    finally:
        for layer, v in zip(ref.layers, saved):
            layer.norm_first = v


def _char_logits(ref, ids, prefix=None, *, mask="causal", pos_start=None, positions=True,
                 final_norm=True, norm_first=True, scale=1.0, pos_by_id=False):
    """Logits of the reference for ``ids (B, T)``, after ``prefix (B, S0)`` in a KV cache (None:
    no cache), computed with one catalogued mistake when asked. Returns float64 numpy."""
    from txlearn.heads import KVCache
    from txlearn.masks import causal_mask

    with torch.no_grad(), _norm_first(ref, norm_first):
        caches = None
        if prefix is not None:
            caches = [KVCache() for _ in ref.layers]
            ref(prefix, caches)
        start = prefix.shape[1] if prefix is not None else 0
        T, S = ids.shape[1], start + ids.shape[1]
        first = start if pos_start is None else pos_start
        x = ref.E[ids] * scale
        if positions:
            x = x + ref.position(ids if pos_by_id else torch.arange(first, first + T))
        m = {"causal": causal_mask(T, S), "none": None, "inverted": ~causal_mask(T, S),
             "top-left": torch.ones(T, S).tril().bool()}[mask]
        for l, layer in enumerate(ref.layers):
            x = layer(x, mask=m, cache=caches[l] if caches else None)
        h = ref.norm(x) if final_norm else x
        return (h @ ref.E.T).double().numpy()


def _load_char(model, state, case):
    """load_state, with hints for a missing head tie, final norm or position table."""
    try:
        load_state(model, state, case=case)
    except CheckFailure as err:
        if err.kind != "wrong" or not err.what.startswith("your module"):
            raise
        shapes = state_shapes(model, case=case)
        table, positions = tuple(state["embed.W_E"].shape), tuple(state["embed.W_pos"].shape)
        extra = [k for k in shapes if k not in state]
        missing = [k for k in state if k not in shapes]
        if "embed.W_pos" in missing and any(tuple(shapes[k]) == positions and
                                            not k.startswith("embed.") for k in extra):
            raise _rehint(err, NOT_REPLACED) from None
        if any(not k.startswith("embed.") and tuple(shapes[k]) in (table, table[::-1])
               for k in extra):
            raise _rehint(err, UNTIED) from None
        if "embed.W_pos" in missing and not any(tuple(shapes[k]) == positions for k in extra):
            raise _rehint(err, NO_POSITIONS) from None
        if "embed.W_E" in missing and any(k.startswith("embed.") and tuple(shapes[k]) == table
                                          for k in extra):
            raise _rehint(err, TABLE_NAME) from None
        if "norm.gamma" in missing and not any(k.startswith("norm") for k in extra):
            raise _rehint(err, NO_FINAL_NORM) from None
        raise _rehint(err, CHAR_NAMES) from None


def _build_char(CharModel, state, case, sizes=None):
    s = dict(CHAR_SIZES, **(sizes or {}))
    model = construct(CharModel, s["n_vocab"], s["d_model"], s["n_heads"], s["d_ff"],
                      s["n_layers"], s["block_size"], case=case)
    _load_char(model, state, case)
    return model


@exercise("char_model", needs=_earlier("language_model"))
def char_model(CharModel):
    ref, state = _char_reference()
    sizes = ", ".join(f"{k}={v}" for k, v in CHAR_SIZES.items())
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, CHAR_SIZES["n_vocab"], (2, CHAR_SIZES["block_size"]), generator=g)
    full = _char_logits(ref, ids)
    shape = (2, CHAR_SIZES["block_size"], CHAR_SIZES["n_vocab"])

    case = f"CharModel({sizes}), a full window (2, 12)"
    model = _build_char(CharModel, state, case)
    got = call(model, ids.clone(), case=case)
    expect_shape(got, shape, case=case, hint=("logits are (B, T, n_vocab)",))
    _match(got, full, case=case, rtol=1e-4, atol=1e-4, default=CHAR_DEFAULT, dtol=(1e-3, 1e-3),
           mistakes=[(lambda: _char_logits(ref, ids, mask="none"), NO_CAUSAL),
                     (lambda: _char_logits(ref, ids, mask="inverted"), MASK_INVERTED),
                     (lambda: _char_logits(ref, ids, norm_first=False), POST_LN),
                     (lambda: _char_logits(ref, ids, final_norm=False), NO_FINAL_NORM),
                     (lambda: _char_logits(ref, ids, positions=False), NO_POSITIONS),
                     (lambda: _char_logits(ref, ids, pos_by_id=True), POS_BY_ID),
                     (lambda: _char_logits(ref, ids, scale=4.0), SCALED)])

    case = "a new model, use_cache=True: the first 5 ids of the window"
    model = _build_char(CharModel, state, case)
    got = call(model, ids[:, :5].clone(), use_cache=True, case=case, hint=CACHE_RAISED)
    _match(got, full[:, :5], case=case, rtol=1e-4, atol=1e-4, default=CHAR_DEFAULT)

    case = "then the next 3 ids with use_cache=True (S = 8 keys, T = 3 queries)"
    got = call(model, ids[:, 5:8].clone(), use_cache=True, case=case, hint=CACHE_RAISED)
    expect_shape(got, (2, 3, CHAR_SIZES["n_vocab"]), case=case,
                 hint=("logits only for the T new ids: (B, T, n_vocab)",))
    prefix, new = ids[:, :5], ids[:, 5:8]
    _match(got, full[:, 5:8], case=case, rtol=1e-4, atol=1e-4, default=CHAR_DEFAULT,
           dtol=(1e-3, 1e-3),
           mistakes=[(lambda: _char_logits(ref, new, prefix, pos_start=0), POS_NOT_OFFSET),
                     (lambda: _char_logits(ref, new, prefix, mask="top-left"), MASK_TOP_LEFT),
                     (lambda: _char_logits(ref, new, prefix, mask="none"), NO_MASK_CACHED),
                     (lambda: _char_logits(ref, new, pos_start=5), CACHE_IGNORED),
                     (lambda: _char_logits(ref, new), CACHE_IGNORED)])


# ================================================================= exercise: cached_generation

FIRST_POSITION = ("which position's logits predict the next id?",
                  "take the logits of the LAST position, [0, -1]: it has read the whole sequence")
NOT_RESET = ("what is in the cache when generate is called again?",
             "a call of generate starts a new sequence: reset the model's cache first "
             "(reset_cache), or the old positions stay in it (the second call differs from the "
             "first)")
WHOLE_WITH_CACHE = ("with the cache, what does each later step feed the model?",
                    "after the prompt, feed only the newest id, (1, 1): its keys and values join "
                    "the cache; feeding the whole sequence again appends every position twice")
PROMPT_SKIPPED = ("does the cache hold the prompt?",
                  "the first step runs the whole prompt with use_cache=True, so that every "
                  "prompt position is in the cache before the first new id")
NEW_GENERATOR = ("how many generators does one call make?",
                 "make the torch.Generator once per call, before the loop: re-seeding it every "
                 "step draws the same random number each time")
IGNORES_FILTERS = ("are top_k and top_p used?",
                   "pass temperature, top_k and top_p to your next_token_distribution at every "
                   "step")
ALWAYS_GREEDY = ("what should a temperature above 0 do?",
                 "at temperature > 0 draw from the distribution with torch.multinomial; the "
                 "maximum is only for temperature 0")
NO_PROMPT = ("what does generate return?",
             "the prompt followed by the n_new new ids: (T0 + n_new,)")
GEN_DEFAULT = ("each step: logits of the last position, your next_token_distribution, then the "
               "argmax (temperature 0) or one torch.multinomial draw with the call's generator",)


def _ref_generate(ref, prompt, n_new, temperature=0.0, top_k=None, top_p=None, seed=0, *,
                  position=-1, reseed=False, filters=True, greedy=False, prefill=True):
    """The reference ids (a list), recomputing the whole sequence each step; the keywords make
    a catalogued mistake."""
    from txlearn.heads import KVCache
    from txlearn.sampling import next_token_distribution

    generator = torch.Generator().manual_seed(seed)
    ids = [int(i) for i in prompt]
    caches = None if prefill else [KVCache() for _ in ref.layers]
    with torch.no_grad():
        for step in range(n_new):
            if prefill:
                logits = ref(torch.tensor([ids]))[0, position]
            else:   # the cache is fed the last prompt id, then each new one
                logits = ref(torch.tensor([ids[-1:]]), caches)[0, -1]
            probs = next_token_distribution(logits, temperature, *((top_k, top_p) if filters
                                                                   else (None, None)))
            if reseed:
                generator = torch.Generator().manual_seed(seed)
            if temperature == 0 or greedy:
                ids.append(int(probs.argmax()))
            else:
                ids.append(int(torch.multinomial(probs, 1, generator=generator)))
    return ids


def _ids(got, expected, *, case, mistakes, default, n_prompt=3):
    a = as_array(got)
    expect_true(a is not None and a.ndim == 1, case=case,
                message=f"expected a 1-D tensor of ids, got {type(got).__name__}"
                        f"{'' if a is None else ' of shape ' + str(tuple(a.shape))}",
                hint=NO_PROMPT)
    n_new = len(expected) - n_prompt
    expect_true(a.shape != (n_new,), case=case, message=f"shape {tuple(a.shape)}, expected "
                f"({len(expected)},)", hint=NO_PROMPT)
    expect_shape(a, (len(expected),), case=case, hint=NO_PROMPT)
    differs = [i for i in range(len(expected)) if int(a[i]) != expected[i]]
    if differs:
        i = differs[0]
        hint = next((h for w, h in mistakes if _safe_list(w) == [int(v) for v in a]), default)
        raise CheckFailure(f"ids differ first at index {i}: got {int(a[i])}, expected "
                           f"{expected[i]} (got {[int(v) for v in a]})", case=case, hint=hint)


def _safe_list(wrong):
    try:
        return wrong()
    except Exception:
        return None


@exercise("cached_generation", needs=("char_model", "top_p"))
def cached_generation(generate, CharModel):
    ref, state = _char_reference(seed=3, e_scale=0.3)   # greedy margins >= 0.06: no near-ties
    prompt, n_new = torch.tensor([3, 1, 4]), 9
    greedy = _ref_generate(ref, prompt, n_new)
    model = _build_char(CharModel, state, "CharModel(n_vocab=11, d_model=16, n_heads=4, "
                                          "d_ff=32, n_layers=2, block_size=12)")

    case = "greedy, without the cache: prompt [3, 1, 4], 9 new ids"
    got = call(generate, model, prompt.clone(), n_new, 0.0, None, None, 0, use_cache=False,
               case=case)
    _ids(got, greedy, case=case, default=GEN_DEFAULT,
         mistakes=[(lambda: _ref_generate(ref, prompt, n_new, position=0), FIRST_POSITION)])

    case = "greedy, with the cache: the same prompt"
    got = call(generate, model, prompt.clone(), n_new, 0.0, None, None, 0, use_cache=True,
               case=case, hint=WHOLE_WITH_CACHE)
    _ids(got, greedy, case=case, default=GEN_DEFAULT,
         mistakes=[(lambda: _ref_generate(ref, prompt, n_new, position=0), FIRST_POSITION),
                   (lambda: _ref_generate(ref, prompt, n_new, prefill=False), PROMPT_SKIPPED)])

    case = "greedy, with the cache, a second call (a new sequence)"
    got = call(generate, model, prompt.clone(), n_new, 0.0, None, None, 0, use_cache=True,
               case=case, hint=NOT_RESET)
    _ids(got, greedy, case=case, default=NOT_RESET, mistakes=[])

    settings = (1.0, 5, 0.9, 7)
    sampled = _ref_generate(ref, prompt, n_new, *settings)
    mistakes = [(lambda: _ref_generate(ref, prompt, n_new, *settings, reseed=True), NEW_GENERATOR),
                (lambda: _ref_generate(ref, prompt, n_new, *settings, filters=False),
                 IGNORES_FILTERS),
                (lambda: _ref_generate(ref, prompt, n_new, *settings, greedy=True), ALWAYS_GREEDY)]
    for use_cache in (True, False):
        case = (f"temperature 1, top_k 5, top_p 0.9, seed 7, "
                f"{'with' if use_cache else 'without'} the cache")
        got = call(generate, model, prompt.clone(), n_new, *settings, use_cache=use_cache,
                   case=case)
        _ids(got, sampled, case=case, default=GEN_DEFAULT, mistakes=mistakes)


# ================================================================= exercise: training_loop

PROBE_SIZES = dict(n_vocab=7, d_model=8, n_heads=2, d_ff=16, n_layers=1, block_size=6)
PROBE_LR = 0.05
RUN = dict(d_model=48, n_heads=4, d_ff=192, n_layers=2, block_size=32, steps=300, batch_size=32,
           lr=5e-3, seed=0)
MARGIN = 0.1            # nats per character below the bigram
TRAIN_SECONDS = 120.0   # the time limit of the stated run (about 10 s on one quiet core)

NO_STEP = ("did the parameters change at all?",
           "after the backward pass, the optimizer's step must run; zero the gradients BEFORE "
           "the backward pass (zeroing between backward and step throws the gradients away)")
LR_HIGH = ("how large is each step?",
           "pass the lr you are given to AdamW: the first step moves each parameter by about lr; "
           "yours moved the model several times further")
LR_LOW = ("how large is each step?",
          "pass the lr you are given to AdamW; yours moved the model much less than lr allows")
NO_ZERO_GRAD = ("what is in .grad at the second step?",
                "PyTorch adds each backward pass to .grad: zero the gradients (the optimizer's "
                "zero_grad) every step, or each step follows the sum of all gradients so far")
NEW_OPTIMIZER = ("how long does AdamW's memory last?",
                 "create the optimizer once, before the loop: a new AdamW every step forgets its "
                 "running averages of the gradients")
TRAIN_DATA = ("on which text do you measure the returned loss?",
              "return what evaluate measures on val_ids, the held-out text; a loss on the "
              "training text cannot show whether the model generalises")
RETURN_WRONG = ("what does train return?",
                "the number evaluate gives for val_ids after the last step: a Python float, the "
                "mean loss over every prediction of the held-out windows")
EVAL_WRONG = ("evaluate: every window, every prediction, one mean",
              "cut ids into the non-overlapping windows of block_size, run the model on them, and "
              "average next_token_loss over ALL their predictions (weigh each batch by its size)")
TOO_LONG = ("how many positions does the model have?",
            "a window is block_size ids: the model has block_size rows of W_pos, and the loss "
            "shifts inside the window")
NOT_CAUSAL = ("may a prediction depend on the tokens after it?",
              "your model's logits at early positions changed when only later tokens changed: it "
              "looks at the future, which a causal language model cannot do when generating "
              "(check the causal mask and where the positions come from)")
NOT_BEATEN = ("the loop is right on the small cases; is the model learning fast enough?",
              "check that the loop draws a new random batch every step from train_ids, and that "
              "your model passes char_model")
TRAIN_DEFAULT = ("steps of AdamW(model.parameters(), lr=lr): zero_grad, the loss of a batch of "
                 "random windows, backward, step; then return evaluate on val_ids",)


def _probe_data():
    train_ids = torch.full((40,), 3, dtype=torch.long)   # every window is the same: any sampler
    val_ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3] * 3)   # 5 windows of 6
    return train_ids, val_ids


def _ref_train(ref, train_ids, steps, batch_size, block_size, lr, *, accumulate=False,
               fresh_optimizer=False, scale=1.0):
    """The reference loop on ``ref`` (changed in place); the keywords make a catalogued mistake."""
    def loss_of(x):
        logits = ref(x)
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                 x[:, 1:].flatten())

    optimizer = torch.optim.AdamW(ref.parameters(), lr=lr * scale)
    x = train_ids[:block_size].expand(batch_size, block_size)   # the probe's only window
    ref.train()
    for _ in range(steps):
        if fresh_optimizer:
            optimizer = torch.optim.AdamW(ref.parameters(), lr=lr * scale)
        if not accumulate:
            optimizer.zero_grad()
        loss_of(x).backward()
        optimizer.step()
    return ref.eval()


def _probe_reference(steps, **mistake):
    ref, _ = _char_reference(seed=2, sizes=PROBE_SIZES)
    train_ids, val_ids = _probe_data()
    return _ref_train(ref, train_ids, steps, 4, PROBE_SIZES["block_size"], PROBE_LR, **mistake)


def _windows(ids, block_size):
    n = len(ids) // block_size
    return ids[: n * block_size].view(n, block_size)


def _loss_of_logits(logits, x):
    """Mean next-token loss (float) of logits (B, T, V) on windows x (B, T): the check's own."""
    z = torch.as_tensor(as_array(logits, np.float64))
    return float(torch.nn.functional.cross_entropy(z[:, :-1].flatten(0, 1), x[:, 1:].flatten()))


def _model_loss(model, ids, block_size, case, batch=256):
    """The mean next-token loss over the non-overlapping windows of ids, through forward calls."""
    windows = _windows(ids, block_size)
    total = 0.0
    for i in range(0, len(windows), batch):
        x = windows[i:i + batch]
        logits = call(model, x.clone(), case=case)
        total += _loss_of_logits(logits, x) * len(x)
    return total / len(windows)


def _causality_probe(model, block_size, n_vocab, case, rows=64, seed=11):
    """Random windows sent twice in one call: as they are, and with their second half replaced
    by other ids. The first half's logits must not change. Random ids, not the text the loss is
    measured on: the probe shows the model no token it will be asked to predict."""
    half = block_size // 2
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, n_vocab, (rows, block_size), generator=g)
    other = x.clone()
    other[:, half:] = torch.randint(0, n_vocab, (rows, block_size - half), generator=g)
    logits = as_array(call(model, torch.cat([x, other]), case=case), np.float64)
    if logits is None or logits.shape != (2 * rows, block_size, n_vocab):
        expect_shape(logits, (2 * rows, block_size, n_vocab), case=case,
                     hint=("logits (B, T, n_vocab): one row of scores per position",))
    expect_true(np.allclose(logits[:rows, :half], logits[rows:, :half], rtol=1e-4, atol=1e-4),
                case=case, message=f"the logits of positions 0-{half - 1} changed when only "
                                   f"positions {half}-{block_size - 1} of the input changed",
                hint=NOT_CAUSAL)


def _causal_model_loss(model, ids, block_size, n_vocab, case, batch=256):
    """The mean next-token loss over the non-overlapping windows of ids, as :func:`_model_loss`
    computes it for a causal model, with every prediction scored from an input that ends just
    before its target: the prefixes of each batch of windows, shortest first. The model is never
    shown a token before it has predicted it, so neither reading ahead in its input (which a
    comparison of two inputs can be told apart from, and was) nor remembering what earlier
    calls showed it helps."""
    windows = _windows(ids, block_size)
    total = 0.0
    for i in range(0, len(windows), batch):
        x = windows[i:i + batch]
        for c in range(1, block_size):
            logits = as_array(call(model, x[:, :c].clone(), case=case), np.float64)
            if logits is None or logits.ndim != 3 or logits.shape[:2] != (len(x), c):
                expect_shape(logits, (len(x), c, n_vocab), case=case,
                             hint=("logits (B, T, n_vocab): one row of scores per position",))
            total += float(torch.nn.functional.cross_entropy(
                torch.as_tensor(logits[:, -1]), x[:, c], reduction="sum"))
    return total / (len(windows) * (block_size - 1))


def _probe(CharModel, train, steps, case):
    """Train a tiny model ``steps`` steps on constant text; return (model, returned value)."""
    _, state = _char_reference(seed=2, sizes=PROBE_SIZES)
    model = _build_char(CharModel, state, case, sizes=PROBE_SIZES)
    train_ids, val_ids = _probe_data()
    returned = call(train, model, train_ids.clone(), val_ids.clone(), steps=steps, batch_size=4,
                    block_size=PROBE_SIZES["block_size"], lr=PROBE_LR, seed=0, case=case,
                    hint=TOO_LONG)
    return model, returned


def _logits_np(model, x, case):
    return as_array(call(model, x.clone(), case=case), np.float64)


@exercise("training_loop", needs=("char_model", "next_token_loss"))
def training_loop(train, evaluate, CharModel):
    train_ids, val_ids = _probe_data()
    x_val = _windows(val_ids, PROBE_SIZES["block_size"])
    init = _char_logits(_char_reference(seed=2, sizes=PROBE_SIZES)[0], x_val)

    # 1. one step from a known start, on text where every window is the same
    case = "a tiny CharModel, 1 step at lr 0.05 on constant text"
    model, _ = _probe(CharModel, train, 1, case)
    got = _logits_np(model, x_val, case)
    expected = _char_logits(_probe_reference(1), x_val)
    if got is not None and got.shape == expected.shape and not np.allclose(got, expected,
                                                                            rtol=1e-3, atol=1e-4):
        moved, should = np.linalg.norm(got - init), np.linalg.norm(expected - init)
        hint = NO_STEP if moved < 1e-3 * should else LR_HIGH if moved > 3 * should else \
            LR_LOW if moved < should / 3 else TRAIN_DEFAULT
        expect_close(got, expected, case=case, rtol=1e-3, atol=1e-4, hint=hint)

    # 2. three steps: the gradients of each step, one optimizer
    case = "a tiny CharModel, 3 steps at lr 0.05 on constant text"
    model, returned = _probe(CharModel, train, 3, case)
    got = _logits_np(model, x_val, case)
    _match(got, _char_logits(_probe_reference(3), x_val), case=case, rtol=1e-3, atol=1e-4,
           default=TRAIN_DEFAULT, dtol=(1e-3, 1e-4),
           mistakes=[(lambda: _char_logits(_probe_reference(3, accumulate=True), x_val),
                      NO_ZERO_GRAD),
                     (lambda: _char_logits(_probe_reference(3, fresh_optimizer=True), x_val),
                      NEW_OPTIMIZER),
                     (lambda: init, NO_STEP)])

    # 3. what train returns, and evaluate: the loss on the held-out windows
    val_loss = _loss_of_logits(got, x_val)
    case = "the value train returned after those 3 steps"
    expect_true(isinstance(returned, (int, float)) or as_array(returned) is not None and
                as_array(returned).size == 1, case=case,
                message=f"train returned {type(returned).__name__}, expected a number",
                hint=RETURN_WRONG)
    if not math.isclose(float(as_array(returned, np.float64).reshape(())), val_loss,
                        rel_tol=1e-4, abs_tol=1e-5):
        on_train = _model_loss(model, train_ids, PROBE_SIZES["block_size"], case)
        r = float(as_array(returned, np.float64).reshape(()))
        hint = TRAIN_DATA if math.isclose(r, on_train, rel_tol=1e-4, abs_tol=1e-5) else \
            RETURN_WRONG
        raise CheckFailure(f"train returned {r:.6g}; the loss on val_ids is {val_loss:.6g}",
                           case=case, hint=hint)
    case = "evaluate(model, val_ids, 6) on that model: 5 windows"
    got = call(evaluate, model, val_ids.clone(), PROBE_SIZES["block_size"], case=case)
    expect_close(got, val_loss, case=case, rtol=1e-4, atol=1e-5, hint=EVAL_WRONG)
    case = "evaluate on 1,800 random ids: 300 windows of 6, two batches (256 + 44)"
    ids = torch.randint(0, PROBE_SIZES["n_vocab"], (1800,), generator=torch.Generator().manual_seed(8))
    got = call(evaluate, model, ids.clone(), PROBE_SIZES["block_size"], case=case)
    expect_close(got, _model_loss(model, ids, PROBE_SIZES["block_size"], case), case=case,
                 rtol=1e-4, atol=1e-5, hint=EVAL_WRONG)

    # 4. the stated run on the course's corpus, judged on the validation split
    B = RUN["block_size"]
    train_ids, val_ids, n_vocab, bigram = oracles.corpus(B)
    sizes = {k: RUN[k] for k in ("d_model", "n_heads", "d_ff", "n_layers", "block_size")}
    _, init_state = _course_init(n_vocab, sizes)
    case = (f"CharModel({n_vocab}, d_model=48, n_heads=4, d_ff=192, n_layers=2, block_size=32), "
            f"train(steps=300, batch_size=32, block_size=32, lr=5e-3, seed=0)")
    model = _build_char(CharModel, init_state, case, sizes=dict(sizes, n_vocab=n_vocab))
    # train sees a stand-in for the validation split (the end of the training text): the
    # validation text itself reaches the learner's code only as inputs of the evaluation below,
    # after training, never as something to return or train on
    stand_in = train_ids[-len(val_ids):]
    returned = call(train, model, train_ids, stand_in.clone(), steps=RUN["steps"],
                    batch_size=RUN["batch_size"], block_size=B, lr=RUN["lr"], seed=RUN["seed"],
                    case=case, time_limit=TRAIN_SECONDS)
    _causality_probe(model, B, n_vocab, case)
    measured = _causal_model_loss(model, val_ids, B, n_vocab, case)
    expect_true(math.isfinite(measured) and measured <= bigram - MARGIN, case=case,
                message=f"validation loss {measured:.3f} nats/char after {RUN['steps']} steps; "
                        f"the bigram's is {bigram:.3f}, so {bigram - MARGIN:.3f} or less is "
                        f"needed", hint=NOT_BEATEN)
    on_stand_in = _model_loss(model, stand_in, B, case)
    r = as_array(returned, np.float64)
    expect_true(r is not None and r.size == 1 and math.isclose(float(r.reshape(())), on_stand_in,
                                                               rel_tol=1e-3), case=case,
                message=f"train returned {returned!r:.40}; evaluate on the val_ids it was given "
                        f"gives {on_stand_in:.4f}", hint=RETURN_WRONG)


def _course_init(n_vocab, sizes):
    """The course's initialisation of CharTransformer (seed 0) in the learner's names."""
    from txlearn.capstone.model import CharTransformer

    ref = CharTransformer(n_vocab, sizes["d_model"], sizes["n_heads"], sizes["n_layers"],
                          sizes["d_ff"], sizes["block_size"])
    _seeded_init(ref, 0)
    return ref, _learner_state(ref)


# ================================================================= exercise: minilm_encoder

ONE_SENTENCE = ("The cat sat on the mat.",)
PADDED = ("A man is playing a guitar.", "Hi", "Crème brûlée is a French dessert, served cold.")
ENC_HINTS = {
    "pre-LN": ("which order do BERT's layers use?",
               "MiniLM is post-LN: build your layers with norm_first=False, "
               "LayerNorm(x + Sublayer(x))"),
    "tanh GELU": ("which GELU did BERT use?",
                  "the exact GELU, x * Phi(x) with erf; the tanh approximation differs by up to "
                  "1e-3 and the difference grows through six layers"),
    "eps 1e-5": ("which LayerNorm epsilon does the checkpoint use?",
                 "layer_norm_eps is 1e-12 in config.json: pass it to every LayerNorm (the "
                 "embedding's and both of each layer), not the default 1e-5"),
    "attention weights not transposed": (
        "which layout does the checkpoint store?",
        "nn.Linear stores (d_out, d_in); yours are (d_in, d_out): transpose EVERY linear "
        "weight, the square attention ones too (their shapes match either way)"),
    "no embedding LayerNorm": ("what normalises the embeddings?",
                               "LayerNorm(E_word[ids] + P[t] + E_type[type]) before the first "
                               "layer (the checkpoint's embeddings.LayerNorm)"),
    "no token types": ("what is the third embedding?",
                       "add E_type[token_type_ids] too (every id is 0 for one sentence, but row "
                       "0 is not zero)"),
    "no positions": ("how does the encoder know where a token is?",
                     "add the learned position rows P[0 .. T-1]"),
    "padding keys attended": ("may a real token attend to the padding?",
                              "mask the padding keys: a boolean mask (B, 1, 1, T), True at real "
                              "tokens, for every layer"),
    "mask inverted": ("what does True mean in the course's masks?",
                      "True = may attend: True at the real tokens (attention_mask == 1), not at "
                      "the padding"),
}
ENC_RAISED = ("which layout does the checkpoint store?",
              "the checkpoint's linear weights are (d_out, d_in) and yours (d_in, d_out): "
              "transpose them when you load; every name of the statement's table is filled once")
ENC_DEFAULT = ("x_0 = LayerNorm(E_word[ids] + P[t] + E_type[type]); six post-LN layers, eps "
               "1e-12, exact GELU, under the padding mask",)


ENC_LOADER = {"attention weights not transposed", "eps 1e-5"}   # what a loader can get wrong


def _encoder_case(encoder, sentences, case, variants):
    batch = oracles.tokens(sentences)
    got = call(encoder, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
               case=case, time_limit=60)
    B, T = batch["input_ids"].shape
    expect_shape(got, (B, T, 384), case=case, hint=("token states are (B, T, d_model)",))
    real = batch["attention_mask"].numpy()[..., None].astype(np.float64)   # (B, T, 1)
    g = as_array(got, np.float64)
    _match(g * real, oracles.encoder_states(sentences) * real, case=case, rtol=1e-4, atol=1e-4,
           default=ENC_DEFAULT, dtol=(1e-4, 1e-4),
           mistakes=[(lambda v=v: oracles.encoder_states(sentences, v) * real, ENC_HINTS[v])
                     for v in variants])


def _load_encoder(load_minilm, case):
    from txlearn.capstone.assets import model_dir
    return construct(load_minilm, str(model_dir()), case=case, time_limit=60, hint=ENC_RAISED)


@exercise("minilm_encoder", needs=_earlier("transformer_layer", "layer_norm_module"))
def minilm_encoder(MiniLM, load_minilm):
    sizes = oracles.minilm_sizes()
    case = "MiniLM({}) with the checkpoint's weights, loaded by the check".format(
        ", ".join(str(v) for v in sizes.values()))
    encoder = construct(MiniLM, *sizes.values(), case=case, time_limit=60)
    load_state(encoder, oracles.minilm_state(), case=case, time_limit=60)
    forward_only = [v for v in ENC_HINTS if v != "attention weights not transposed"]
    _encoder_case(encoder, ONE_SENTENCE, "your MiniLM, one sentence: 'The cat sat on the mat.'",
                  forward_only)
    _encoder_case(encoder, PADDED, "your MiniLM, three sentences of 9, 3 and 15 tokens (padded)",
                  forward_only)
    encoder = _load_encoder(load_minilm, "load_minilm(model_dir())")
    _encoder_case(encoder, PADDED, "load_minilm(model_dir()), the three padded sentences",
                  sorted(ENC_LOADER))


# ================================================================= exercise: sentence_embeddings

SENTENCES = ("A man is playing a guitar.", "Someone is playing an instrument.",
             "The stock market fell sharply today.", "Crème brûlée is a French dessert.",
             "Wait... what?! (really)", "Snowman ☃ and robot 🤖", "Hi",
             "def attention(Q, K, V): return softmax(Q @ K.T / sqrt(d_k)) @ V")
POOL_PADDING = ("which tokens does the mean run over?",
                "average only the real tokens: weigh each state by its mask entry and divide by "
                "the number of real tokens, not by T")
POOL_CLS = ("which tokens make the sentence vector?",
            "Sentence-BERT averages every real token; the first token ([CLS]) alone is BERT's "
            "choice, not this model's")
POOL_MAX = ("a mean, not a maximum", "average the real tokens' states (mean pooling)")
NO_NORMALISE = ("how long is each embedding?",
                "divide each sentence vector by its L2 norm, so that every embedding has length 1")
NORMALISE_TOKENS = ("normalise what, when?",
                    "first the mean over the real tokens, then divide that mean by its norm; "
                    "normalising each token first gives a vector shorter than 1")
NORMALISE_AXIS = ("over which axis is the norm?",
                  "the L2 norm of each sentence vector, over its d features (the last axis), "
                  "not over the batch")
POOL_DEFAULT = ("u = sum_t m_t X_t / sum_t m_t over the real tokens, then e = u / ||u||",)


def _pool_mistakes(X, m):
    w = m[:, :, None].astype(np.float64)
    real_mean = (X * w).sum(1) / w.sum(1)
    unit = lambda u: u / np.linalg.norm(u, axis=-1, keepdims=True)           # noqa: E731
    Xn = X / np.linalg.norm(X, axis=-1, keepdims=True)
    return [(unit(X.mean(1)), POOL_PADDING),
            (unit(X[:, 0]), POOL_CLS),
            (unit(np.where(w > 0, X, -np.inf).max(1)), POOL_MAX),
            (real_mean, NO_NORMALISE),
            (X.mean(1), NO_NORMALISE),
            (((Xn * w).sum(1) / w.sum(1)), NORMALISE_TOKENS),
            (real_mean / np.linalg.norm(real_mean, axis=0, keepdims=True), NORMALISE_AXIS)]


def _pool_expected(X, m):
    w = m[:, :, None].astype(np.float64)
    u = (X * w).sum(1) / w.sum(1)
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def _pool_cases():
    rng = np.random.default_rng(11)
    X = rng.normal(size=(2, 4, 3))
    X[0, 3], X[1, 2:] = 50.0, -80.0                         # large padding rows
    yield "B = 2, T = 4, d = 3, lengths [3, 2], padding rows large", X, np.array(
        [[1, 1, 1, 0], [1, 1, 0, 0]])
    X = rng.normal(size=(3, 5, 4)) + 1.0
    yield "B = 3, T = 5, d = 4, no padding", X, np.ones((3, 5), dtype=np.int64)
    X = (rng.normal(size=(2, 6, 8)) * 3).astype(np.float32)
    yield "float32 states (2, 6, 8), lengths [6, 4]", X, np.array([[1] * 6, [1] * 4 + [0] * 2])


@exercise("sentence_embeddings", needs=("minilm_encoder",))
def sentence_embeddings(sentence_embedding, load_minilm):
    for case, X, m in _pool_cases():
        got = call(sentence_embedding, torch.tensor(X), torch.tensor(m), case=case)
        expect_shape(got, (X.shape[0], X.shape[2]), case=case,
                     hint=("one vector per sentence: (B, d)",))
        X64 = X.astype(np.float64)
        _match(got, _pool_expected(X64, m), case=case, rtol=1e-5, atol=1e-6,
               default=POOL_DEFAULT, mistakes=_pool_mistakes(X64, m), dtol=(1e-4, 1e-5))

    case = f"{len(SENTENCES)} sentences through your MiniLM, against sentence-transformers"
    encoder = _load_encoder(load_minilm, case)
    batch = oracles.tokens(SENTENCES)
    states = call(encoder, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                  case=case, time_limit=60)
    got = call(sentence_embedding, states, batch["attention_mask"], case=case)
    expect_close(got, oracles.reference_embeddings(SENTENCES), case=case, rtol=0, atol=1e-5,
                 hint=("your encoder's states differ from MiniLM's: run the check of "
                       "minilm_encoder",))


DEFAULTS = {"next_token_loss": [LOSS_DEFAULT], "sampling_distribution": [SAMPLE_DEFAULT],
            "top_p": [TOP_P_DEFAULT], "char_model": [CHAR_DEFAULT, CHAR_NAMES],
            "cached_generation": [GEN_DEFAULT], "training_loop": [TRAIN_DEFAULT, RETURN_WRONG],
            "minilm_encoder": [ENC_DEFAULT], "sentence_embeddings": [POOL_DEFAULT]}
