"""What set 09's checks of the learner's MiniLM encoder and sentence embeddings compare with
(minilm_encoder, sentence_embeddings in :mod:`txlearn.checks.capstone`): the sentences, the
encoder cases against the course's own all-MiniLM-L6-v2 and its catalogued variants (cached in
:mod:`txlearn.checks.capstone_oracles`), the pooling references and mistakes, and the hints.
"""

from __future__ import annotations

import numpy as np

from txlearn.checks import as_array, call, construct, expect_shape
from txlearn.checks import capstone_oracles as oracles
from txlearn.checks.modules import expect_match

__all__ = ["ONE_SENTENCE", "PADDED", "ENC_HINTS", "ENC_RAISED", "ENC_DEFAULT", "ENC_LOADER",
           "encoder_case", "load_encoder", "SENTENCES", "POOL_PADDING", "POOL_CLS", "POOL_MAX",
           "NO_NORMALISE", "NORMALISE_TOKENS", "NORMALISE_AXIS", "POOL_DEFAULT", "pool_mistakes",
           "pool_expected", "pool_cases"]


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


def encoder_case(encoder, sentences, case, variants):
    batch = oracles.tokens(sentences)
    got = call(encoder, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
               case=case, time_limit=60)
    B, T = batch["input_ids"].shape
    expect_shape(got, (B, T, 384), case=case, hint=("token states are (B, T, d_model)",))
    real = batch["attention_mask"].numpy()[..., None].astype(np.float64)   # (B, T, 1)
    g = as_array(got, np.float64)
    expect_match(g * real, oracles.encoder_states(sentences) * real, case=case, rtol=1e-4,
                 atol=1e-4, default=ENC_DEFAULT, dtol=(1e-4, 1e-4),
                 mistakes=[(lambda v=v: oracles.encoder_states(sentences, v) * real, ENC_HINTS[v])
                           for v in variants])


def load_encoder(load_minilm, case):
    from txlearn.models.minilm_files import model_dir
    return construct(load_minilm, str(model_dir()), case=case, time_limit=60, hint=ENC_RAISED)


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


def pool_mistakes(X, m):
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


def pool_expected(X, m):
    w = m[:, :, None].astype(np.float64)
    u = (X * w).sum(1) / w.sum(1)
    return u / np.linalg.norm(u, axis=-1, keepdims=True)


def pool_cases():
    rng = np.random.default_rng(11)
    X = rng.normal(size=(2, 4, 3))
    X[0, 3], X[1, 2:] = 50.0, -80.0                         # large padding rows
    yield "B = 2, T = 4, d = 3, lengths [3, 2], padding rows large", X, np.array(
        [[1, 1, 1, 0], [1, 1, 0, 0]])
    X = rng.normal(size=(3, 5, 4)) + 1.0
    yield "B = 3, T = 5, d = 4, no padding", X, np.ones((3, 5), dtype=np.int64)
    X = (rng.normal(size=(2, 6, 8)) * 3).astype(np.float32)
    yield "float32 states (2, 6, 8), lengths [6, 4]", X, np.array([[1] * 6, [1] * 4 + [0] * 2])
