"""Reference answers and catalogued wrong answers for set 07's checks (txlearn/checks/layer.py),
written the way a learner writes them: from their own modules of sets 03-06 (here the
catalogues' reference answers of those sets)."""

import math

import torch
from torch import nn

from tests.catalogue.ffn import ffn_class
from tests.catalogue.heads import MHA_REF, mask_ref
from tests.catalogue.norms import ln_class, residual_ref
from tests.catalogue.positional import pe_ref

MultiHeadAttention, FeedForward, LayerNorm = MHA_REF, ffn_class(), ln_class()


# ------------------------------------------------------------------ transformer_layer

def layer_class(*, order="right", eps_passed=True, mask_passed=True, cache_passed=True,
                bias_passed=True, kv_passed=True, swap_norms=False, ln=LayerNorm, one_norm=False):
    class TransformerLayer(nn.Module):
        def __init__(self, d_model, n_heads, d_ff, n_kv_heads=None, norm_first=False, eps=1e-5,
                     bias=True):
            super().__init__()
            self.norm_first = norm_first
            b = bias if bias_passed else True
            self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads if kv_passed else None,
                                           bias=b)
            self.norm1 = ln(d_model, eps) if eps_passed else ln(d_model)
            self.ffn = FeedForward(d_model, d_ff, bias=b)
            self.norm2 = ln(d_model, eps) if eps_passed else ln(d_model)

        def forward(self, x, mask=None, use_cache=False):
            def attention(h):
                return self.attn(h, mask=mask if mask_passed else None,
                                 use_cache=use_cache if cache_passed else False)
            n1, n2 = (self.norm2, self.norm1) if swap_norms else (self.norm1, self.norm2)
            if one_norm:
                n2 = n1
            if order == "ffn reads x":
                first = residual_ref(x, attention, n1, self.norm_first)
                return (first + self.ffn(n2(x))) if self.norm_first else n2(first + self.ffn(x))
            if order == "inverted":
                h = residual_ref(x, attention, n1, not self.norm_first)
                return residual_ref(h, self.ffn, n2, not self.norm_first)
            if self.norm_first:
                if order == "pre normalises":
                    h = n1(x + attention(n1(x)))
                    return n2(h + self.ffn(n2(h)))
                h = attention(n1(x)) if order == "no attn residual" else x + attention(n1(x))
                return self.ffn(n2(h)) if order == "no ffn residual" else h + self.ffn(n2(h))
            if order == "norm inside":
                h = x + n1(attention(x))
                return h + n2(self.ffn(h))
            h = n1(attention(x)) if order == "no attn residual" else n1(x + attention(x))
            return n2(self.ffn(h)) if order == "no ffn residual" else n2(h + self.ffn(h))

    return TransformerLayer


TL_REF = layer_class()


def _residual_calls_twice(x, sublayer, norm, norm_first=False):  # set 06's check cannot see it
    if norm_first:
        return x + sublayer(norm(x))
    assert sublayer(x).shape == x.shape                # a shape check that runs the sub-layer
    return norm(x + sublayer(x))


class TLResidualTwice(TL_REF):
    """Post-LN through a residual that calls its sub-layer twice: a cached step appends twice."""

    def forward(self, x, mask=None, use_cache=False):
        def attention(h):
            return self.attn(h, mask=mask, use_cache=use_cache)
        h = _residual_calls_twice(x, attention, self.norm1, self.norm_first)
        return _residual_calls_twice(h, self.ffn, self.norm2, self.norm_first)


# ------------------------------------------------------------------ token_embedding

def embedding_class(*, scale="sqrt", positions="right", extra=False):
    class TokenEmbedding(nn.Module):
        def __init__(self, n_vocab, d_model):
            super().__init__()
            self.d_model = d_model
            self.W_E = nn.Parameter(torch.randn(n_vocab, d_model))
            if extra:
                self.P = nn.Parameter(pe_ref(64, d_model))

        def forward(self, ids, start=0):
            T = ids.shape[-1]
            first = {"ignored": 0, "from one": start + 1}.get(positions, start)
            pe = pe_ref(first + T, self.d_model)[first:]
            rows = self.W_E[ids]
            if scale == "after":
                return (rows + pe) * math.sqrt(self.d_model)
            if scale == "detached":
                return self.W_E.detach()[ids] * math.sqrt(self.d_model) + pe
            factor = {"sqrt": math.sqrt(self.d_model), "none": 1.0,
                      "divided": 1 / math.sqrt(self.d_model), "d_model": self.d_model}[scale]
            return rows * factor + pe

    return TokenEmbedding


EMB_REF = embedding_class()


# ------------------------------------------------------------------ language_model

def lm_class(*, head="tied", final_norm=True, norm_first=True, masked=True, output="logits",
             start="right", mask_kind="right", emb=None):
    class LanguageModel(nn.Module):
        def __init__(self, n_vocab, d_model, n_heads, d_ff, n_layers, n_kv_heads=None):
            super().__init__()
            self.embed = (emb or EMB_REF)(n_vocab, d_model)
            self.layers = nn.ModuleList(
                TL_REF(d_model, n_heads, d_ff, n_kv_heads, norm_first=norm_first)
                for _ in range(n_layers))
            self.norm = LayerNorm(d_model)
            if head == "linear":
                self.head = nn.Linear(d_model, n_vocab, bias=False)
                self.head.weight = self.embed.W_E                   # tied, but a second name
            elif head == "untied":
                self.W_U = nn.Parameter(torch.randn(d_model, n_vocab))

        def reset_cache(self):
            for layer in self.layers:
                layer.attn.kv_cache = None

        def forward(self, ids, use_cache=False):
            cache = self.layers[0].attn.kv_cache
            s = cache[0].shape[2] if ((use_cache or start == "always read") and
                                      cache is not None) else 0
            T = ids.shape[-1]
            h = self.embed(ids, 0 if start == "ignored" else s)
            if mask_kind == "square":
                mask = mask_ref(T, T)
            elif mask_kind == "top-left":
                mask = torch.ones(T, s + T, dtype=torch.bool).tril()
            elif mask_kind == "first call only":      # no mask once something is cached
                mask = mask_ref(T, T) if s == 0 else None
            else:
                mask = mask_ref(T, s + T)
            for layer in self.layers:
                h = layer(h, mask=mask if masked else None, use_cache=use_cache)
            h = self.norm(h) if final_norm else h
            if head == "untied":
                logits = h @ self.W_U
            elif head == "linear":
                logits = self.head(h)
            elif head == "detached":
                logits = h @ self.embed.W_E.detach().T
            else:
                logits = h @ self.embed.W_E.T
            return torch.softmax(logits, -1) if output == "probabilities" else logits

    return LanguageModel


# ------------------------------------------------------------------ layer_param_count

def count_ref(d_model, n_heads, d_ff):
    attention = 4 * d_model * d_model + 4 * d_model
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
    norms = 2 * (2 * d_model)
    return attention + ffn + norms


def count_weights_only(d_model, n_heads, d_ff):
    return 4 * d_model * d_model + 2 * d_model * d_ff


def count_no_norms(d_model, n_heads, d_ff):
    return count_ref(d_model, n_heads, d_ff) - 4 * d_model


def count_gamma_only(d_model, n_heads, d_ff):
    return count_ref(d_model, n_heads, d_ff) - 2 * d_model


def count_no_biases(d_model, n_heads, d_ff):
    return 4 * d_model * d_model + 2 * d_model * d_ff + 4 * d_model


def count_no_W_O(d_model, n_heads, d_ff):
    return 3 * d_model * d_model + 3 * d_model + 2 * d_model * d_ff + d_ff + d_model + 4 * d_model


def count_one_ffn_matrix(d_model, n_heads, d_ff):
    return count_ref(d_model, n_heads, d_ff) - d_model * d_ff


def count_per_head(d_model, n_heads, d_ff):
    return n_heads * (4 * d_model * d_model + 4 * d_model) + 2 * d_model * d_ff + d_ff + 5 * d_model


def count_float(d_model, n_heads, d_ff):
    return float(count_ref(d_model, n_heads, d_ff))


REFERENCE = {
    "transformer_layer": (TL_REF,),
    "token_embedding": (EMB_REF,),
    "language_model": (lm_class(),),
    "layer_param_count": (count_ref,),
}

WRONG = {
    "transformer_layer": [
        ("a residual that calls its sub-layer twice (post-LN)", (TLResidualTwice,),
         "a sub-layer ran twice"),
        ("orders inverted", (layer_class(order="inverted"),), "uses the other order"),
        ("no attention residual", (layer_class(order="no attn residual"),),
         "attention sub-layer is missing its residual"),
        ("no FFN residual", (layer_class(order="no ffn residual"),),
         "FFN sub-layer is missing its residual"),
        ("post-LN normalises the sub-layer only", (layer_class(order="norm inside"),),
         "normalised only the sub-layer's output"),
        ("pre-LN normalises the sums", (layer_class(order="pre normalises"),), "normalised the sums"),
        ("norms swapped", (layer_class(swap_norms=True),), "yours are swapped"),
        ("one LayerNorm for both sub-layers (learner 23)", (layer_class(one_norm=True),),
         "norm1 for both sub-layers"),
        ("the FFN reads x, not h (learner 23)", (layer_class(order="ffn reads x"),),
         "instead of h"),
        ("eps not passed to the norms", (layer_class(eps_passed=False),), "default eps"),
        ("mask not passed", (layer_class(mask_passed=False),), "without the mask"),
        ("use_cache not passed", (layer_class(cache_passed=False),), "did not see the first step"),
        ("bias not passed", (layer_class(bias_passed=False),), "pass bias on"),
        ("n_kv_heads not passed", (layer_class(kv_passed=False),), "pass n_kv_heads on"),
    ],
    "token_embedding": [
        ("no sqrt(d_model)", (embedding_class(scale="none"),), "did not scale"),
        ("positions scaled too", (embedding_class(scale="after"),), "scaled the sum"),
        ("divided by sqrt(d_model)", (embedding_class(scale="divided"),), "divided by sqrt"),
        ("scaled by d_model", (embedding_class(scale="d_model"),), "multiplied by d_model"),
        ("start ignored", (embedding_class(positions="ignored"),), "whatever start is"),
        ("positions from 1", (embedding_class(positions="from one"),), "one too far"),
        ("a learned copy of the table", (embedding_class(extra=True),), "computed, not learned"),
        ("W_E detached", (embedding_class(scale="detached"),), "no gradient reached w_e"),
    ],
    "language_model": [
        ("no mask on cached steps", (lm_class(mask_kind="first call only"),),
         "your cached step attended without a mask"),
        ("untied W_U", (lm_class(head="untied"),), "remove the separate head"),
        ("nn.Linear head sharing the weight", (lm_class(head="linear"),), "remove the separate head"),
        ("head uses W_E.detach()", (lm_class(head="detached"),), "misses the part"),
        ("no final norm", (lm_class(final_norm=False),), "skip the final layernorm"),
        ("post-LN layers", (lm_class(norm_first=False),), "your layers are post-ln"),
        ("no causal mask", (lm_class(masked=False),), "without the causal mask"),
        ("probabilities", (lm_class(output="probabilities"),), "returned probabilities"),
        ("positions restart in a cached step", (lm_class(start="ignored"),), "positions 0, 1"),
        ("square mask in a cached step", (lm_class(mask_kind="square"),), "not causal_mask(t, t)"),
        ("start read from the cache without use_cache (learner 23)",
         (lm_class(start="always read"),), "a sequence of its own"),
        ("top-left mask in a cached step", (lm_class(mask_kind="top-left"),), "aligned top-left"),
    ],
    "layer_param_count": [
        ("weights only", (count_weights_only,), "left out the biases"),
        ("no norms", (count_no_norms,), "left out the two layernorms"),
        ("gamma only", (count_gamma_only,), "only one vector per layernorm"),
        ("no biases", (count_no_biases,), "count the biases"),
        ("no W_O", (count_no_W_O,), "left out W_O"),
        ("one FFN matrix", (count_one_ffn_matrix,), "only one of them"),
        ("per head", (count_per_head,), "number of heads does not change"),
        ("matrices of one head (learner 23)",
         (lambda d, h, f: count_ref(d, h, f) - 4 * d * d - 4 * d + 4 * d * (d // h) + 4 * (d // h),),
         "the matrices of one head"),
        ("b_2 of width d_ff (learner 23)", (lambda d, h, f: count_ref(d, h, f) + f - d,),
         "gave b_2 d_ff entries"),
        ("float", (count_float,), "return an int"),
    ],
}

_OK = {"MultiHeadAttention": MultiHeadAttention, "FeedForward": FeedForward,
       "LayerNorm": LayerNorm, "residual": residual_ref, "sinusoidal_encoding": pe_ref,
       "TransformerLayer": TL_REF, "TokenEmbedding": EMB_REF}
_UNBIASED = ln_class(stats="unbiased")
_UNSCALED = embedding_class(scale="none")
DEPENDENT = {
    "transformer_layer": [
        ("its LayerNorm uses the unbiased variance", (layer_class(ln=_UNBIASED),),
         dict(_OK, LayerNorm=_UNBIASED), "fix layer_norm_module first"),
    ],
    "language_model": [
        ("its TokenEmbedding is not scaled", (lm_class(emb=_UNSCALED),),
         dict(_OK, TokenEmbedding=_UNSCALED), "fix token_embedding first"),
    ],
}
