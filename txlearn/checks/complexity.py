"""Checks for lesson 08's exercises: the FLOPs of attention and one online-softmax update step.

Each check computes the right answer itself and, when the learner's answer differs, compares it
with the catalogued mistakes (tests/catalogue/complexity.py) to choose the hint. The most
diagnostic case runs first.
"""

import numpy as np

from txlearn.checks import as_array, call, diagnose, expect_close, expect_shape, expect_true, exercise
from txlearn.counting import attention_flops as _attention_flops
from txlearn.flash_attention import online_softmax_update_np, tiled_attention_np

# ---------------------------------------------------------------- exercise: attention_flops

MACS = ("what does one multiply-accumulate cost in FLOPs?",
        "you counted multiply-accumulates: a product of (m, k) and (k, n) matrices costs m k n "
        "MACs but 2 m k n FLOPs (one multiply and one add each)")
NO_SCORES = ("attention has two T x T products",
             "you left out one of the T x T products: the scores Q K^T cost 2 T^2 d_model FLOPs, "
             "and the weighted sum A V another 2 T^2 d_model")
NO_T2 = ("what grows as T^2 in attention?",
         "you counted only the four projections; the scores Q K^T and the weighted sum A V add "
         "2 T^2 d_model FLOPs each")
NO_PROJECTIONS = ("what does attention compute before and after the T x T products?",
                  "you counted only the T x T products; the projections W_Q, W_K, W_V, W_O cost 2"
                  " T d_model^2 FLOPs each")
ONE_HEAD_ONLY = ("all heads together: how wide are they?",
                 "you counted the scores and weighted sum of a single head (width d_k); all "
                 "n_heads heads together cost 2 T^2 (n_heads d_k) = 2 T^2 d_model each")
TIMES_HEADS = ("do more heads cost more FLOPs at the same d_model?",
               "n_heads heads of width d_k = d_model / n_heads cost what one head of width "
               "d_model costs: do not multiply by n_heads")
NO_W_O = ("count every projection of the attention sub-layer",
          "attention has four projections: W_Q, W_K, W_V and the output projection W_O")


DEFAULT_FLOPS = ("projections 4 x 2 T d_model^2, scores 2 T^2 d_model, weighted sum 2 T^2 d_model"
                 " (FLOPs = 2 x multiply-accumulates)",)
DEFAULT_UPDATE = ("m' = max(m, max s), alpha = exp(m - m'), l' = alpha l + sum p, acc' = alpha "
                  "acc + p V",)
# the hints given when no catalogued mistake is recognised (tests assert a mistake never gets them)
DEFAULTS = {"attention_flops": [DEFAULT_FLOPS], "online_softmax_update": [DEFAULT_UPDATE],
            "tiled_attention": []}


def _flop_wrongs(T, d, h):
    right = 8 * T * d * d + 4 * T * T * d
    d_k = d // h
    return [(right // 2, MACS), (8 * T * d * d + 2 * T * T * d, NO_SCORES),
            (8 * T * d * d, NO_T2), (4 * T * T * d, NO_PROJECTIONS),
            (8 * T * d * d + 4 * T * T * d_k, ONE_HEAD_ONLY), (h * right, TIMES_HEADS),
            (8 * T * d * d + 4 * T * T * d * h, TIMES_HEADS), (6 * T * d * d + 4 * T * T * d, NO_W_O),
            (4 * T * d * d + 2 * T * T * d_k, MACS)]


@exercise("attention_flops")
def attention_flops(attention_flops):
    for T, d_model, n_heads in ((10, 8, 4), (1000, 64, 8), (3, 96, 12)):
        case = f"T={T}, d_model={d_model}, n_heads={n_heads}"
        got = call(attention_flops, T, d_model, n_heads, case=case)
        expect_true(isinstance(got, (int, np.integer)) and not isinstance(got, bool), case=case,
                    message=f"expected an int, got {type(got).__name__}",
                    hint=("a FLOP count is a whole number",
                          "use integer arithmetic (// rather than /)"))
        expected = _attention_flops(T=T, d_model=d_model, n_heads=n_heads)
        hint = DEFAULT_FLOPS
        for wrong, wrong_hint in _flop_wrongs(T, d_model, n_heads):
            if got == wrong:
                hint = wrong_hint
                break
        expect_true(got == expected, case=case, message=f"got {got:,}, expected {expected:,}",
                    hint=hint)


# ---------------------------------------------------------------- exercise: online_softmax_update

NO_RESCALE_SUM = ("the old sum was computed against the old maximum",
                  "rescale the old sum to the new max before adding the block: l' = exp(m - m') l"
                  " + sum_j exp(s_j - m')")
NO_RESCALE_ACC = ("the old output was computed against the old maximum",
                  "rescale the old output to the new max before adding the block: acc' = exp(m - "
                  "m') acc + p @ V")
NO_RESCALE = ("what happens to earlier terms when the running maximum grows?",
              "the old sum and output were computed against the old max m: multiply both by alpha"
              " = exp(m - m') before adding the new block")
ALPHA_INVERTED = ("the rescaling factor is at most 1",
                  "alpha = exp(m - m') (old minus new, at most 1); yours is exp(m' - m)")
OLD_MAX = ("which maximum do the new terms use?",
           "use the new max m' = max(m, max_j s_j) in p_j = exp(s_j - m'), and return it as the "
           "new running max")
BLOCK_MAX_ONLY = ("the running max runs over every key seen so far",
                  "m' = max(m, max_j s_j): the old max m takes part; yours took the block's max "
                  "alone, so m' can fall below m and alpha exceed 1")
GLOBAL_MAX = ("each query's row keeps its own running maximum: whose maximum do you take?",
              "m' = max(m, max_j s_j) is one number per query, (L,): take the block's max along "
              "the keys (axis=-1), not the max of the whole block; one maximum for every row "
              "makes a row of small scores underflow to exp(-1000) = 0")
NORMALISED = ("when does the division by the sum happen?",
              "keep acc unnormalised (sum_j exp(s_j - m') v_j); divide by l only once, after the "
              "last block")
NAN_GUARD = ("what is exp(-inf - (-inf))?",
             "while every key so far is masked, m' = -inf and exp(-inf - (-inf)) is NaN: subtract"
             " 0 instead of m' where m' is -inf, so the block adds nothing and l stays 0")


def _update_variants(m, l, acc, s, V):
    with np.errstate(all="ignore"):  # some mistakes give inf or NaN; the check prints nothing
        return _variants(m, l, acc, s, V)


def _variants(m, l, acc, s, V):
    m_new = np.maximum(m, s.max(axis=-1))
    alpha, p = np.exp(m - m_new), np.exp(s - m_new[:, None])
    l_right, acc_right = alpha * l + p.sum(-1), alpha[:, None] * acc + p @ V
    p_old = np.exp(s - m[:, None])
    m_block = s.max(axis=-1)                               # the block's max alone
    alpha_b, p_b = np.exp(m - m_block), np.exp(s - m_block[:, None])
    m_all = np.maximum(m, s.max())                         # one max for every row
    alpha_g, p_g = np.exp(m - m_all), np.exp(s - m_all[:, None])
    return [
        ((m_all, alpha_g * l + p_g.sum(-1), alpha_g[:, None] * acc + p_g @ V), GLOBAL_MAX),
        ((m_block, alpha_b * l + p_b.sum(-1), alpha_b[:, None] * acc + p_b @ V), BLOCK_MAX_ONLY),
        ((m_new, l + p.sum(-1), acc + p @ V), NO_RESCALE),
        ((m_new, l + p.sum(-1), acc_right), NO_RESCALE_SUM),
        ((m_new, l_right, acc + p @ V), NO_RESCALE_ACC),
        ((m_new, l / alpha + p.sum(-1), acc / alpha[:, None] + p @ V), ALPHA_INVERTED),
        ((m, l + p_old.sum(-1), acc + p_old @ V), OLD_MAX),
        ((m_new, l_right, acc_right / l_right[:, None]), NORMALISED),
    ]


def _matches(got, wrong):
    try:  # equal_nan: a mistake that gives NaN is matched by the same NaN
        return all(np.allclose(np.asarray(g, dtype=np.float64), w, rtol=1e-6, atol=1e-9,
                               equal_nan=True)
                   for g, w in zip(got, wrong))
    except (TypeError, ValueError):
        return False


def _cases():
    rng = np.random.default_rng(0)
    V = rng.normal(size=(3, 2))
    yield ("a block with a larger max than the running one",
           np.array([0.0, 2.0]), np.array([1.5, 2.5]), np.array([[1.0, -2.0], [0.5, 3.0]]),
           np.array([[4.0, 1.0, -1.0], [0.0, 1.5, -3.0]]), V)
    yield ("the first block (m = -inf, l = 0, acc = 0)",
           np.full(2, -np.inf), np.zeros(2), np.zeros((2, 2)),
           np.array([[1.0, 2.0, 3.0], [-1.0, -np.inf, 0.5]]), V)
    yield ("a block whose keys are all masked (-inf), every key so far masked too",
           np.array([-np.inf, 1.0]), np.array([0.0, 2.0]), np.array([[0.0, 0.0], [1.0, 1.0]]),
           np.full((2, 3), -np.inf), V)


@exercise("online_softmax_update")
def online_softmax_update(online_update):
    for case, m, l, acc, s, V in _cases():
        got = call(online_update, m.copy(), l.copy(), acc.copy(), s.copy(), V.copy(), case=case)
        expect_true(isinstance(got, (tuple, list)) and len(got) == 3, case=case,
                    message=f"expected a tuple (m, l, acc), got {type(got).__name__}",
                    hint=("return three things: the new running max, sum and output",))
        right = online_softmax_update_np(m, l, acc, s, V)
        hint = DEFAULT_UPDATE
        if case.startswith("a block whose"):
            hint = NAN_GUARD
        else:
            for wrong, wrong_hint in _update_variants(m, l, acc, s, V):
                if _matches(got, wrong):
                    hint = wrong_hint
                    break
        for name, g, e in zip(("running max m", "running sum l", "output acc"), got, right):
            expect_close(g, e, case=f"{case}, {name}", rtol=1e-9, atol=1e-12, hint=hint)


# ---------------------------------------------------------------- exercise: tiled_attention

TILE_NOT_NORMALISED = ("the running output is unnormalised",
                       "after the last block divide the running output by the running sum (acc / "
                       "l); you returned acc itself")
TILE_M_ZERO = ("what may the running maximum start at?",
               "start the running max at minus infinity: starting at 0 makes exp(s - 0) underflow "
               "to 0 when every score is far below 0, and the output is lost")
TILE_LAST_BLOCK = ("does every key land in some block?",
                   "when S is not a multiple of block_size the last block is shorter: keep it "
                   "(your loop stops before it)")
TILE_NO_SCALE = ("the scores are too large: what keeps their variance at 1?",
                 "divide each block's scores by sqrt(d_k)")
TILE_EMPTY_NAN = ("what should a query with no visible key return?",
                  "a query whose keys are all hidden ends with l = 0: its output is 0, so divide "
                  "only where l > 0")
TILE_MASK_BLOCK = ("which columns of the mask belong to this block?",
                   "slice the mask's columns with the block's keys (start to stop), as you slice K "
                   "and V")
TILE_BIG_NEGATIVE = ("what score does a hidden key get?",
                     "-inf, not a large negative number: with -1e9 a query that sees no key "
                     "still sums exp(0) over its hidden keys and averages their values instead "
                     "of returning 0")
TILE_MASK_INVERTED = ("which keys does the mask hide?",
                      "True = may attend: a key keeps its score where the mask is True and gets "
                      "-inf where it is False; yours hides the keys the mask allows")
TILE_GLOBAL_MAX = ("each query's row keeps its own running maximum: whose maximum do you take?",
                   "take each block's max along the keys (axis=-1), one per query, not the max of "
                   "the whole block: with one maximum for every row, a query whose scores are far "
                   "below another's underflows to exp(-1000) = 0 and loses its output")
TILE_DEFAULT = ("the result must equal ordinary attention: softmax(Q K^T / sqrt(d_k)) V with hidden "
                "keys left out, whatever the block size",)
DEFAULTS["tiled_attention"] = [TILE_DEFAULT]


def _tiled_variants(Q, K, V, mask, block_size):
    """What each catalogued mistake computes on these inputs (float64, for diagnose)."""
    L, d_k = Q.shape
    S = K.shape[0]

    def run(scale=True, m0=-np.inf, last=True, normalise=True, guard=True, mask_cols=True,
            fill=-np.inf, invert=False, global_max=False):
        m, l = np.full(L, m0), np.zeros(L)
        acc = np.zeros((L, V.shape[1]))
        stops = range(0, S, block_size) if last else range(0, S - block_size + 1, block_size)
        for start in stops:
            stop = min(start + block_size, S)
            s = Q @ K[start:stop].T / (np.sqrt(d_k) if scale else 1.0)
            if mask is not None:
                cols = mask[:, start:stop] if mask_cols else mask[:, :stop - start]
                cols = ~cols if invert else cols
                s = np.where(cols, s, fill)
            if global_max:  # one running max for every row: the shift of the block's maximum
                m_all = np.full(L, max(m.max(), s.max()))
                shift = np.where(np.isfinite(m_all), m_all, 0.0)
                p = np.exp(s - shift[:, None])
                l, acc = np.exp(m - shift) * l + p.sum(-1), np.exp(m - shift)[:, None] * acc + p @ V[start:stop]
                m = m_all
            else:
                m, l, acc = online_softmax_update_np(m, l, acc, s, V[start:stop])
        if not normalise:
            return acc
        if not guard:
            return acc / l[:, None]
        return np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1.0)[:, None], 0.0)

    with np.errstate(all="ignore"):
        return [(lambda: run(normalise=False), TILE_NOT_NORMALISED),
                (lambda: run(fill=-1e9), TILE_BIG_NEGATIVE),
                (lambda: run(m0=0.0), TILE_M_ZERO),
                (lambda: run(last=False), TILE_LAST_BLOCK),
                (lambda: run(scale=False), TILE_NO_SCALE),
                (lambda: run(guard=False), TILE_EMPTY_NAN),
                (lambda: run(mask_cols=False), TILE_MASK_BLOCK),
                (lambda: run(invert=True), TILE_MASK_INVERTED),
                (lambda: run(global_max=True), TILE_GLOBAL_MAX)]


def _hidden_blocks():
    """A mask whose first block (keys 0-1) is hidden from every query: the running maximum stays
    -inf through a whole block before the first visible key arrives (query 1), a query sees one
    key only (query 0), and one sees none (query 2)."""
    mask = np.zeros((3, 7), bool)
    mask[0, 4] = True
    mask[1, 2:] = True
    return mask


@exercise("tiled_attention", needs=("online_softmax_update",))
def tiled_attention(tiled_attention):
    rng = np.random.default_rng(8)
    Q, K, V = rng.normal(size=(3, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 2))
    far = np.vstack([Q[:2], -40.0 * K[:1] / np.linalg.norm(K[0]) ** 2 * 4])  # query 2: scores ~ -80
    mask = np.ones((3, 7), bool)
    mask[1, :] = False                     # query 1 sees no key
    mask[0, 5] = False
    cases = [("S = 7 keys in blocks of 3 (the last block is shorter), query 1 sees no key, "
              "query 2's scores near -80", far, K, V, mask, 3),
             ("no mask, blocks of 2, scores near -900 for every key", -30.0 * np.ones((2, 4)),
              30.0 * np.ones((5, 4)), rng.normal(size=(5, 3)), None, 2),
             ("one block holding every key (block_size 16 >= S)", Q, K, V, None, 16),
             ("blocks of 2; the first block hidden from every query, query 0 sees only key 4, "
              "query 2 sees nothing", Q, K, V, _hidden_blocks(), 2),
             ("rows of very different scale: query 0's scores [0, 0, 0], query 1's [0, 500, "
              "1000], blocks of 2", np.array([[0.0], [1000.0]]), np.array([[0.0], [0.5], [1.0]]),
              np.eye(3), None, 2)]
    for case, q, k, v, msk, block in cases:
        got = call(tiled_attention, q.copy(), k.copy(), v.copy(),
                   None if msk is None else msk.copy(), block, case=case)
        right = tiled_attention_np(q, k, v, msk, block_size=block)
        expect_shape(got, right.shape, case=case, hint=("the output has one row per query and "
                                                        "d_v columns: (L, d_v)",))
        g = as_array(got, np.float64)
        hint = TILE_EMPTY_NAN if g is not None and np.isnan(g).any() and msk is not None else \
            diagnose(g, _tiled_variants(q, k, v, msk, block), TILE_DEFAULT, atol=1e-9)
        expect_close(g, right, case=case, rtol=1e-9, atol=1e-12, hint=hint)
