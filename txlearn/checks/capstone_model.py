"""What set 09's checks of the learner's character model compare with (char_model,
cached_generation, and the models training_loop starts from): the course's CharTransformer
(:class:`txlearn.models.char_lm.CharTransformer`) with chosen weights and its state dict in the
learner's names, its logits with and without a KV cache and with each catalogued mistake, the
reference generation, and the hints aimed at each mistake (``tests/catalogue/capstone.py``).

The weights are drawn from generators of their own, never torch's global one: the grader checks
several submissions at once, one thread each, and a seeded draw on the shared generator took
draws another student's check made in between.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from txlearn.checks import (CheckFailure, as_array, construct, expect_shape, expect_true,
                            load_state, state_shapes)
from txlearn.checks.modules import rehint

__all__ = ["CHAR_SIZES", "UNTIED", "NO_FINAL_NORM", "NO_POSITIONS", "POS_BY_ID", "NOT_REPLACED",
           "TABLE_NAME", "CHAR_NAMES", "NO_CAUSAL", "MASK_INVERTED", "POST_LN", "SCALED",
           "POS_NOT_OFFSET", "MASK_TOP_LEFT", "NO_MASK_CACHED", "CACHE_IGNORED", "CACHE_RAISED",
           "CHAR_DEFAULT", "char_reference", "char_logits", "build_char", "FIRST_POSITION",
           "NOT_RESET", "WHOLE_WITH_CACHE", "PROMPT_SKIPPED", "NEW_GENERATOR", "IGNORES_FILTERS",
           "ALWAYS_GREEDY", "NO_PROMPT", "GEN_DEFAULT", "ref_generate", "expect_ids", "course_init"]


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
SINUSOID_TOO = ("how many position tables does the model add?",
                "one: the learned W_pos replaces set 07's sinusoidal table; yours adds the "
                "sinusoidal table as well")
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


def char_reference(seed: int = 0, sizes=None, e_scale: float = 1.0):
    """The course's CharTransformer (float32) with random weights large enough that every part
    matters (the token table ~ N(0, e_scale^2)), and its state dict in the learner's names."""
    from txlearn.models.char_lm import CharTransformer

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


def char_logits(ref, ids, prefix=None, *, mask="causal", pos_start=None, positions=True,
                final_norm=True, norm_first=True, scale=1.0, pos_by_id=False, sinusoid=False):
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
        if sinusoid:   # set 07's table as well (a CharEmbedding built on TokenEmbedding)
            from txlearn.positional import sinusoidal_encoding_np
            table = sinusoidal_encoding_np(first + T, x.shape[-1])[first:]
            x = x + torch.as_tensor(table, dtype=x.dtype)
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
            raise rehint(err, NOT_REPLACED) from None
        if any(not k.startswith("embed.") and tuple(shapes[k]) in (table, table[::-1])
               for k in extra):
            raise rehint(err, UNTIED) from None
        if "embed.W_pos" in missing and not any(tuple(shapes[k]) == positions for k in extra):
            raise rehint(err, NO_POSITIONS) from None
        if "embed.W_E" in missing and any(k.startswith("embed.") and tuple(shapes[k]) == table
                                          for k in extra):
            raise rehint(err, TABLE_NAME) from None
        if "norm.gamma" in missing and not any(k.startswith("norm") for k in extra):
            raise rehint(err, NO_FINAL_NORM) from None
        raise rehint(err, CHAR_NAMES) from None


def build_char(CharModel, state, case, sizes=None):
    s = dict(CHAR_SIZES, **(sizes or {}))
    model = construct(CharModel, s["n_vocab"], s["d_model"], s["n_heads"], s["d_ff"],
                      s["n_layers"], s["block_size"], case=case)
    _load_char(model, state, case)
    return model


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


def ref_generate(ref, prompt, n_new, temperature=0.0, top_k=None, top_p=None, seed=0, *,
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


def expect_ids(got, expected, *, case, mistakes, default, n_prompt=3):
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


def course_init(n_vocab, sizes):
    """The course's initialisation of CharTransformer (seed 0) in the learner's names."""
    from txlearn.models.char_lm import CharTransformer

    ref = CharTransformer(n_vocab, sizes["d_model"], sizes["n_heads"], sizes["n_layers"],
                          sizes["d_ff"], sizes["block_size"])
    _seeded_init(ref, 0)
    return ref, _learner_state(ref)
