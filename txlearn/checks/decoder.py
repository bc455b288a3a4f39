"""Checks for lesson 10's exercises: the permutation between the two RoPE pairings (checked on
SmolLM2's own W_Q and W_K) and the model's KV-cache size read from its GGUF metadata.

Each check computes the right answer with :mod:`txlearn.models.gguf`, :mod:`txlearn.positional`
and :func:`txlearn.heads.kv_cache_bytes`; when the learner's answer differs, it is compared with
the catalogued mistakes (tests/catalogue/decoder.py) to choose the hint. The learner's functions
receive only NumPy arrays, ints and a dict of ints.
"""

import numpy as np
import torch

from txlearn.checks import (cache_shapes, call, diagnose, exercise, expect_close, expect_shape,
                            expect_true, method)
from txlearn.checks import decoder_references as R
from txlearn.heads import kv_cache_bytes
from txlearn.positional import apply_rope_np, half_to_interleaved, interleaved_to_half


# ---------------------------------------------------------------- exercise: rope_pairing_permutation

PERM_IDENTITY = ("did any column move?",
                 "nothing moved: within each head, the even channels 0, 2, 4, ... come first, "
                 "then the odd ones 1, 3, 5, ...")
PERM_WHOLE_WIDTH = ("each head is permuted on its own",
                    "permute within each head, not across the whole width: reshape to (d_in, "
                    "n_heads, d_k) first, so every head keeps its own d_k columns")
PERM_INVERSE = ("which way does the conversion go?",
                "that is the inverse (half to interleaved): the pair (2i, 2i+1) must land at "
                "(i, i + d_k/2), so new column i is old column 2i and new column i + d_k/2 is "
                "old column 2i+1")
PERM_ODD_FIRST = ("which channel of a pair comes first?",
                  "even channels first: new column i is old column 2i (the first of pair i), "
                  "new column i + d_k/2 is old column 2i+1")
PERM_ROWS = ("which axis of W holds the heads?",
             "W is (d_in, d_out), applied as x @ W: the output features, and so the heads, are "
             "its columns (axis 1), not its rows")
PERM_STRIDED_HEADS = ("how are the heads laid out in W's columns?",
                      "heads are contiguous blocks of d_k columns (head h = columns h*d_k .. "
                      "(h+1)*d_k - 1): reshape to (d_in, n_heads, d_k), not (d_in, d_k, n_heads)")


def _per_head(W, n_heads, f):
    d_in, width = W.shape
    return f(W.reshape(d_in, n_heads, width // n_heads)).reshape(d_in, width)


def _perm_mistakes(W, n_heads):
    d_in, width = W.shape
    d_k = width // n_heads
    odd_first = lambda h: np.concatenate([h[..., 1::2], h[..., 0::2]], -1)  # noqa: E731
    strided = interleaved_to_half(W.reshape(d_in, d_k, n_heads).swapaxes(1, 2))  # (d_in, n_heads, d_k)
    strided = strided.swapaxes(1, 2).reshape(d_in, width)
    mistakes = [(W, PERM_IDENTITY), (interleaved_to_half(W), PERM_WHOLE_WIDTH),
                (_per_head(W, n_heads, half_to_interleaved), PERM_INVERSE),
                (_per_head(W, n_heads, odd_first), PERM_ODD_FIRST), (strided, PERM_STRIDED_HEADS)]
    if d_in == width:
        mistakes.append((_per_head(W.T, n_heads, interleaved_to_half).T, PERM_ROWS))
    return mistakes


def _check_permutation(fn, W, n_heads, case):
    got = call(fn, W.copy(), n_heads, case=case,
               hint=("W is (d_in, n_heads * d_k): reorder its columns, head by head",))
    expect_shape(got, W.shape, case=case,
                 hint=("return an array of W's shape (d_in, n_heads * d_k)",))
    expected = _per_head(W, n_heads, interleaved_to_half)
    expect_close(got, expected, case=case, atol=0, rtol=0,
                 hint=diagnose(got, _perm_mistakes(W, n_heads), PERM_DEFAULT, rtol=0, atol=0))
    return got


PERM_DEFAULT = ("within each head, new column i is old column 2i and new column i + d_k/2 is old "
                "column 2i+1",)
KV_DEFAULT = ("bytes = 2 * layers * head_count_kv * d_k * context * bytes_per_value",)
# the hints given when no catalogued mistake is recognised (tests assert a mistake never gets them)
DEFAULTS = {"rope_pairing_permutation": [PERM_DEFAULT], "kv_cache_from_metadata": [KV_DEFAULT]}


@exercise("rope_pairing_permutation")
def rope_pairing_permutation(to_half_pairing):
    rows = np.arange(16.0)[:, None] * 100.0
    W = rows + np.arange(16.0)[None, :]              # W[r, c] = 100 r + c: every entry says where it was
    _check_permutation(to_half_pairing, W, 2, "2 heads of d_k = 8, W[r, c] = 100 r + c")

    from txlearn.models.gguf import read_config, read_tensor

    config = read_config()
    W_Q = read_tensor("blk.0.attn_q.weight").T.astype(np.float64)   # (d_model, n_heads * d_k)
    W_K = read_tensor("blk.0.attn_k.weight").T.astype(np.float64)   # (d_model, n_kv_heads * d_k)
    Q_half = _check_permutation(to_half_pairing, W_Q, config.n_heads, "SmolLM2 layer 0, W_Q with n_heads = 9")
    K_half = _check_permutation(to_half_pairing, W_K, config.n_kv_heads, "SmolLM2 layer 0, W_K with n_kv_heads = 3")

    # what the permutation is for: the same attention scores under the other pairing
    case = "SmolLM2 layer 0: scores q . k of head 0 at positions 0..5, half pairing on your weights"
    x = np.random.default_rng(10).normal(size=(6, config.d_model))
    d_k, base = config.d_k, config.rope_base

    def scores(W_q, W_k, pairing):
        q = apply_rope_np(x @ W_q[:, :d_k], None, pairing, base)    # head 0, (6, d_k)
        k = apply_rope_np(x @ W_k[:, :d_k], None, pairing, base)    # its KV head 0
        return q @ k.T                                            # (6, 6)

    expect_close(scores(Q_half, K_half, "half"), scores(W_Q, W_K, "interleaved"), case=case,
                 rtol=1e-9, atol=1e-9, hint=("the permuted weights must give the file's scores",))


# ---------------------------------------------------------------- exercise: kv_cache_from_metadata

KV_NO_TWO = ("what does a KV cache hold?", "cache both keys and values: a factor 2")
KV_QUERY_HEADS = ("how many heads have keys and values, and how wide is each?",
                  "your total caches embedding_length numbers per token and layer, as if every "
                  "query head had its own keys and values: only the key/value heads are cached "
                  "(llama.attention.head_count_kv of them), each d_k = embedding_length / head_count wide (d_k comes from the "
                  "query heads: dividing by head_count_kv makes each cached head head_count / "
                  "head_count_kv times too wide)")
KV_TRAINED_CONTEXT = ("how many tokens are cached?",
                      "use the `context` argument (the tokens actually cached), not the longest "
                      "context the model was trained for (llama.context_length)")
KV_BITS = ("check the unit of bytes_per_value",
           "bytes_per_value is already in bytes (bf16: 2): do not multiply by 8")
KV_MIB = ("check the unit of the result", "return bytes, not MiB or GiB (no division by 2**20)")
KV_HEAD_WIDTH = ("how wide is one key head?",
                 "d_k = embedding_length / head_count: each of the head_count_kv cached heads is "
                 "one head wide, not embedding_length wide")
KV_NO_LAYERS = ("how many caches does the model keep?",
                "every layer (llama.block_count of them) has its own cache")


def _kv_expected(meta, context, bytes_per_value, **override):
    sizes = dict(n_layers=meta["llama.block_count"], n_kv_heads=meta["llama.attention.head_count_kv"],
                 d_k=meta["llama.embedding_length"] // meta["llama.attention.head_count"],
                 context=context, dtype=bytes_per_value)
    sizes.update(override)
    return kv_cache_bytes(**sizes)


def _kv_mistakes(meta, context, b):
    right = _kv_expected(meta, context, b)
    return [(right / 2, KV_NO_TWO),
            (_kv_expected(meta, context, b, n_kv_heads=meta["llama.attention.head_count"]),
             KV_QUERY_HEADS),
            (_kv_expected(meta, meta["llama.context_length"], b), KV_TRAINED_CONTEXT),
            (right * 8, KV_BITS), (right / 2**20, KV_MIB), (right / meta["llama.block_count"],
                                                           KV_NO_LAYERS),
            (_kv_expected(meta, context, b, d_k=meta["llama.embedding_length"]), KV_HEAD_WIDTH)]


def _check_kv(fn, meta, context, b, case):
    got = call(fn, dict(meta), context, b, case=case)
    expect_close(got, _kv_expected(meta, context, b), case=case, rtol=0, atol=0.5,
                 hint=diagnose(got, _kv_mistakes(meta, context, b), KV_DEFAULT, rtol=1e-9,
                               atol=0.5))


@exercise("kv_cache_from_metadata")
def kv_cache_from_metadata(kv_cache_size):
    toy = {"general.architecture": "llama", "llama.block_count": 4, "llama.embedding_length": 96,
           "llama.attention.head_count": 6, "llama.attention.head_count_kv": 2,
           "llama.context_length": 500, "llama.feed_forward_length": 256,
           "llama.rope.dimension_count": 16}
    _check_kv(kv_cache_size, toy, 100, 2, "a toy model: 4 layers, d_model 96, 6 heads, 2 KV heads, 100 tokens, bf16")

    from txlearn.models.gguf import read_metadata

    meta = {k: v for k, v in read_metadata().items() if isinstance(v, int)}
    _check_kv(kv_cache_size, meta, 8192, 2, "SmolLM2-135M at 8192 tokens in bf16 (180 MiB)")
    _check_kv(kv_cache_size, meta, 1000, 4, "SmolLM2-135M at 1000 tokens in float32")


# ---------------------------------------------------------------- exercise: llama_attention

HALF_INTERLEAVED = ("which channels make a pair?",
                    "the half pairing rotates channel i with channel i + d/2 (first half with "
                    "second half), not the neighbours (2i, 2i+1) of set 04")
HALF_BASE = ("which base?", "use the `base` argument in theta_i = base^(-2i/d), not 10000")
HALF_SIGN = ("which way does the rotation turn?",
             "y_i = x_i cos - x_{i+h} sin and y_{i+h} = x_i sin + x_{i+h} cos: the minus sign is "
             "on the first half's line")
HALF_EXPONENT = ("how fast does each pair turn?",
                 "theta_i = base^(-2i/d) for i = 0 .. d/2 - 1: the exponent has 2i over the full "
                 "width d")
HALF_POSITIONS = ("which angle does each row get?",
                  "row t turns by positions[t] * theta_i: use the positions given, not 0 .. T-1")
HALF_DTYPE = ("keep the dtype of x", "compute the angles in float64, then cast cos and sin to "
              "x's dtype before multiplying")
HALF_FLOAT32_ANGLES = ("in which dtype are the angles?",
                       "compute theta and the angles in float64 and cast cos and sin to x's "
                       "dtype only at the end: your result matches angles computed in float32")
HALF_DEFAULT = ("h = d/2; y_i = x_i cos(m theta_i) - x_{i+h} sin(m theta_i), y_{i+h} = x_i "
                "sin(m theta_i) + x_{i+h} cos(m theta_i), theta_i = base^(-2i/d)",)
LLAMA_BIAS = ("which parameters does a Llama attention have?",
              "no biases: call your MultiHeadAttention's constructor with bias=False, so the "
              "state dict is W_Q, W_K, W_V, W_O only")
LLAMA_START = ("positions continue after the cache",
               "a cached step's rows sit at positions start .. start + L - 1: build the "
               "positions from the `start` your apply_positions receives")
LLAMA_OWN_BASE = ("which base does the module rotate with?",
                  "store rope_base in __init__ and pass it to rope_half: the model's base, not "
                  "10000")
LLAMA_Q_ONLY = ("RoPE rotates the queries and the keys",
                "return rope_half(Q, ...) and rope_half(K, ...): a score depends on m - n only "
                "when both sides turn")
LLAMA_K_ONLY = ("RoPE rotates the queries and the keys",
                "a score depends on m - n only when both sides turn: your apply_positions "
                "returned Q unrotated")
LLAMA_INTERLEAVED = ("which pairing does the module use?",
                     "rotate with your rope_half (channel i with i + d/2), not set 04's "
                     "interleaved apply_rope")
LLAMA_DEFAULT = ("apply_positions(Q, K, start): rope_half(Q, start .. start+L-1, rope_base) and "
                 "the same for K",)


def _rope_half_mistakes(x, positions, base):
    v = lambda **kw: (lambda: R.rope_half_ref(x, kw.pop("p", positions), kw.pop("b", base), **kw))  # noqa: E731
    return [(v(angles=torch.float32), HALF_FLOAT32_ANGLES),   # first: within 1e-6 of right
            (v(pairing="interleaved"), HALF_INTERLEAVED), (v(b=10000.0), HALF_BASE),
            (v(sign=-1.0), HALF_SIGN), (v(exponent=1.0), HALF_EXPONENT),
            (v(p=np.arange(len(positions))), HALF_POSITIONS)]


def _llama_attention_mistakes(state, x, n_heads, mask, q_rows, q_pos, k_pos, base, restarted=None):
    def v(**kw):
        return lambda: R.llama_attention_ref(state, x, n_heads, mask, q_rows, kw.pop("q", q_pos),
                                            kw.pop("k", k_pos), kw.pop("b", base), **kw)
    out = [(v(b=10000.0), LLAMA_OWN_BASE), (v(rot_k=False), LLAMA_Q_ONLY),
           (v(rot_q=False), LLAMA_K_ONLY),
           (v(pairing="interleaved"), LLAMA_INTERLEAVED),
           (v(pairing="interleaved", b=10000.0), LLAMA_INTERLEAVED)]
    if restarted is not None:
        out.insert(0, (v(q=np.arange(len(q_pos)), k=restarted), LLAMA_START))
    return out


@exercise("llama_attention", needs=("multi_head_attention",))
def llama_attention(rope_half, LlamaAttention):
    from txlearn.checks.modules import (F32, expect_cache, expect_dtype, expect_match,
                                        expect_shape_of, expect_tensor, load, make_module,
                                        mask_ref, mha_state, run)

    g = torch.Generator().manual_seed(10)
    cases = [("x (1, 2, 3, 8) float64, positions [0, 1, 2], base 500",
              torch.randn(1, 2, 3, 8, generator=g).double(), torch.arange(3), 500.0),
             ("x (2, 3, 4, 8) float32 (B, n_heads, T, d_k), positions [7, 8, 9, 10], base 100000",
              torch.randn(2, 3, 4, 8, generator=g), torch.arange(7, 11), 100000.0),
             ("x (2, 6) float64, positions [3, 0], base 10000", torch.randn(2, 6, generator=g).double(),
              torch.tensor([3, 0]), 10000.0)]
    for case, x, positions, base in cases:
        got = run(rope_half, x.clone(), positions.clone(), base, case=case)
        expect_tensor(got, case=case, hint=("return a torch tensor",))
        expect_shape_of(got, tuple(x.shape), case=case, hint=("the result has the shape of x",))
        expect_dtype(got, x.dtype, case=case, hint=HALF_DTYPE)
        tol = F32 if x.dtype == torch.float32 else {"rtol": 1e-7, "atol": 1e-9}
        mistakes = [m for m in _rope_half_mistakes(x.numpy(), positions.numpy(), base)
                    if not (base == 10000.0 and m[1] is HALF_BASE)]
        dtol = (1e-6, 1e-6) if x.dtype == torch.float64 else None   # float32 angles: ~1e-7
        expect_match(got, R.rope_half_ref(x.numpy(), positions.numpy(), base), case=case, **tol,
                     mistakes=mistakes, default=HALF_DEFAULT, dtol=dtol)

    base = 300.0
    raised = ((None, LLAMA_BIAS),)
    x = torch.randn(1, 6, 16, generator=g)
    pos = np.arange(6)
    for step, (lo, hi) in enumerate(((0, 6), (0, 4), (4, 5), (5, 6))):
        use_cache = step > 0
        case = (f"d_model=16, n_heads=4, n_kv_heads=2, rope_base={base:g}: " +
                ("positions 0-5 in one call, no cache" if not use_cache else
                 f"KV cache, step {step}: positions {lo}-{hi - 1}, mask causal_mask({hi - lo}, {hi})"))
        if step in (0, 1):
            m = make_module(LlamaAttention, 16, 4, 2, base, case=case, raised=raised)
            state = mha_state(16, 4, 2, False, 30)
            load(m, {k: torch.tensor(v, dtype=torch.float32) for k, v in state.items()}, case=case,
                 unexpected=LLAMA_BIAS, names=LLAMA_BIAS)
        mask = mask_ref(hi - lo, hi)
        got = run(m, x[:, lo:hi].clone(), mask=mask, use_cache=use_cache, case=case,
                  hint=LLAMA_DEFAULT)
        expect_shape_of(got, (1, hi - lo, 16), case=case, hint=("out has the shape of x",))
        restarted = np.concatenate([np.arange(lo), np.arange(hi - lo)]) if lo else None
        expect_match(got, R.llama_attention_ref(state, x[:, :hi].numpy(), 4, mask, slice(lo, hi),
                                               pos[lo:hi], pos[:hi], base),
                     case=case, **F32, default=LLAMA_DEFAULT,
                     mistakes=_llama_attention_mistakes(state, x[:, :hi].numpy(), 4, mask,
                                                        slice(lo, hi), pos[lo:hi], pos[:hi], base,
                                                        restarted))
        if use_cache:
            expect_cache(m, 1, 4, 2, hi, 4, case)


# ---------------------------------------------------------------- exercise: llama_decoder

LAYER_POST = ("where does the norm go in a Llama layer?",
              "pre-norm: h = x + Attn(RMSNorm_1(x)), y = h + SwiGLU(RMSNorm_2(h)); the residual "
              "stream itself is never normalised inside a layer")
LAYER_NO_RESIDUAL = ("what is added back?", "add each sub-layer's output to its input: "
                     "h = x + Attn(...), y = h + SwiGLU(...)")
LAYER_ONE_NORM = ("each sub-layer has its own norm",
                  "norm1 before the attention, norm2 before the FFN: their gains differ")
LAYER_FFN_ON_X = ("what does the FFN read?",
                  "the FFN reads RMSNorm_2(h), where h already holds the attention's output, "
                  "not RMSNorm_2(x)")
LAYER_NO_MASK = ("pass the mask on", "give the attention the layer's mask=: without it every "
                 "position sees the future")
LAYER_NAMES = ("which submodules does the layer have?",
               "norm1 (RMSNorm), attn (LlamaAttention), norm2 (RMSNorm), ffn (SwiGLU): the state "
               "dict is norm1.gamma, attn.W_Q .. attn.W_O, norm2.gamma, ffn.W_1, ffn.W_2, ffn.W_3")
LAYER_DEFAULT = ("h = x + Attn(RMSNorm_1(x), mask); y = h + SwiGLU(RMSNorm_2(h))",)
DEC_SCALED = ("is the embedding scaled?",
              "a Llama decoder embeds with W_E[ids] alone: no sqrt(d_model) factor (that was "
              "the paper's, in set 07)")
DEC_NO_FINAL_NORM = ("what comes before the head?", "the final RMSNorm (norm): logits = "
                     "RMSNorm(x_N) W_E^T")
DEC_HEAD_TRANSPOSED = ("which way round is the tied head?",
                       "W_E is (n_vocab, d_model): logits = RMSNorm(x_N) @ W_E.T, (B, T, d_model) "
                       "times (d_model, n_vocab)")
DEC_MASK = ("which mask does a cached step need?",
            "T new queries over start + T keys: causal_mask(T, start + T), bottom-right aligned "
            "(start = the positions already in the first layer's cache)")
DEC_NO_MASK = ("which mask does a call without the cache need?",
               "every call is causal: without use_cache the T ids attend under causal_mask(T, T) "
               "(start = 0); yours let them see the future")
DEC_CACHE_OFF = ("does the cache reach the layers?",
                 "pass use_cache to every layer, and read start from layers[0].attn.kv_cache only "
                 "when use_cache is true")
DEC_RESET = ("what does reset_cache empty?",
             "set every layer's attn.kv_cache to None, so the next cached call starts at "
             "position 0")
DEC_NAMES = ("which parameters does the decoder have?",
             "W_E (n_vocab, d_model), layers (an nn.ModuleList of DecoderLayer), norm (RMSNorm): "
             "no separate head matrix, the head is W_E itself")
DEC_DEFAULT = ("x_0 = W_E[ids]; n_layers pre-norm DecoderLayers under causal_mask(T, start + T); "
               "logits = RMSNorm(x_N) W_E^T",)


@exercise("llama_decoder", needs=("llama_attention", "rms_norm_module", "swiglu"))
def llama_decoder(DecoderLayer, Decoder):
    from txlearn.checks.modules import (F32, expect_match, expect_shape_of, load, make_module,
                                        mask_ref, run)

    # 1. one layer: B = 2, T = 5, d_model = 16, 4 heads, 2 KV heads, d_ff = 24
    case = "DecoderLayer(16, 4, 2, 24, eps=1e-5, rope_base=1000): x (2, 5, 16), causal mask"
    rng = np.random.default_rng(40)
    layer = make_module(DecoderLayer, 16, 4, 2, 24, 1e-5, 1000.0, case=case)
    state = R.layer_state(rng, 16, 4, 2, 24)
    load(layer, R.f32(state), case=case, names=LAYER_NAMES)
    x = torch.as_tensor(rng.normal(0, 1.0, (2, 5, 16)))
    mask = mask_ref(5, 5)
    got = run(layer, x.float(), mask=mask, case=case, hint=LAYER_DEFAULT)
    expect_shape_of(got, (2, 5, 16), case=case, hint=("out has the shape of x",))
    t = {k: torch.as_tensor(v) for k, v in state.items()}
    pos = np.arange(5)

    def lay(**kw):
        return lambda: R.layer_ref(t, "", x, 4, kw.pop("m", mask), slice(None), pos, pos, 1e-5,
                                  1000.0, **kw).numpy()
    expect_match(got, lay()(), case=case, **F32, default=LAYER_DEFAULT,
                 mistakes=[(lay(post=True), LAYER_POST), (lay(residual=False), LAYER_NO_RESIDUAL),
                           (lay(one_norm=True), LAYER_ONE_NORM), (lay(ffn_on_x=True), LAYER_FFN_ON_X),
                           (lay(m=torch.ones(5, 5, dtype=torch.bool)), LAYER_NO_MASK)])

    # 2. the decoder, no cache; a vocabulary as wide as the model, so a transposed head shows
    cfg = dict(n_vocab=24, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, eps=1e-5,
               rope_base=1000.0)
    case = "Decoder(n_vocab=24, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32): ids (2, 6)"
    model = make_module(Decoder, *R.decoder_args(cfg), case=case)
    state = R.decoder_state(cfg, 41)
    load(model, R.f32(state), case=case, names=DEC_NAMES)
    ids = torch.as_tensor(np.random.default_rng(42).integers(0, 24, (2, 6)))
    got = run(model, ids.clone(), case=case, hint=DEC_DEFAULT)
    expect_shape_of(got, (2, 6, 24), case=case, hint=("logits are (B, T, n_vocab)",))

    def dec(**kw):
        return lambda: R.decoder_ref(state, ids, cfg, **kw)
    expect_match(got, dec()(), case=case, rtol=1e-4, atol=1e-4, default=DEC_DEFAULT,
                 mistakes=[(dec(scaled=True), DEC_SCALED), (dec(final_norm=False), DEC_NO_FINAL_NORM),
                           (dec(head_t=True), DEC_HEAD_TRANSPOSED), (dec(post=True), LAYER_POST),
                           (dec(causal=False), DEC_NO_MASK)])

    # 3. the cache: 5 positions, then 1, then 2; n_vocab != d_model
    cfg = dict(cfg, n_vocab=40)
    model = make_module(Decoder, *R.decoder_args(cfg), case="Decoder(n_vocab=40, d_model=24, ...)")
    state = R.decoder_state(cfg, 43)
    load(model, R.f32(state), case="Decoder(n_vocab=40, d_model=24, ...)", names=DEC_NAMES)
    ids = torch.as_tensor(np.random.default_rng(44).integers(0, 40, (1, 8)))
    full = R.decoder_ref(state, ids, cfg)                                      # (1, 8, 40)
    for repeat in range(2):
        if repeat:
            run(method(model, "reset_cache"), case="reset_cache() after a cached sequence",
                hint=DEC_RESET)
        for lo, hi in ((0, 5), (5, 6), (6, 8)):
            case = (f"{'after reset_cache(), ' if repeat else ''}use_cache=True, ids at positions "
                    f"{lo}-{hi - 1} of 8 (n_vocab=40)")
            raised = ((None, DEC_RESET),) if repeat else (("shape", DEC_MASK), ("size", DEC_MASK))
            got = run(model, ids[:, lo:hi].clone(), use_cache=True, case=case, hint=DEC_DEFAULT,
                      raised=raised)
            expect_shape_of(got, (1, hi - lo, 40), case=case, hint=("logits are (B, T, n_vocab)",))
            restarted = R.decoder_ref(state, ids[:, lo:hi], cfg)                # positions from 0
            expect_match(got, full[:, lo:hi], case=case, rtol=1e-4, atol=1e-4,
                         default=DEC_RESET if repeat and lo == 0 else DEC_DEFAULT,
                         mistakes=[(restarted, DEC_CACHE_OFF)])


# ---------------------------------------------------------------- exercise: smollm2_decoder

LOAD_UNPERMUTED = ("which RoPE pairing do the file's W_Q and W_K expect?",
                   "the file's attn_q and attn_k are for the interleaved pairing and your "
                   "attention rotates the half pairs: pass both through your to_half_pairing "
                   "(exercise 1) after transposing them")
LOAD_K_HEADS = ("how many heads does W_K have?",
                "W_K is (d_model, n_kv_heads * d_k) = (576, 192): permute it with n_kv_heads = 3, "
                "W_Q with n_heads = 9")
LOAD_GATE_UP = ("which SwiGLU matrix is the gate?",
                "ffn_gate is the matrix inside SiLU: your W_3 (set 05); ffn_up is W_1, the one "
                "that multiplies the gated output; ffn_down is W_2")
LOAD_EPS = ("which epsilon does the model's RMSNorm use?",
            "the file's llama.attention.layer_norm_rms_epsilon (1e-5): pass it to your Decoder, "
            "not RMSNorm's default 1e-6")
LOAD_BASE = ("which RoPE base does SmolLM2 use?",
             "the file's llama.rope.freq_base, passed to your Decoder as rope_base, not 10000")
LOAD_TRANSPOSE = ("which layout does the file store?",
                  "the file's matrices are (d_out, d_in) and yours (d_in, d_out): transpose EVERY "
                  "matrix, the square W_Q and W_O too (their shapes match either way)")
LOAD_W_O = ("which layout does the file store?",
            "attn_output is (d_out, d_in) like every matrix of the file: your W_O is the only one "
            "left as stored (it is square, so its shape matched); transpose it too")
LOAD_NORMS = ("which norm is which?", "attn_norm is the gain of norm1 (before the attention), "
              "ffn_norm the gain of norm2 (before the FFN)")
LOAD_RAISED = ("which layout does the file store?",
               "read_tensor gives matrices as (d_out, d_in): transpose them to your (d_in, "
               "d_out); the embedding token_embd (n_vocab, d_model) is not transposed; fill every "
               "parameter of your Decoder once (load_state_dict is strict)")
LOAD_DEFAULT = ("build Decoder from the metadata; fill W_E, every layer's norms, W_Q, W_K "
                "(transposed, then to_half_pairing), W_V, W_O, W_1 (up), W_2 (down), W_3 (gate) "
                "and norm.gamma",)
GEN_RESET = ("start a new sequence", "empty the model's caches (its reset_cache method) at the "
             "start of generate_greedy: a second call otherwise continues after the first one's "
             "tokens")
GEN_REFEED = ("what does a cached step run?",
              "with the cache, run the prompt once, then only the newest id ((1, 1)): running "
              "the whole sequence again stores every position a second time")
GEN_NOT_CACHED_EQUAL = ("cached and uncached generation must agree",
                        "with use_cache=False run the whole sequence each step (no cache); with "
                        "use_cache=True the prompt once, then the newest id")
GEN_DEFAULT = ("each step: the logits of the LAST position, their argmax appended",)
SLOW = ("how long does your forward take?",
        "in the grader your code has one thread: a forward over 150 tokens of SmolLM2 takes "
        "about a second with matrix products on whole tensors; look for a Python loop over "
        "positions, heads or vocabulary entries, or the model built again for every call")


def _raised_load():
    return (("to_half_pairing", LOAD_K_HEADS), ("reshape", LOAD_K_HEADS),
            ("size mismatch", LOAD_RAISED), ("Missing key", LOAD_RAISED),
            ("Unexpected key", LOAD_RAISED), ("shape", LOAD_RAISED), (None, LOAD_RAISED))


def _longest_cache(model, case) -> int:
    """The most positions any (B, n_kv_heads, S, d_k) tensor of the model's caches holds."""
    held = cache_shapes(model, case=case)
    return max((shape[2] for pair in held for shape in pair if len(shape) == 4), default=0)


@exercise("smollm2_decoder", needs=("llama_decoder", "rope_pairing_permutation"))
def smollm2_decoder(generate_greedy, load_smollm2):
    from txlearn.checks import decoder_oracles as oracle
    from txlearn.checks.modules import expect_match, expect_shape_of, guarded, run

    case = "load_smollm2() on the course's GGUF file"
    model = guarded(call, load_smollm2, case=case, time_limit=120, raised=_raised_load(),
                    hint=SLOW)

    ids = oracle.text_ids()
    T = ids.shape[1]
    case = f"your model on {T} tokens of English text (float32), every logit against transformers'"
    got = run(model, ids.clone(), case=case, time_limit=120, hint=SLOW)
    expect_shape_of(got, (1, T, 49152), case=case, hint=("logits are (B, T, n_vocab)",))
    hints = {"unpermuted": LOAD_UNPERMUTED, "gate and up swapped": LOAD_GATE_UP,
             "eps default": LOAD_EPS, "base 10000": LOAD_BASE,
             "square not transposed": LOAD_TRANSPOSE, "W_O not transposed": LOAD_W_O,
             "norms swapped": LOAD_NORMS}
    expect_match(got, oracle.logits()[None], case=case, rtol=0, atol=1e-3, dtol=(0, 1e-2),
                 default=LOAD_DEFAULT,
                 mistakes=[(lambda v=v: oracle.logits(v)[None], hints[v]) for v in oracle.VARIANTS])

    prompt = oracle.chat_prompt()
    want = oracle.greedy()
    T0, n, short = len(prompt), oracle.N_NEW, oracle.N_SHORT
    for steps in (short, n):   # the short call first: a loop that feeds the whole sequence again
        case = (f"generate_greedy(model, the chat prompt ({T0} tokens), {steps}), "  # each step
                f"use_cache=True")                      # stores it again, and is slow to run long
        got = run(generate_greedy, model, prompt.clone(), steps, use_cache=True, case=case,
                  time_limit=120, hint=SLOW)
        expect_shape_of(got, (T0 + steps,), case=case,
                        hint=("prompt and new ids, (T0 + n_new,)",))
        longest = _longest_cache(model, case)           # read before comparing the ids
        expect_true(longest <= T0 + steps, case=case, hint=GEN_RESET if steps == n else GEN_REFEED,
                    message=f"after the call your caches hold {longest} positions; the prompt and "
                            f"{steps} new tokens are {T0 + steps}")
        expect_match(got, want[:T0 + steps], case=case, rtol=0, atol=0, default=GEN_DEFAULT,
                     mistakes=[(lambda k=steps: oracle.greedy_refeeding(k), GEN_REFEED)])
    case = (f"generate_greedy(model, the chat prompt, {short}), use_cache=True, after a cached "
            f"call of your model on 40 other tokens")
    run(model, torch.arange(100, 140)[None], use_cache=True, case=case, hint=SLOW)
    got = run(generate_greedy, model, prompt.clone(), short, use_cache=True, case=case,
              time_limit=120, hint=SLOW)
    longest = _longest_cache(model, case)
    expect_true(longest <= T0 + short, case=case, hint=GEN_RESET,
                message=f"after the call your caches hold {longest} positions; a new sequence of "
                        f"{T0} + {short} tokens holds at most {T0 + short}")
    expect_match(got, want[:T0 + short], case=case, rtol=0, atol=0, default=GEN_DEFAULT,
                 mistakes=[(lambda: oracle.greedy_without_reset(short), GEN_RESET)])
    case = (f"generate_greedy(model, the chat prompt, {short}, use_cache=False): equal to the "
            f"cached ids")
    got = run(generate_greedy, model, prompt.clone(), short, use_cache=False, case=case,
              time_limit=120, hint=SLOW)
    expect_match(got, want[:T0 + short], case=case, rtol=0, atol=0, default=GEN_NOT_CACHED_EQUAL)


DEFAULTS.update({"llama_attention": [HALF_DEFAULT, LLAMA_DEFAULT],
                 "llama_decoder": [LAYER_DEFAULT, DEC_DEFAULT],
                 "smollm2_decoder": [LOAD_DEFAULT, GEN_DEFAULT, GEN_NOT_CACHED_EQUAL]})
